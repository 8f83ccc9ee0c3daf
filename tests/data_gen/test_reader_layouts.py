"""Every layout a dataset is distributed in reads to the same records as the flat one (issue 31 item 1).

DOTA label lines are real (CAPTAIN-WHU/DOTA_devkit@a3f8a59 example/labelTxt/P1888.txt and P0706.txt); the archive
folder names are those of the official v1.0 / v1.5 / v2.0 downloads (docs/datasets.md). The SpaceNet roads are the
first features of a real SpaceNet-3 label (CosmiQ/apls@982f062 apls/data/gt_json_prop_pkl/ground_truth_randomized/
AOI_2_Vegas_img0.geojson) on a GeoTIFF georeferenced like the real 1300 x 1300 tile.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import rasterio
import yaml
from affine import Affine
from PIL import Image

from geopilot.cli import main as cli_main
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
    with pytest.raises(
        DatasetRootError, match=r"found train/labelTxt-v2.0/DOTA-v2.0_train/: set options.version: '2.0'"
    ):
        read_dota(root, version="1.5")


def write_official(root: Path, version: str) -> Path:
    """A split as the official archives unpack: v1.0's images parts merged into images/images/, its oriented labels
    (with header lines) in labelTxt-v1.0/labelTxt/ and its horizontal ones (no header) in Train_Task2_gt/; v2.0's
    labels (no header lines: v2.0 keeps imagesource/gsd in train_meta/meta/) in labelTxt-v2.0/DOTA-v2.0_train/ and
    its _hbb twin, its new images in images/part4/; v1.5's in labelTxt-v1.5/DOTA-v1.5_train[_hbb]/."""
    for stem, (width, height) in DOTA_IMAGES.items():
        folder = "images/part4" if version == "2.0" and stem == "P0706" else "images/images"
        path = root / "train" / folder / f"{stem}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (width, height)).save(path)
    labels = {"P1888": P1888, "P0706": P0706}
    if version == "1.0":
        folders = {"labelTxt-v1.0/labelTxt": True, "labelTxt-v1.0/Train_Task2_gt/trainset_reclabelTxt": False}
    elif version == "1.5":  # both with header lines
        folders = {"labelTxt-v1.5/DOTA-v1.5_train": True, "labelTxt-v1.5/DOTA-v1.5_train_hbb": True}
    else:
        folders = {"labelTxt-v2.0/DOTA-v2.0_train": False, "labelTxt-v2.0/DOTA-v2.0_train_hbb": False}
        meta = root / "train/labelTxt-v2.0/train_meta/meta"
        meta.mkdir(parents=True)
        for stem, text in labels.items():
            (meta / f"{stem}.txt").write_text("".join(text.splitlines(keepends=True)[:2]))
    for folder, with_header in folders.items():
        (root / "train" / folder).mkdir(parents=True)
        for stem, text in labels.items():
            lines = text.splitlines(keepends=True)
            (root / "train" / folder / f"{stem}.txt").write_text("".join(lines if with_header else lines[2:]))
    return root


def check_dota(tmp_path: Path, root: Path, capsys, **options) -> tuple[int, str, str]:
    """`geopilot generate check` on one DOTA source: (exit code, stdout, stderr)."""
    config = tmp_path / "check.yaml"
    source = {"reader": "dota", "root": str(root), **({"options": options} if options else {})}
    config.write_text(yaml.safe_dump({"sources": [source], "abilities": ["object_detection"]}))
    code = cli_main(["generate", "check", "--config", str(config), "--json"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("version", "folder"),
    [
        ("1.0", "labelTxt-v1.0/labelTxt"),
        ("1.5", "labelTxt-v1.5/DOTA-v1.5_train"),
        ("2.0", "labelTxt-v2.0/DOTA-v2.0_train"),
    ],
)
def test_data_check_reads_every_object_of_an_official_root_without_options(tmp_path, capsys, version, folder):
    code, out, _ = check_dota(tmp_path, write_official(tmp_path / f"DOTA-v{version}", version), capsys)
    (source,) = json.loads(out)["sources"]
    assert code == 0 and source["ok"]
    assert source["detected"] == f"DOTA v{version} (from the folder labelTxt-v{version}/)"
    assert source["layout"] == f"{folder}/*.txt (oriented boxes)"
    assert (source["records"], source["objects"], source["skipped"]) == (2, 7, {})  # every object line of both files
    config = tmp_path / "check.yaml"
    assert cli_main(["generate", "check", "--config", str(config)]) == 0
    assert f"detected: DOTA v{version} (from the folder labelTxt-v{version}/)" in capsys.readouterr().out


def test_a_split_mixing_versions_is_refused_with_its_folders_and_read_with_the_option(tmp_path, capsys):
    root = write_official(tmp_path / "DOTA", "1.0")
    write_dota(root, "labelTxt-v2.0/DOTA-v2.0_train")
    code, _, err = check_dota(tmp_path, root, capsys)
    assert code == 2 and "\n" not in err.strip()
    assert "mixes label folders of 2 versions: train/labelTxt-v1.0/labelTxt/ (v1.0), " in err
    assert "train/labelTxt-v2.0/DOTA-v2.0_train/ (v2.0); set options.version to '1.0' or '2.0'" in err
    code, out, _ = check_dota(tmp_path, root, capsys, version="2.0")
    (source,) = json.loads(out)["sources"]
    assert code == 0 and source["layout"].startswith("labelTxt-v2.0/DOTA-v2.0_train/")
    assert source["detected"] == "DOTA v2.0 (set by options.version)" and source["objects"] == 7


def test_a_root_whose_splits_are_of_different_versions_is_refused(tmp_path):
    root = write_official(tmp_path / "DOTA", "1.0")
    (root / "val/labelTxt-v2.0/DOTA-v2.0_val").mkdir(parents=True)
    (root / "val/labelTxt-v2.0/DOTA-v2.0_val/P0001.txt").write_text("1 1 9 1 9 9 1 9 helipad 0\n")
    with pytest.raises(
        DatasetRootError, match=r"train/labelTxt-v1.0/labelTxt/ \(v1.0\), .*val/labelTxt-v2.0/DOTA-v2.0_val/"
    ):
        read_dota(root)
    records, report = read_dota(root, version="1.0")
    assert report.detected == "DOTA v1.0 (set by options.version)" and len(records) == 2


def test_a_version_folder_holding_a_later_versions_classes_is_refused(tmp_path):
    root = write_official(tmp_path / "DOTA", "1.0")
    with (root / "train/labelTxt-v1.0/labelTxt/P1888.txt").open("a") as labels:
        labels.write("100 100 140 100 140 140 100 140 helipad 0\n")
    with pytest.raises(DatasetRootError, match=r"labelTxt-v1.0/labelTxt is a v1.0 folder but its labels name v2.0 "):
        read_dota(root)
    records, _ = read_dota(root, version="1.0")
    assert "helipad" in [o.label for r in records for o in r.objects]


@pytest.mark.parametrize(
    ("extra", "detected"),
    [
        ("", "DOTA v1.0 (its labels name v1.0 classes only, read alike by every version)"),
        ("1 1 9 1 9 9 1 9 container-crane 0\n", "DOTA v1.5 (from its classes: container-crane in P1888.txt)"),
        ("1 1 9 1 9 9 1 9 airport 0\n", "DOTA v2.0 (from its classes: airport in P1888.txt)"),
    ],
)
def test_a_flat_root_is_read_as_the_first_version_naming_its_classes(tmp_path, extra, detected):
    root = write_dota(tmp_path, "labelTxt")
    with (root / "train/labelTxt/P1888.txt").open("a") as labels:
        labels.write(extra)
    records, report = read_dota(root)
    assert report.detected == detected and report.skipped == {}
    assert sum(len(r.objects) for r in records) == 7 + bool(extra)


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
