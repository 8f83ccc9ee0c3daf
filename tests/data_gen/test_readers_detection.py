"""Detection readers (DOTA, DIOR/DIOR-R, FAIR1M, iSAID, SARDet-100K) on small fixtures in each real format.

Labels are canonical class names (geopilot/vocabulary.yaml); a class name in no vocabulary is kept verbatim.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from geopilot.cli import main as cli_main
from geopilot.data_gen.readers import READERS, DatasetRootError
from geopilot.data_gen.readers.common import polygon_area
from geopilot.data_gen.readers.dior import read_dior
from geopilot.data_gen.readers.dota import read_dota
from geopilot.data_gen.readers.fair1m import read_fair1m
from geopilot.data_gen.readers.isaid import read_isaid
from geopilot.data_gen.readers.sardet import read_sardet
from geopilot.errors import GeoPilotInputError


def image(path: Path, width: int, height: int, mode: str = "RGB") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, (width, height)).save(path)
    return path


def write(path: Path, text: str, newline: str = "\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.replace("\n", newline).encode("utf-8"))
    return path


def test_registry_names_every_reader():
    assert set(READERS) == {
        "dota",
        "dior",
        "fair1m",
        "risbench",
        "isaid",
        "openearthmap",
        "spacenet",
        "cityscale",
        "rice",
        "geochat_instruct",
        "sarlang",
        "sardet",
        "levir_cd",
        "levir_cc",
    }


# --- DOTA -------------------------------------------------------------------------------------------------------


def test_dota_header_lines_floats_missing_difficulty_and_crlf(tmp_path):
    image(tmp_path / "train/images/P0706.png", 1111, 1182)
    write(
        tmp_path / "train/labelTxt/P0706.txt",
        "imagesource:GoogleEarth\ngsd:0.255589285596\n"
        "1054 1028 1063 1011 1111 1040 1112 1062 ship 1\n"
        "807 331 800 324 817 309 823 316 ship 0\n"
        "388.0 190.0 400.5 190.0 400.5 210.0 388.0 210.0 small-vehicle\n\n",
        newline="\r\n",
    )
    image(tmp_path / "train/images/P2805__1024__0___0.png", 1024, 1024)  # devkit patch: no header lines
    write(tmp_path / "train/labelTxt/P2805__1024__0___0.txt", "10 10 50 10 50 30 10 30 plane 0\n")
    records, report = read_dota(tmp_path, split="train")
    assert report.skipped == {} and report.records == 2
    by_id = {r.record_id: r for r in records}
    ships = by_id["P0706"].objects
    assert [o.label for o in ships] == ["ship", "ship", "small vehicle"]
    assert by_id["P2805__1024__0___0"].objects[0].label == "airplane"  # DOTA "plane", canonical
    assert [o.difficult for o in ships] == [True, False, False]
    # 1112 > width 1111: clipped into [0, 1]
    assert ships[0].box == pytest.approx((1054 / 1111, 1011 / 1182, 1.0, 1062 / 1182))
    assert len(ships[0].polygon) == 4 and all(0 <= v <= 1 for p in ships[0].polygon for v in p)
    assert ships[2].box == pytest.approx((388 / 1111, 190 / 1182, 400.5 / 1111, 210 / 1182))
    assert by_id["P2805__1024__0___0"].objects[0].box == pytest.approx((10 / 1024, 10 / 1024, 50 / 1024, 30 / 1024))
    assert by_id["P0706"].width == 1111 and by_id["P0706"].height == 1182


def test_dota_bad_lines_are_counted_per_cause(tmp_path):
    image(tmp_path / "train/images/P0001.png", 100, 100)
    write(
        tmp_path / "train/labelTxt/P0001.txt",
        "gsd:null\n"
        "10 10 20 10 ship 0\n"  # 2 points: bad polygon
        "10 10 20 10 20 20 10 20 spaceship 0\n"  # in no vocabulary: kept verbatim
        "10 10 20 10 20 20 10 20 container-crane 0\n"  # a v1.5 class, known to the vocabulary
        "10 10 20 20 30 30 40 40 plane 0\n"  # collinear: zero area
        "a b c d e f g h plane 0\n"  # malformed
        "10 10 20 10 20 20 10 20 plane 0\n",
    )
    write(tmp_path / "train/labelTxt/P0002.txt", "10 10 20 10 20 20 10 20 plane 0\n")  # no image
    records, report = read_dota(tmp_path, split="train", version="1.0")
    assert [o.label for o in records[0].objects] == ["spaceship", "container crane", "airplane"]
    assert report.skipped == {"bad_polygon": 2, "malformed_line": 1, "missing_image": 1}
    assert any("P0002" in message for message in report.examples["missing_image"])
    records15, report15 = read_dota(tmp_path, split="train", version="1.5")
    assert [o.label for o in records15[0].objects] == ["spaceship", "container crane", "airplane"]
    assert "unknown_class" not in report15.skipped


def test_dota_root_errors(tmp_path):
    with pytest.raises(DatasetRootError, match="not a folder"):
        read_dota(tmp_path / "nope")
    (tmp_path / "test/images").mkdir(parents=True)
    with pytest.raises(GeoPilotInputError, match="no labelTxt"):
        read_dota(tmp_path, split="test")


# --- DIOR / DIOR-R ----------------------------------------------------------------------------------------------

OBB_XML = """<annotation><filename>00001.jpg</filename>
 <size><width>800</width><height>800</height><depth>3</depth></size>
 <object><type>robndbox</type><name>golffield</name><difficult>0</difficult>
  <robndbox><x_left_top>133</x_left_top><y_left_top>237</y_left_top>
   <x_right_top>684</x_right_top><y_right_top>237</y_right_top>
   <x_right_bottom>684</x_right_bottom><y_right_bottom>672</y_right_bottom>
   <x_left_bottom>133</x_left_bottom><y_left_bottom>672</y_left_bottom></robndbox>
  <angle>0</angle></object>
 <object><type>robndbox</type><name>Expressway-Service-area</name><difficult>1</difficult>
  <robndbox><x_left_top>10</x_left_top><y_left_top>10</y_left_top>
   <x_right_top>90</x_right_top><y_right_top>20</y_right_top>
   <x_right_bottom>80</x_right_bottom><y_right_bottom>100</y_right_bottom>
   <x_left_bottom>0</x_left_bottom><y_left_bottom>90</y_left_bottom></robndbox>
  <angle>7</angle></object></annotation>"""

HBB_XML = """<annotation><filename>{id}.jpg</filename><size><width>800</width><height>800</height></size>
 <object><name>{name}</name><difficult>0</difficult>
  <bndbox><xmin>100</xmin><ymin>200</ymin><xmax>300</xmax><ymax>400</ymax></bndbox></object></annotation>"""

BILLION_LAUGHS = """<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;">]>
<annotation><object><name>&lol2;</name></object></annotation>"""


def dior_root(tmp_path: Path) -> Path:
    root = tmp_path / "DIOR"
    write(root / "ImageSets/Main/train.txt", "00001\n00002\n00003\n00004\n00005\n", newline="\r\n")
    write(root / "ImageSets/Main/test.txt", "11726\n")
    for image_id in ("00001", "00002", "00003", "00005"):
        image(root / f"JPEGImages-trainval/{image_id}.jpg", 800, 800)
    image(root / "JPEGImages-test/11726.jpg", 800, 800)
    obb, hbb = root / "Annotations/Oriented Bounding Boxes", root / "Annotations/Horizontal Bounding Boxes"
    write(obb / "00001.xml", OBB_XML)
    write(hbb / "00001.xml", HBB_XML.format(id="00001", name="Expressway-toll-station"))
    write(hbb / "00002.xml", HBB_XML.format(id="00002", name="Spaceport"))  # in no vocabulary: kept verbatim
    write(hbb / "00003.xml", "<annotation><object><name>ship</name>")  # truncated XML
    write(hbb / "00004.xml", HBB_XML.format(id="00004", name="ship"))  # image missing
    write(hbb / "00005.xml", BILLION_LAUGHS)  # DTD/entities: refused
    write(hbb / "11726.xml", HBB_XML.format(id="11726", name="windmill"))
    return root


def test_dior_hbb_spaces_in_folders_ids_as_strings_and_bad_files(tmp_path):
    records, report = read_dior(dior_root(tmp_path), split="train", variant="hbb")
    by_id = {r.record_id: r for r in records}
    assert set(by_id) == {"00001", "00002"}  # zero-padded ids kept as strings
    (obj,) = by_id["00001"].objects
    assert obj.label == "expressway toll station" and obj.box == pytest.approx((0.125, 0.25, 0.375, 0.5))
    assert [o.label for o in by_id["00002"].objects] == ["Spaceport"]
    assert report.skipped == {"malformed_file": 2, "missing_image": 1}
    test_records, _ = read_dior(tmp_path / "DIOR", split="test")
    assert test_records[0].image.endswith("JPEGImages-test/11726.jpg")


def test_dior_r_oriented_boxes(tmp_path):
    root = dior_root(tmp_path)
    records, report = read_dior(root, split="train", variant="obb")
    (record,) = records
    golf, service = record.objects
    assert golf.label == "golf field" and golf.box == pytest.approx((133 / 800, 237 / 800, 684 / 800, 672 / 800))
    assert service.label == "expressway service area" and service.difficult
    assert service.polygon[1] == pytest.approx((90 / 800, 20 / 800))
    assert report.skipped["missing_label"] == 4  # no OBB xml for 00002..00005


def test_dior_legacy_flat_annotation_folder(tmp_path):
    root = tmp_path / "DIOR"
    write(root / "ImageSets/Main/val.txt", "00009\n")
    image(root / "JPEGImages-trainval/00009.jpg", 800, 800)
    write(root / "Annotations/00009.xml", HBB_XML.format(id="00009", name="Vehicle"))
    records, report = read_dior(root, split="val")
    assert records[0].objects[0].label == "vehicle" and report.skipped == {}


# --- FAIR1M -----------------------------------------------------------------------------------------------------

FAIR1M_OBJECT = """<object><coordinate>pixel</coordinate><type>rectangle</type><description>None</description>
 <possibleresult><name>{name}</name><probability>1</probability></possibleresult>
 <points>{points}</points></object>"""


def fair1m_xml(*objects: str) -> str:
    return (
        "<annotation><source><filename>0.tif</filename><origin>GF2/GF3</origin></source>"
        "<size><width>1000</width><height>1000</height><depth>3</depth></size>"
        f"<objects>{''.join(objects)}</objects></annotation>"
    )


def points(*xy: str) -> str:
    return "".join(f"<point>{p}</point>" for p in xy)


def test_fair1m_closed_rings_parts_and_bad_objects(tmp_path):
    ring = points("539.00, 461.00", "553.00, 460.00", "554.00, 468.00", "540.00, 469.00", "539.00, 461.00")
    no_space = points("10.0,10.0", "30.0,10.0", "30.0,20.0", "10.0,20.0", "10.0,10.0")
    write(
        tmp_path / "train/part1/labelXml/0.xml",
        fair1m_xml(
            FAIR1M_OBJECT.format(name="Small Car", points=ring),
            FAIR1M_OBJECT.format(name="Boeing737", points=no_space),
            FAIR1M_OBJECT.format(name="other-ship", points=points("1, 1", "5, 5", "1, 1")),  # 2 distinct points
            FAIR1M_OBJECT.format(name="UFO", points=ring),  # in no vocabulary: kept verbatim
        ),
    )
    image(tmp_path / "train/part1/images/0.tif", 1000, 1000)
    write(tmp_path / "train/part2/labelXml/7.xml", fair1m_xml(FAIR1M_OBJECT.format(name="Tennis Court", points=ring)))
    image(tmp_path / "train/part2/images/7.tif", 1000, 1000)
    write(tmp_path / "train/part2/labelXml/8.xml", "<annotation><objects>")
    records, report = read_fair1m(tmp_path, split="train")
    by_id = {r.record_id: r for r in records}
    assert set(by_id) == {"part1/0", "part2/7"}
    car, plane, ufo = by_id["part1/0"].objects
    assert car.label == "car" and len(car.polygon) == 4  # the repeated closing point is dropped
    assert car.box == pytest.approx((0.539, 0.460, 0.554, 0.469))
    assert plane.label == "boeing 737" and plane.box == pytest.approx((0.01, 0.01, 0.03, 0.02))
    assert ufo.label == "UFO" and by_id["part2/7"].objects[0].label == "tennis court"
    assert report.skipped == {"bad_polygon": 1, "malformed_file": 1}


def test_fair1m_out_of_order_corners_are_kept_and_empty_or_pointless_objects_counted(tmp_path, capsys):
    z_order = points(
        "100.0,100.0", "140.0,100.0", "100.0,120.0", "140.0,120.0", "100.0,100.0"
    )  # TL TR BL BR: a bow tie
    ring = points("539.000000,461.000000", "553.000000,460.000000", "554.000000,468.000000", "540.000000,469.000000")
    same = points(*["20.000000,20.000000"] * 5)
    line = points("10,10", "20,10", "30,10", "40,10", "10,10")
    write(
        tmp_path / "FAIR1M/train/part2/labelXmls/3.xml",  # the archive name labelXmls.zip, unpacked as it is named
        fair1m_xml(
            FAIR1M_OBJECT.format(name="Dump Truck", points=z_order),
            FAIR1M_OBJECT.format(name="Small Car", points=ring),  # 4 points, no closing one: read as a ring
            FAIR1M_OBJECT.format(name="Small Car", points=same),
            FAIR1M_OBJECT.format(name="Van", points=line),
        ),
    )
    image(tmp_path / "FAIR1M/train/part2/images-2/3.tif", 1000, 1000)  # FAIR1M 1.0's part2: images-1/, images-2/
    write(tmp_path / "FAIR1M/train/part2/labelXmls/4.xml", "")
    write(tmp_path / "FAIR1M/train/part2/labelXmls/5.xml", fair1m_xml())
    image(tmp_path / "FAIR1M/train/part2/images-1/5.tif", 1000, 1000)
    (record,), report = read_fair1m(tmp_path / "FAIR1M")
    truck, car = record.objects
    assert truck.label == "dump truck" and truck.box == pytest.approx((0.1, 0.1, 0.14, 0.12))
    assert polygon_area(list(truck.polygon)) == pytest.approx(0.04 * 0.02)  # the whole rectangle, not a bow tie
    assert car.box == pytest.approx((0.539, 0.460, 0.554, 0.469))
    assert report.repaired == {"reordered_corners": 1} and report.skipped == {"bad_polygon": 2, "empty_file": 2}
    assert "points (20,20) (20,20)" in report.examples["bad_polygon"][0]
    assert report.examples["empty_file"] == ["4.xml: 0 bytes", "5.xml: no <object>"]
    config = write(
        tmp_path / "check.yaml",
        f"sources: [{{reader: fair1m, root: {tmp_path / 'FAIR1M'}, max_skip_fraction: 0.9}}]\n",
    )
    assert cli_main(["generate", "check", "--config", str(config)]) == 0
    text = capsys.readouterr().out
    assert "skipped (57.1%, limit 90%): bad_polygon 2, empty_file 2" in text
    assert "       empty_file 2: e.g. 4.xml: 0 bytes" in text
    assert "repaired and kept: reordered_corners 1 (e.g. 3.xml object 0: corners (100,100) (140,100)" in text


def test_fair1m_repairs_reach_the_generation_report(tmp_path):
    from geopilot.data_gen.generate import generate_dataset
    from geopilot.data_gen.generate_config import GenerateConfig

    z_order = points("100.0,100.0", "140.0,100.0", "100.0,120.0", "140.0,120.0", "100.0,100.0")
    ring = points("539.0,461.0", "553.0,460.0", "554.0,468.0", "540.0,469.0", "539.0,461.0")
    objects = FAIR1M_OBJECT.format(name="Dump Truck", points=z_order) + FAIR1M_OBJECT.format(name="Bus", points=ring)
    write(tmp_path / "FAIR1M/train/part1/labelXml/0.xml", fair1m_xml(objects))
    image(tmp_path / "FAIR1M/train/part1/images/0.tif", 1000, 1000)
    config = GenerateConfig(
        sources=[{"reader": "fair1m", "root": str(tmp_path / "FAIR1M")}], abilities=["object_detection"]
    )
    result = generate_dataset(config, tmp_path / "out")
    assert result.report["reader_repairs"] == {"fair1m": {"reordered_corners": 1}}
    assert "Reader `fair1m` repaired and kept: reordered_corners 1" in (tmp_path / "out/report.md").read_text()


# --- iSAID (COCO polygons) --------------------------------------------------------------------------------------


def isaid_json(tmp_path: Path, annotations: list[dict], images: list[dict]) -> Path:
    categories = [
        {"id": 7, "name": "Small_Vehicle"},
        {"id": 3, "name": "plane"},
        {"id": 15, "name": "Harbor"},
        {"id": 16, "name": "Pier_Crane"},
    ]
    data = {"images": images, "annotations": annotations, "categories": categories}
    return write(tmp_path / "val/Annotations/iSAID_val.json", json.dumps(data))


def test_isaid_polygons_masks_mixed_case_names_and_bad_annotations(tmp_path):
    from pycocotools import mask as mask_utils

    image(tmp_path / "val/images/P0002.png", 200, 100)
    square = [20.0, 10.0, 60.0, 10.0, 60.0, 50.0, 20.0, 50.0]
    anns = [
        {"id": 1, "image_id": 5, "category_id": 7, "segmentation": [square], "bbox": [20, 10, 40, 40], "iscrowd": 0},
        {"id": 2, "image_id": 5, "category_id": 3, "segmentation": [[0, 0, 10, 10]], "iscrowd": 0},  # 2 points
        {"id": 3, "image_id": 5, "category_id": 99, "segmentation": [square], "iscrowd": 0},  # unknown category
        {"id": 4, "image_id": 77, "category_id": 3, "segmentation": [square], "iscrowd": 0},  # unknown image
        {"id": 5, "image_id": 6, "category_id": 3, "segmentation": [square], "iscrowd": 0},  # image file missing
        {"id": 6, "image_id": 5, "category_id": 16, "segmentation": [square], "iscrowd": 0},  # name in no vocabulary
    ]
    images = [
        {"id": 5, "file_name": "P0002.png", "width": 200, "height": 100},
        {"id": 6, "file_name": "P0404.png", "width": 200, "height": 100},
    ]
    isaid_json(tmp_path, anns, images)
    records, report = read_isaid(tmp_path, split="val")
    (record,) = records
    vehicle, crane = record.objects
    assert crane.label == "Pier_Crane"  # kept verbatim
    assert vehicle.label == "small vehicle" and vehicle.object_id == "1"
    assert vehicle.box == pytest.approx((0.1, 0.1, 0.3, 0.5))
    assert len(vehicle.polygon) == 4
    rle = {"size": vehicle.mask["size"], "counts": vehicle.mask["counts"].encode()}
    assert vehicle.mask["size"] == [100, 200] and 1400 <= mask_utils.area(rle) <= 1700  # a 40x40 square
    assert report.skipped == {"bad_polygon": 1, "unknown_class": 1, "malformed_line": 1, "missing_image": 1}


def test_isaid_devkit_patch_json_and_malformed_root_file(tmp_path):
    image(tmp_path / "train/images/P0002_0_0_800_800.png", 800, 800)
    write(
        tmp_path / "train/instancesonly_filtered_train.json",
        json.dumps(
            {
                "images": [{"id": 1, "file_name": "P0002_0_0_800_800.png", "width": 800, "height": 800}],
                "annotations": [
                    {
                        "id": 9,
                        "image_id": 1,
                        "category_id": 2,
                        "iscrowd": 0,
                        "segmentation": [[0, 0, 80, 0, 80, 80, 0, 80]],
                        "bbox": [0, 0, 80, 80],
                    }
                ],
                "categories": [{"id": 2, "name": "Ground_Track_Field"}],
            }
        ),
    )
    records, report = read_isaid(tmp_path, split="train")
    assert records[0].objects[0].label == "ground track field" and report.skipped == {}
    write(tmp_path / "val/Annotations/iSAID_val.json", '{"images": [')
    with pytest.raises(DatasetRootError, match="cannot read annotation file"):
        read_isaid(tmp_path, split="val")


# --- SARDet-100K (COCO boxes) -----------------------------------------------------------------------------------


def test_sardet_both_image_prefixes_size_from_json_and_names_not_ids(tmp_path):
    root = tmp_path / "SARDet_100K"
    image(root / "JPEGImages/train/0000001.jpg", 512, 512, mode="L")  # third-party layout
    image(root / "JPEGImages/0000002.png", 300, 200, mode="L")  # official JPEGImages/ prefix
    Image.fromarray(np.full((64, 64), 40000, dtype=np.uint16)).save(root / "JPEGImages/train/0000003.png")
    data = {
        "images": [
            {"id": 1, "file_name": "0000001.jpg", "width": 512, "height": 512},
            {"id": 2, "file_name": "0000002.png", "width": 300, "height": 200},
            {"id": 3, "file_name": "0000003.png", "width": 64, "height": 64},
            {"id": 4, "file_name": "0000004.png", "width": 64, "height": 64},
        ],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 40, "bbox": [10, 20, 30, 40], "iscrowd": 0},
            {"id": 2, "image_id": 2, "category_id": 2, "bbox": [30, 20, 60, 40], "iscrowd": 0, "segmentation": []},
            {"id": 3, "image_id": 2, "category_id": 5, "bbox": [0, 0, 5, 5], "iscrowd": 0},
            {"id": 4, "image_id": 3, "category_id": 2, "bbox": [0, 0, 0, 5], "iscrowd": 0},  # empty box
        ],
        "categories": [{"id": 40, "name": "ship"}, {"id": 2, "name": "aircraft"}, {"id": 5, "name": "tank"}],
    }
    write(root / "Annotations/train.json", json.dumps(data))
    records, report = read_sardet(root, split="train")
    by_id = {r.record_id: r for r in records}
    assert set(by_id) == {"0000001", "0000002", "0000003"}
    assert all(r.modality == "sar" and r.source == "SARDet-100K" for r in records)
    assert by_id["0000001"].objects[0].label == "ship"
    assert by_id["0000001"].objects[0].box == pytest.approx((10 / 512, 20 / 512, 40 / 512, 60 / 512))
    assert by_id["0000002"].objects[0].box == pytest.approx((0.1, 0.1, 0.3, 0.3))
    assert [o.label for o in by_id["0000002"].objects] == ["airplane", "storage tank"]  # SARDet aircraft, tank
    assert report.skipped == {"bad_geometry": 1, "missing_image": 1}
    with pytest.raises(DatasetRootError, match="val.json"):
        read_sardet(root, split="val")
