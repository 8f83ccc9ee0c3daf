"""Georeferenced outputs: RFC 7946 GeoJSON in WGS 84 equal to rasterio's own transform of the same pixels, mask
outlines, the native-CRS GeoPackage, the class COG, and the bad inputs (no CRS, a CRS PROJ cannot reproject,
all-nodata tiles, zero-pixel masks)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from geopilot.image import load_image
from geopilot.records import AnnotationRecord, ObjectAnnotation, RoadGraphAnnotation
from geopilot.sample import Action
from geopilot.tool_output import Detection, RoadGraph, ToolOutput
from geopilot.tools.adapters import DetectorAdapter, DetectorOptions
from geopilot.tools.canonical import encode_mask, segment_class
from geopilot.tools.geo import pixel_features, rfc7946_problems, to_geojson
from geopilot.tools.geo_files import GeoExportError, export
from geopilot.tools.registry import build_registry
from geopilot.tools.task_tools import TASKS_BY_NAME, DetectObjectsParams, TaskTool
from geopilot.wire import format_tool_turn

rasterio = pytest.importorskip("rasterio")
pyogrio = pytest.importorskip("pyogrio")
from helpers.geo_fixtures import BRIGHT, ORIGIN_X, ORIGIN_Y, PIXEL, UTM, BrightSpotDetector, H, W, write_scene  # noqa: E402
from rasterio.transform import from_origin  # noqa: E402
from rasterio.warp import transform as warp_transform  # noqa: E402

TOLERANCE_DEG = 1e-7


@pytest.fixture
def scene(tmp_path):
    return write_scene(tmp_path / "scene.tif")


def detect(image, detector=None, tile=256):
    options = DetectorOptions(tile_size=tile, tile_overlap=64, score_threshold=0.0)
    tool = TaskTool(
        TASKS_BY_NAME["detect_objects"], DetectorAdapter(detector or BrightSpotDetector(), options), "t", 10**9
    )
    return tool.run(image, DetectObjectsParams(categories=["ship"]))


def rasterio_lonlat(cols, rows, crs=UTM):
    """rasterio's own answer: pixel corners (col, row) -> map x, y by the transform -> lon, lat."""
    transform = from_origin(ORIGIN_X, ORIGIN_Y, PIXEL, PIXEL)
    xs, ys = rasterio.transform.xy(transform, rows, cols, offset="ul")
    return list(zip(*warp_transform(crs, "EPSG:4326", xs, ys), strict=True))


def assert_same_points(ring, expected):
    assert len(ring) == len(expected) + 1 and ring[0] == ring[-1]
    for point in expected:
        assert min(max(abs(p[0] - point[0]), abs(p[1] - point[1])) for p in ring) < TOLERANCE_DEG


def test_box_corners_of_a_tiled_detection_equal_rasterios_transform(scene):
    image = load_image(scene)
    output = detect(image)
    (feature,) = output.geojson["features"]
    assert feature["geometry"]["type"] == "Polygon" and feature["properties"]["kind"] == "box"
    x1, y1, x2, y2 = BRIGHT
    expected = rasterio_lonlat([x1, x2, x2, x1], [y1, y1, y2, y2])
    assert_same_points(feature["geometry"]["coordinates"][0], expected)
    assert output.detections[0].box[0] == 0.433  # the model still reads 3 decimals; the map did not use them


def test_mask_outline_with_its_hole_equals_rasterios_transform(scene):
    image = load_image(scene)
    mask = np.zeros((H, W), dtype=bool)
    mask[20:60, 30:90] = True
    mask[35:45, 50:60] = False  # a hole
    output = ToolOutput(detections=[Detection(label="field", box=(0.04, 0.04, 0.13, 0.12), mask=encode_mask(mask))])
    collection = to_geojson(output, image.georef, "segment_instances")
    (feature,) = collection["features"]
    assert feature["geometry"]["type"] == "MultiPolygon" and feature["properties"]["kind"] == "mask"
    ((exterior, hole),) = feature["geometry"]["coordinates"]
    assert_same_points(exterior, rasterio_lonlat([30, 90, 90, 30], [20, 20, 60, 60]))
    assert_same_points(hole, rasterio_lonlat([50, 60, 60, 50], [35, 35, 45, 45]))
    assert rfc7946_problems(collection) == []


def test_a_mask_of_a_decimated_read_lands_on_the_same_ground(scene):
    image = load_image(scene)
    mask = np.zeros((H // 2, W // 2), dtype=bool)
    mask[10:30, 15:45] = True  # full-resolution pixels 30..90 x 20..60
    output = ToolOutput(detections=[Detection(label="field", box=(0.04, 0.04, 0.13, 0.12), mask=encode_mask(mask))])
    ((exterior,),) = to_geojson(output, image.georef, "t")["features"][0]["geometry"]["coordinates"]
    assert_same_points(exterior, rasterio_lonlat([30, 90, 90, 30], [20, 20, 60, 60]))


def test_output_follows_rfc7946(scene):
    image = load_image(scene)
    collection = detect(image).geojson
    assert "crs" not in collection and rfc7946_problems(collection) == []
    lon, lat = collection["features"][0]["geometry"]["coordinates"][0][0]
    assert 14.9 < lon < 15.1 and 37.8 < lat < 38.0  # longitude first
    broken = {
        "type": "FeatureCollection",
        "crs": {"type": "name", "properties": {"name": UTM}},
        "features": [
            {"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [0, 1], [1, 1], [0, 0]]]}},
            {"type": "Feature", "geometry": {"type": "LineString", "coordinates": [[37.9, 15.0], [4e5, 4e6]]}},
        ],
    }
    problems = rfc7946_problems(broken)
    assert any("crs" in p for p in problems) and any("counter-clockwise" in p for p in problems)
    assert any("not [longitude, latitude]" in p for p in problems)


def test_a_geometry_across_the_antimeridian_is_cut(tmp_path):
    # UTM 60N: 180 E lies ~334 km east of the central meridian (177 E) at the equator, i.e. at easting ~834 km
    path = tmp_path / "fiji.tif"
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        width=100,
        height=100,
        count=1,
        dtype="uint8",
        crs="EPSG:32660",
        transform=from_origin(829_000, 20_000, 100, 100),
    ) as dst:
        dst.write(np.zeros((1, 100, 100), np.uint8))
    image = load_image(path)
    output = ToolOutput(detections=[Detection(label="island", box=(0.1, 0.1, 0.9, 0.9))])
    collection = to_geojson(output, image.georef, "t")
    geometry = collection["features"][0]["geometry"]
    assert geometry["type"] == "MultiPolygon" and rfc7946_problems(collection) == []
    lons = [p[0] for polygon in geometry["coordinates"] for p in polygon[0]]
    assert min(lons) < -179 and max(lons) > 179


def test_roads_become_wgs84_linestrings_with_node_ids(scene):
    image = load_image(scene)
    roads = RoadGraph(nodes=[(0.0, 0.5), (0.5, 0.5), (0.5, 0.0)], edges=[(0, 1), (1, 2)])
    collection = to_geojson(ToolOutput(roads=roads), image.georef, "extract_roads")
    first, second = collection["features"]
    assert first["geometry"]["type"] == "LineString" and second["properties"]["from_node"] == 1
    assert second["properties"]["to_node"] == 2 and rfc7946_problems(collection) == []
    assert_same_points(
        [*first["geometry"]["coordinates"], first["geometry"]["coordinates"][0]], rasterio_lonlat([0, 350], [250, 250])
    )


def test_geopackage_opens_with_pyogrio_in_the_native_crs(scene, tmp_path):
    import shapely

    image = load_image(scene)
    output = detect(image)
    written = export(output, image.georef, "detect_objects", tmp_path / "out.gpkg")
    assert written.features == 1
    meta, _, wkb, fields = pyogrio.raw.read(tmp_path / "out.gpkg", layer="detections")
    assert meta["crs"] == UTM and meta["geometry_type"] == "MultiPolygon"
    x1, y1, x2, y2 = BRIGHT
    minx, miny, maxx, maxy = shapely.from_wkb(wkb[0]).bounds
    assert (minx, maxy) == (ORIGIN_X + x1 * PIXEL, ORIGIN_Y - y1 * PIXEL)  # metres, exactly
    assert (maxx, miny) == (ORIGIN_X + x2 * PIXEL, ORIGIN_Y - y2 * PIXEL)
    assert list(meta["fields"]) == ["tool", "kind", "index", "label", "score"] and fields[3][0] == "ship"


def test_class_raster_is_a_cog_with_the_sources_transform_and_class_table(scene, tmp_path):
    image = load_image(scene)
    water = np.zeros((H, W), dtype=bool)
    water[:100] = True
    forest = np.zeros((H, W), dtype=bool)
    forest[300:] = True
    output = ToolOutput(segments=[segment_class("water", water), segment_class("forest", forest)])
    export(output, image.georef, "segment_semantic", tmp_path / "classes.tif")
    with rasterio.open(tmp_path / "classes.tif") as dataset, rasterio.open(scene) as source:
        assert dataset.transform == source.transform and dataset.crs == source.crs
        assert dataset.tags(ns="IMAGE_STRUCTURE")["LAYOUT"] == "COG" and dataset.count == 1
        assert dataset.tags()["CLASS_1"] == "water" and dataset.tags()["CLASS_2"] == "forest"
        ids = dataset.read(1)
    assert (ids[:100] == 1).all() and (ids[300:] == 2).all() and (ids[100:300] == 0).all()
    with pytest.raises(GeoExportError, match="no semantic class masks"):
        export(ToolOutput(), image.georef, "t", tmp_path / "none.tif")


def test_class_polygons_on_request(scene):
    image = load_image(scene)
    water = np.zeros((H, W), dtype=bool)
    water[:100, :350] = True
    output = ToolOutput(segments=[segment_class("water", water)])
    assert to_geojson(output, image.georef, "segment_semantic")["features"] == []
    (feature,) = to_geojson(output, image.georef, "segment_semantic", class_polygons=True)["features"]
    assert feature["properties"]["label"] == "water" and feature["properties"]["class_id"] == 1


def test_a_zero_pixel_mask_gives_no_feature_and_is_counted(scene, tmp_path):
    image = load_image(scene)
    empty = encode_mask(np.zeros((H, W), dtype=bool))
    output = ToolOutput(
        detections=[
            Detection(label="a", box=(0.1, 0.1, 0.2, 0.2), mask=empty),
            Detection(label="b", box=(0.3, 0.3, 0.4, 0.4)),
        ]
    )
    found = pixel_features(output, image.georef, "t")
    assert found.empty_masks == 1 and [f.properties["label"] for f in found.features] == ["b"]
    written = export(output, image.georef, "t", tmp_path / "o.geojson")
    assert written.features == 1 and written.empty_masks == 1


def test_all_nodata_tiles_are_skipped_and_counted(tmp_path):
    image = load_image(write_scene(tmp_path / "half.tif", nodata_rows=300))  # rows 200.. are nodata
    detector = BrightSpotDetector()
    output = detect(image, detector)
    assert "of 12 tiles are all nodata and were skipped" in output.message
    skipped = int(output.message.split()[0])
    assert skipped > 0 and detector.calls == 12 - skipped and len(output.detections) == 1


def test_no_crs_means_pixel_outputs_only_said_once(tmp_path):
    image = load_image(write_scene(tmp_path / "nocrs.tif", crs=None))
    assert image.georef is not None and image.georef.crs is None
    assert [n for n in image.notes if "no CRS" in n] == [image.notes[0]] and len(image.notes) == 1
    output = detect(image)
    assert output.geojson is None and output.detections
    with pytest.raises(GeoExportError, match="no CRS"):
        export(output, image.georef, "t", tmp_path / "o.geojson")


def test_a_crs_that_cannot_be_reprojected_keeps_the_geopackage(tmp_path):
    mars = (
        'GEOGCS["Mars 2000",DATUM["D_Mars_2000",SPHEROID["Mars_2000_IAU_IAG",3396190,169.894447223612]],'
        'PRIMEM["Greenwich",0],UNIT["Decimal_Degree",0.0174532925199433]]'
    )
    path = tmp_path / "mars.tif"
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        width=50,
        height=40,
        count=1,
        dtype="uint8",
        crs=rasterio.crs.CRS.from_wkt(mars),
        transform=from_origin(10, 10, 0.01, 0.01),
    ) as dst:
        dst.write(np.full((1, 40, 50), 7, np.uint8))
    image = load_image(path)
    (note,) = image.notes
    assert "Mars 2000 cannot be reprojected to WGS 84" in note and len(note) < 200
    output = ToolOutput(detections=[Detection(label="crater", box=(0.1, 0.1, 0.5, 0.5))])
    assert to_geojson(output, image.georef, "t") is None
    with pytest.raises(GeoExportError, match="cannot be reprojected"):
        export(output, image.georef, "t", tmp_path / "o.geojson")
    assert export(output, image.georef, "t", tmp_path / "o.gpkg").features == 1


def _record() -> AnnotationRecord:
    return AnnotationRecord(
        source="TEST",
        image="scene.tif",
        width=W,
        height=H,
        objects=[ObjectAnnotation("ship", (0.1, 0.2, 0.3, 0.6))],
        roads=RoadGraphAnnotation(((0.0, 0.5), (1.0, 0.5)), ((0, 1),)),
    )


@pytest.mark.parametrize("max_pixels", [W * H, W * H // 4])  # full read, and a decimated read of the same raster
def test_annotation_outputs_in_wgs84_whatever_the_read(scene, max_pixels):
    image = load_image(scene, max_pixels=max_pixels)
    registry = build_registry(annotations=_record())
    ships = registry.call(Action(tool="detect_objects", params={"categories": ["ship"]}), image).output.geojson
    (feature,) = ships["features"]
    assert feature["properties"] == {"tool": "detect_objects", "kind": "box", "index": 0, "label": "ship"}
    expected = rasterio_lonlat([70, 210, 210, 70], [100, 100, 300, 300])
    assert_same_points(feature["geometry"]["coordinates"][0], expected)
    shown = format_tool_turn([registry.call(Action(tool="detect_all"), image).for_formatter()], "where?")
    assert "FeatureCollection" not in shown and "37.9" not in shown  # map coordinates never reach the LLM


def test_plain_images_get_no_geojson(tmp_path):
    Image.new("RGB", (W, H)).save(tmp_path / "plain.png")
    result = build_registry(annotations=_record()).call(Action(tool="detect_all"), load_image(tmp_path / "plain.png"))
    assert result.output.geojson is None


def test_restored_image_of_a_geotiff_is_a_geotiff_with_the_same_footprint(scene, tmp_path):
    from geopilot.tools.adapters import CloudRemovalAdapter
    from geopilot.tools.spa_gan import SpaGan

    full = load_image(scene)
    decimated = load_image(scene, max_pixels=W * H // 4)
    for image in (full, decimated):
        output = CloudRemovalAdapter(SpaGan.tiny(seed=0), tmp_path).run("remove_clouds", image, None)
        (artifact,) = output.artifacts
        with rasterio.open(artifact.path) as restored:
            assert restored.crs.to_string() == UTM and (restored.width, restored.height) == image.scene_size
            assert restored.bounds == pytest.approx((ORIGIN_X, ORIGIN_Y - H * PIXEL, ORIGIN_X + W * PIXEL, ORIGIN_Y))
