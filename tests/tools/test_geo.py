"""GeoTIFF inputs keep their transform: tool outputs also come as GeoJSON in the raster's map coordinates."""

from __future__ import annotations

import numpy as np
import pytest

from geopilot.image import load_image
from geopilot.records import AnnotationRecord, ObjectAnnotation, RoadGraphAnnotation
from geopilot.sample import Action
from geopilot.tools.registry import build_registry
from geopilot.wire import format_tool_turn

rasterio = pytest.importorskip("rasterio")
from rasterio.transform import from_origin  # noqa: E402

W, H = 200, 100
ORIGIN_X, ORIGIN_Y, PIXEL = 500_000.0, 4_200_000.0, 0.5


@pytest.fixture
def geotiff(tmp_path):
    path = tmp_path / "scene.tif"
    data = np.random.default_rng(0).integers(0, 255, size=(3, H, W), dtype=np.uint8)
    profile = {"driver": "GTiff", "width": W, "height": H, "count": 3, "dtype": "uint8", "crs": "EPSG:32633"}
    with rasterio.open(path, "w", transform=from_origin(ORIGIN_X, ORIGIN_Y, PIXEL, PIXEL), **profile) as dst:
        dst.write(data)
    return path


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
def test_detections_and_roads_in_map_coordinates(geotiff, max_pixels):
    image = load_image(geotiff, max_pixels=max_pixels)
    assert image.georef is not None and image.georef.crs == "EPSG:32633"
    registry = build_registry(annotations=_record())
    ships = registry.call(Action(tool="detect_objects", params={"categories": ["ship"]}), image).output.geojson
    assert ships["crs"]["properties"]["name"] == "EPSG:32633"
    (feature,) = ships["features"]
    assert feature["properties"] == {"tool": "detect_objects", "label": "ship"}
    ring = feature["geometry"]["coordinates"][0]
    x1, y1 = ORIGIN_X + 0.1 * W * PIXEL, ORIGIN_Y - 0.2 * H * PIXEL
    x2, y2 = ORIGIN_X + 0.3 * W * PIXEL, ORIGIN_Y - 0.6 * H * PIXEL
    assert ring == [[x1, y1], [x2, y1], [x2, y2], [x1, y2], [x1, y1]]
    shown = format_tool_turn([registry.call(Action(tool="detect_all"), image).for_formatter()], "where?")
    assert "FeatureCollection" not in shown and str(int(ORIGIN_X)) not in shown  # map coordinates never reach the LLM
    roads = registry.call(Action(tool="extract_roads"), image).output.geojson
    assert roads["features"][0]["geometry"] == {
        "type": "LineString",
        "coordinates": [[ORIGIN_X, ORIGIN_Y - 25.0], [ORIGIN_X + 100.0, ORIGIN_Y - 25.0]],
    }


def test_plain_images_get_no_geojson(tmp_path):
    from PIL import Image

    Image.new("RGB", (W, H)).save(tmp_path / "plain.png")
    result = build_registry(annotations=_record()).call(Action(tool="detect_all"), load_image(tmp_path / "plain.png"))
    assert result.output.geojson is None


def test_restored_image_of_a_geotiff_is_a_geotiff_with_the_same_footprint(geotiff, tmp_path):
    from geopilot.tools.adapters import CloudRemovalAdapter
    from geopilot.tools.spa_gan import SpaGan

    full = load_image(geotiff)
    decimated = load_image(geotiff, max_pixels=W * H // 4)
    for image in (full, decimated):
        output = CloudRemovalAdapter(SpaGan.tiny(seed=0), tmp_path).run("remove_clouds", image, None)
        (artifact,) = output.artifacts
        with rasterio.open(artifact.path) as restored:
            assert restored.crs.to_string() == "EPSG:32633"
            assert (restored.width, restored.height) == image.image.size
            assert restored.bounds == pytest.approx((ORIGIN_X, ORIGIN_Y - H * PIXEL, ORIGIN_X + W * PIXEL, ORIGIN_Y))
