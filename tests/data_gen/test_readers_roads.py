"""Road-graph readers (SpaceNet GeoJSON + Sat2Graph pickles, CityScale pickles) and the restricted unpickler."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import rasterio
from affine import Affine
from PIL import Image
from rasterio.warp import transform as reproject

from geopilot.data_gen.readers import DatasetRootError
from geopilot.data_gen.readers.cityscale import read_cityscale
from geopilot.data_gen.readers.safe_pickle import UnsafePickleError, safe_load
from geopilot.data_gen.readers.spacenet import read_spacenet

LON0, LAT0, RES = -115.3, 36.2, 1e-5


def geotiff(path: Path, width: int, height: int, crs: str | None, transform: Affine | None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    georef = {"crs": crs, "transform": transform} if crs else {}
    with rasterio.open(
        path, "w", driver="GTiff", width=width, height=height, count=3, dtype="uint8", **georef
    ) as dataset:
        dataset.write(np.zeros((3, height, width), dtype=np.uint8))
    return path


def png(path: Path, width: int, height: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (width, height)).save(path)
    return path


def feature(kind: str, coordinates) -> dict:
    return {"type": "Feature", "properties": {"road_type": "5"}, "geometry": {"type": kind, "coordinates": coordinates}}


def lonlat(col: float, row: float) -> list[float]:
    return [LON0 + col * RES, LAT0 - row * RES, 0.0]  # with the z value SpaceNet writes


def sn3(root: Path, n: int, features: list, *, crs_member: bool = True) -> None:
    collection = {"type": "FeatureCollection", "features": features}
    if crs_member:
        collection["crs"] = {"type": "name", "properties": {"name": "urn:ogc:def:crs:OGC:1.3:CRS84"}}
    path = root / f"AOI_2_Vegas/geojson_roads/SN3_roads_train_AOI_2_Vegas_geojson_roads_img{n}.geojson"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(collection))


def test_spacenet_geojson_lonlat_z_values_crossings_multilines_and_bad_features(tmp_path):
    transform = Affine(RES, 0, LON0, 0, -RES, LAT0)
    geotiff(
        tmp_path / "AOI_2_Vegas/PS-RGB/SN3_roads_train_AOI_2_Vegas_PS-RGB_img1.tif", 100, 50, "EPSG:4326", transform
    )
    geotiff(
        tmp_path / "AOI_2_Vegas/PS-RGB/SN3_roads_train_AOI_2_Vegas_PS-RGB_img2.tif", 100, 50, "EPSG:4326", transform
    )
    sn3(
        tmp_path,
        1,
        [
            feature("LineString", [lonlat(0, 25), lonlat(50, 25), lonlat(100, 25)]),
            feature("MultiLineString", [[lonlat(50, 0), lonlat(50, 25)], [lonlat(50, 25), lonlat(40, 50)]]),
            {"type": "Feature", "properties": {}, "geometry": None},
            feature("Point", lonlat(1, 1)),
        ],
    )
    sn3(tmp_path, 2, [], crs_member=False)  # a tile without roads
    sn3(tmp_path, 3, [feature("LineString", [lonlat(0, 0), lonlat(1, 1)])])  # image missing
    (tmp_path / "AOI_2_Vegas/geojson_roads/SN3_roads_train_AOI_2_Vegas_geojson_roads_img4.geojson").write_text("{")
    records, report = read_spacenet(tmp_path, split="train")
    by_id = {r.record_id: r for r in records}
    roads = by_id["SN3_roads_train_AOI_2_Vegas_PS-RGB_img1"].roads
    assert len(roads.nodes) == 5 and len(roads.edges) == 4  # the crossing (50, 25) is one shared node
    crossing = roads.nodes.index(pytest.approx((0.5, 0.5), abs=1e-6))
    assert sum(crossing in edge for edge in roads.edges) == 4
    assert by_id["SN3_roads_train_AOI_2_Vegas_PS-RGB_img2"].roads.nodes == ()
    assert report.skipped == {"bad_geometry": 2, "missing_image": 1, "malformed_file": 1}


def test_spacenet_geojson_reprojects_lonlat_onto_a_utm_image(tmp_path):
    (east,), (north,) = reproject("EPSG:4326", "EPSG:32611", [LON0], [LAT0])
    utm = Affine(0.3, 0, east, 0, -0.3, north)  # 0.3 m pixels, origin at (LON0, LAT0)
    geotiff(tmp_path / "AOI_2_Vegas/PS-RGB/SN3_roads_train_AOI_2_Vegas_PS-RGB_img1.tif", 200, 200, "EPSG:32611", utm)
    (east2,), (north2,) = [east + 0.3 * 100], [north - 0.3 * 50]
    (lon2,), (lat2,) = reproject("EPSG:32611", "EPSG:4326", [east2], [north2])
    sn3(tmp_path, 1, [feature("LineString", [[LON0, LAT0], [lon2, lat2]])])
    (record,), report = read_spacenet(tmp_path)
    assert report.skipped == {}
    assert record.roads.nodes[0] == pytest.approx((0.0, 0.0), abs=1e-6)
    assert record.roads.nodes[1] == pytest.approx((0.5, 0.25), abs=1e-6)


@pytest.mark.filterwarnings("ignore::rasterio.errors.NotGeoreferencedWarning")  # writing the plain TIFF itself
def test_spacenet_ungeoreferenced_image_means_pixel_coordinates(tmp_path):
    geotiff(tmp_path / "AOI_9_X/PS-RGB/SN3_roads_train_AOI_9_X_PS-RGB_img1.tif", 100, 100, None, None)
    path = tmp_path / "AOI_9_X/geojson_roads/SN3_roads_train_AOI_9_X_geojson_roads_img1.geojson"
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps({"type": "FeatureCollection", "features": [feature("LineString", [[10, 20], [30, 40]])]})
    )
    (record,), _ = read_spacenet(tmp_path)
    assert record.roads.nodes == (pytest.approx((0.1, 0.2)), pytest.approx((0.3, 0.4)))


def test_spacenet_sat2graph_layout_flips_y_and_uses_data_split(tmp_path):
    folder = tmp_path / "RGB_1.0_meter"
    png(folder / "AOI_2_Vegas_505__rgb.png", 400, 400)
    png(folder / "AOI_2_Vegas_506__rgb.png", 400, 400)
    # key (a, b): x = b, y = 400 - a
    graph = {(300, 100): [(300, 200)], (300, 200): [(300, 100), (100, 200)], (100, 200): [(300, 200)]}
    (folder / "AOI_2_Vegas_505__gt_graph.p").write_bytes(pickle.dumps(graph, protocol=2))
    (tmp_path / "data_split.json").write_text(
        json.dumps({"train": ["AOI_2_Vegas_505", "AOI_2_Vegas_506"], "validation": [], "test": []})
    )
    records, report = read_spacenet(tmp_path, split="train")
    (record,) = records
    assert record.roads.nodes == ((0.25, 0.25), (0.5, 0.25), (0.5, 0.75))
    assert record.roads.edges == ((0, 1), (1, 2))
    assert report.skipped == {"missing_label": 1}
    assert read_spacenet(tmp_path, split="val")[0] == []  # "val" is data_split.json's "validation"


# --- CityScale --------------------------------------------------------------------------------------------------


class Exploit:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "pwned"))


def test_cityscale_row_col_keys_split_by_index_and_py2_pickles(tmp_path):
    folder = tmp_path / "20cities"
    for index in (0, 8, 9, 18):
        png(folder / f"region_{index}_sat.png", 200, 100)
    graph = {(10, 20): [(10, 60), (50, 20)], (10, 60): [(10, 20)], (50, 20): [(10, 20)]}
    (folder / "region_0_gt_graph.p").write_bytes(pickle.dumps(graph, protocol=0))  # text protocol, as Python 2
    numpy_keys = {(np.int64(10), np.int64(20)): [(np.int64(90), np.float64(180.0))]}
    (folder / "region_8_gt_graph.p").write_bytes(pickle.dumps(numpy_keys, protocol=2))
    (folder / "region_9_gt_graph.p").write_bytes(pickle.dumps([1, 2, 3], protocol=2))
    (folder / "region_18_gt_graph.p").write_bytes(pickle.dumps(graph, protocol=2)[:-5])  # truncated
    train, train_report = read_cityscale(tmp_path, split="train")
    (record,) = train
    assert record.record_id == "region_0" and record.source == "CityScale"
    assert record.roads.nodes == ((0.1, 0.1), (0.3, 0.1), (0.1, 0.5))  # x = col / W, y = row / H
    assert record.roads.edges == ((0, 1), (0, 2))
    assert train_report.skipped == {}
    test, test_report = read_cityscale(tmp_path, split="test")  # i % 10 == 9 or i % 20 == 8
    assert [r.record_id for r in test] == ["region_8"]
    assert test[0].roads.nodes == ((0.1, 0.1), (0.9, 0.9))
    assert test_report.skipped == {"malformed_file": 1}  # region 9 holds a list
    _, val_report = read_cityscale(tmp_path, split="val")
    assert val_report.skipped == {"malformed_file": 1}  # region 18 is truncated


def test_cityscale_reads_the_refined_graph_sam_road_trains_on(tmp_path):
    """SAM-Road trains on `region_{i}_refine_gt_graph.p` and scores tests on `region_{i}_graph_gt.pickle`."""
    for index in (0, 1, 2):
        png(tmp_path / f"region_{index}_sat.png", 100, 100)
    coarse = {(10, 10): [(10, 90)], (10, 90): [(10, 10)]}
    refined = {(10, 10): [(10, 50)], (10, 50): [(10, 10), (10, 90)], (10, 90): [(10, 50)]}
    (tmp_path / "region_0_gt_graph.p").write_bytes(pickle.dumps(coarse, protocol=2))
    (tmp_path / "region_0_refine_gt_graph.p").write_bytes(pickle.dumps(refined, protocol=2))
    (tmp_path / "region_1_gt_graph.p").write_bytes(pickle.dumps(coarse, protocol=2))  # no refined graph
    (tmp_path / "region_2_graph_gt.pickle").write_bytes(pickle.dumps(refined, protocol=2))  # SAM-Road's test name
    records, report = read_cityscale(tmp_path, split="train")
    by_id = {r.record_id: len(r.roads.nodes) for r in records}
    assert by_id == {"region_0": 3, "region_1": 2, "region_2": 3} and report.skipped == {}
    coarse_only, _ = read_cityscale(tmp_path, split="train", graph="gt_graph")
    assert [len(r.roads.nodes) for r in coarse_only] == [2, 2]
    refined_only, report = read_cityscale(tmp_path, split="train", graph="refine_gt_graph")
    assert [r.record_id for r in refined_only] == ["region_0"] and report.skipped == {"missing_label": 2}
    with pytest.raises(DatasetRootError, match="graph one of"):
        read_cityscale(tmp_path, graph="refined")


def test_cityscale_refuses_a_pickle_that_runs_code(tmp_path):
    marker = tmp_path / "marker.txt"
    png(tmp_path / "region_0_sat.png", 64, 64)
    (tmp_path / "region_0_gt_graph.p").write_bytes(pickle.dumps({(1, 1): [Exploit(marker)]}))
    records, report = read_cityscale(tmp_path, split="train")
    assert records == [] and report.skipped == {"unsafe_pickle": 1}
    assert "pathlib" in report.examples["unsafe_pickle"][0] and not marker.exists()
    with pytest.raises(DatasetRootError, match="region_<i>_sat.png"):
        read_cityscale(tmp_path / "20cities_missing")


def test_safe_load_allows_containers_and_numbers_only(tmp_path):
    path = tmp_path / "ok.p"
    path.write_bytes(pickle.dumps({"a": {1, 2}, "b": frozenset([3]), "c": (1.5, [True, None]), "d": np.int32(7)}))
    assert safe_load(path) == {"a": {1, 2}, "b": frozenset([3]), "c": (1.5, [True, None]), "d": 7}
    path.write_bytes(pickle.dumps(np.zeros(3)))  # arrays need numpy's reconstruct: refused
    with pytest.raises(UnsafePickleError, match="only builtin containers and numbers"):
        safe_load(path)
    path.write_bytes(pickle.dumps(Path("x")))
    with pytest.raises(UnsafePickleError):
        safe_load(path)
