"""Every layout a dataset is distributed in reads to the same records as the flat one (issue 31 item 1).

DOTA label lines are real (CAPTAIN-WHU/DOTA_devkit@a3f8a59 example/labelTxt/P1888.txt and P0706.txt); the archive
folder names are those of the official v1.0 / v1.5 / v2.0 downloads (the reader docstrings). The SpaceNet roads are the
first features of a real SpaceNet-3 label (CosmiQ/apls@982f062 apls/data/gt_json_prop_pkl/ground_truth_randomized/
AOI_2_Vegas_img0.geojson) on a GeoTIFF georeferenced like the real 1300 x 1300 tile.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import rasterio
from affine import Affine
from PIL import Image

from geopilot.data_gen.readers import DatasetRootError
from geopilot.data_gen.readers.dota import read_dota
from geopilot.data_gen.readers.spacenet import read_spacenet

P1888 = """imagesource:GoogleEarth
gsd:0.266170468393
674 375 683 375 684 394 675 395 small-vehicle 0
683 351 694 351 695 371 684 371 small-vehicle 0
465 371 455 372 451 324 460 323 large-vehicle 0
451 374 441 375 436 327 445 326 large-vehicle 0
457 442 468 443 470 485 461 486 large-vehicle 0
"""
P0706 = """imagesource:GoogleEarth
gsd:0.255589285596
1054 1028 1063 1011 1111 1040 1112 1062 ship 1
807 331 800 324 817 309 823 316 ship 0
"""
DOTA_IMAGES = {"P1888": (1000, 800), "P0706": (1111, 1182)}


def write_dota(root: Path, label_folder: str, image_folder: str = "images") -> Path:
    for stem, (width, height) in DOTA_IMAGES.items():
        path = root / "train" / image_folder / f"{stem}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (width, height)).save(path)
    labels = root / "train" / label_folder
    labels.mkdir(parents=True, exist_ok=True)
    (labels / "P1888.txt").write_text(P1888)
    (labels / "P0706.txt").write_text(P0706)
    return root


def comparable(records) -> list:
    """Everything a record carries but where its files are."""
    return [(r.source, r.split, r.record_id, r.width, r.height, r.objects) for r in records]


@pytest.mark.parametrize(
    ("version", "label_folder", "image_folder", "layout"),
    [
        ("1.0", "labelTxt-v1.0/labelTxt", "images", "labelTxt-v1.0/labelTxt/*.txt (oriented boxes)"),
        ("1.0", "labelTxt-v1.0/Train_Task2_gt/trainset_reclabelTxt", "images", "(horizontal boxes)"),
        ("1.0", "labelTxt-v1.0/trainset_reclabelTxt", "images/part1/images", "(horizontal boxes)"),
        ("1.5", "labelTxt-v1.5/DOTA-v1.5_train", "images", "labelTxt-v1.5/DOTA-v1.5_train/*.txt (oriented"),
        ("1.5", "labelTxt-v1.5/DOTA-v1.5_train_hbb", "images", "DOTA-v1.5_train_hbb/*.txt (horizontal"),
        ("1.5", "labelTxt-v1.5", "images", "labelTxt-v1.5/*.txt"),  # the archive unzipped in place
        ("2.0", "labelTxt-v2.0/DOTA-v2.0_train", "images/part4", "labelTxt-v2.0/DOTA-v2.0_train/*.txt (oriented"),
        ("2.0", "labelTxt-v2.0/DOTA-v2.0_train_hbb", "images", "DOTA-v2.0_train_hbb/*.txt (horizontal"),
    ],
)
def test_dota_archive_layouts_read_to_the_flat_layouts_records(tmp_path, version, label_folder, image_folder, layout):
    flat_records, flat_report = read_dota(write_dota(tmp_path / "flat", "labelTxt"), version=version)
    records, report = read_dota(write_dota(tmp_path / "archive", label_folder, image_folder), version=version)
    assert report.records == 2 and report.skipped == {} and layout in report.layout
    assert flat_report.layout == "labelTxt/*.txt (oriented boxes)"
    assert comparable(records) == comparable(flat_records)
    assert [len(r.objects) for r in records] == [2, 5]  # header lines are not objects


def test_dota_oriented_labels_win_over_horizontal_ones(tmp_path):
    root = write_dota(tmp_path, "labelTxt-v1.5/DOTA-v1.5_train")
    hbb = root / "train/labelTxt-v1.5/DOTA-v1.5_train_hbb"
    hbb.mkdir(parents=True)
    (hbb / "P1888.txt").write_text("1 1 2 1 2 2 1 2 plane 0\n")
    _, report = read_dota(root, version="1.5")
    assert "oriented" in report.layout


def test_dota_labels_of_another_version_name_the_version_to_set(tmp_path):
    root = write_dota(tmp_path, "labelTxt-v2.0/DOTA-v2.0_train")
    with pytest.raises(DatasetRootError, match=r"found labelTxt-v2.0/DOTA-v2.0_train/: set options.version: '2.0'"):
        read_dota(root, version="1.5")


# --- SpaceNet roads ---------------------------------------------------------------------------------------------

# lon/lat of the real tile's top-left corner and its pixel size in degrees (1300 px over 0.00351 deg of longitude)
LON0, LAT0, DEG = -115.1706166, 36.2394816, 0.00351 / 1300
ROADS = [
    [[-115.16787859711, 36.23856585725, 0.0], [-115.16787983205, 36.23727436558, 0.0]],
    [[-115.16764365753, 36.23861469356, 0.0], [-115.16764740524, 36.2372740718, 0.0]],
    [
        [-115.17052413656, 36.23784697546, 0.0],
        [-115.17052006049, 36.23818847794, 0.0],
        [-115.17034391595, 36.23818696653, 0.0],
        [-115.17036265473, 36.23784236497, 0.0],
    ],
    [[-115.17034391595, 36.23818696653, 0.0], [-115.17036265473, 36.23821719467, 0.0]],
]


def spacenet_tile(image: Path, label: Path, dtype: str = "uint8") -> None:
    image.parent.mkdir(parents=True, exist_ok=True)
    transform = Affine(DEG, 0, LON0, 0, -DEG, LAT0)
    with rasterio.open(
        image, "w", driver="GTiff", width=1300, height=1300, count=3, dtype=dtype, crs="EPSG:4326", transform=transform
    ) as dataset:
        dataset.write(np.zeros((3, 1300, 1300), dtype=dtype))
    collection = {
        "type": "FeatureCollection",
        "crs": {"type": "name", "properties": {"name": "urn:ogc:def:crs:OGC:1.3:CRS84"}},
        "features": [
            {"type": "Feature", "properties": {"road_type": "6"}, "geometry": {"type": "LineString", "coordinates": c}}
            for c in ROADS
        ],
    }
    label.parent.mkdir(parents=True, exist_ok=True)
    label.write_text(json.dumps(collection))


def test_spacenet_2018_release_layout_reads_to_the_sn3_layouts_records(tmp_path):
    sn3 = tmp_path / "sn3/AOI_2_Vegas"
    spacenet_tile(
        sn3 / "PS-RGB/SN3_roads_train_AOI_2_Vegas_PS-RGB_img0.tif",
        sn3 / "geojson_roads/SN3_roads_train_AOI_2_Vegas_geojson_roads_img0.geojson",
    )
    release = tmp_path / "release/AOI_2_Vegas_Roads_Train"
    spacenet_tile(
        release / "RGB-PanSharpen/RGB-PanSharpen_AOI_2_Vegas_img0.tif",  # 16-bit, as released: read through GDAL
        release / "geojson/spacenetroads/spacenetroads_AOI_2_Vegas_img0.geojson",
        dtype="uint16",
    )
    (expected,), sn3_report = read_spacenet(tmp_path / "sn3")
    (record,), report = read_spacenet(tmp_path / "release")
    assert report.skipped == {} and "2018 release" in report.layout and "SpaceNet-3" in sn3_report.layout
    assert record.record_id == "RGB-PanSharpen_AOI_2_Vegas_img0" and (record.width, record.height) == (1300, 1300)
    assert record.roads == expected.roads and len(record.roads.edges) == 6
    x, y = record.roads.nodes[0]  # the first real road's first point, in pixels from the tile's corner
    assert (x * 1300, y * 1300) == pytest.approx(((-115.16787859711 - LON0) / DEG, (LAT0 - 36.23856585725) / DEG))


def test_spacenet_root_of_neither_layout_names_all_three(tmp_path):
    (tmp_path / "AOI_2_Vegas_Roads_Train/RGB-PanSharpen").mkdir(parents=True)
    with pytest.raises(DatasetRootError, match="geojson/spacenetroads"):
        read_spacenet(tmp_path)
