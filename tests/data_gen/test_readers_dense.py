"""Mask and pair readers (RISBench, OpenEarthMap, RICE) on small fixtures in each real format.

RICE's SpA-GAN split facts come from Penn000/SpA-GAN_for_cloud_removal: `data/RICE_DATASET/RICE1/test_list.txt`
(100 names, CRLF, e.g. "70.png", "488.png", "0.png") and `train_list.txt` (the other 400, e.g. "476.png", "62.png").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from affine import Affine
from PIL import Image

from geopilot.data_gen.readers import DatasetRootError
from geopilot.data_gen.readers.openearthmap import read_openearthmap
from geopilot.data_gen.readers.rice import SPAGAN_RICE1_TEST, read_rice, rice_split
from geopilot.data_gen.readers.risbench import read_risbench
from geopilot.data_gen.synthetic.datasets import write_geotiff


def png(path: Path, array: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)
    return path


def tif(path: Path, array: np.ndarray) -> Path:
    write_geotiff(path, array, Affine(1e-5, 0.0, 2.0, 0.0, -1e-5, 48.0))
    return path


# --- RISBench ---------------------------------------------------------------------------------------------------


def test_risbench_phrases_grouped_per_image_val_points_at_train_and_bad_lines(tmp_path):
    rgb = np.zeros((64, 128, 3), dtype=np.uint8)
    mask = np.zeros((64, 128), dtype=np.uint8)
    mask[8:24, 32:96] = 255
    for name in ("train_0_0.png", "train_5.png", "train_6.png", "train_7.png"):
        png(tmp_path / "img_rgb" / name, rgb)
    png(tmp_path / "mask/train_0_0.png", mask)
    png(tmp_path / "mask/train_5.png", np.zeros((64, 128), dtype=np.uint8))  # empty mask
    png(tmp_path / "mask/train_7.png", np.zeros((32, 32), dtype=np.uint8))  # wrong size
    (tmp_path / "output_phrase_val.txt").write_text(
        "train_0_0.png the white storage tank in the upper left\n"
        "train_0_0.png   storage tank  near the road\n"
        "train_0_0.png\n"  # no phrase
        "train_5.png the ship\n"
        "train_6.png the plane\n"  # no mask
        "train_7.png the car\n"
        "train_9.png the bridge\n"  # no image
    )
    records, report = read_risbench(tmp_path, split="val")
    (record,) = records
    assert record.record_id == "train_0_0" and record.split == "val"
    assert [r.expression for r in record.referring] == [
        "the white storage tank in the upper left",
        "storage tank near the road",
    ]
    assert all(r.object_indices == (0,) for r in record.referring)
    (obj,) = record.objects
    assert obj.box == pytest.approx((32 / 128, 8 / 64, 96 / 128, 24 / 64))
    assert obj.mask["size"] == [64, 128] and isinstance(obj.mask["counts"], str)
    assert report.skipped == {
        "malformed_line": 1,
        "bad_geometry": 1,
        "missing_label": 1,
        "size_mismatch": 1,
        "missing_image": 1,
    }
    with pytest.raises(DatasetRootError, match="output_phrase_test.txt"):
        read_risbench(tmp_path, split="test")


def test_risbench_rgb_mask_is_reduced_to_binary(tmp_path):
    png(tmp_path / "img_rgb/a.png", np.zeros((20, 20, 3), dtype=np.uint8))
    mask = np.zeros((20, 20, 3), dtype=np.uint8)
    mask[5:10, 5:15] = 255
    png(tmp_path / "mask/a.png", mask)
    (tmp_path / "output_phrase_train.txt").write_text("a.png the thing\n")
    records, _ = read_risbench(tmp_path)
    assert records[0].objects[0].box == pytest.approx((0.25, 0.25, 0.75, 0.5))


# --- OpenEarthMap -----------------------------------------------------------------------------------------------


def test_openearthmap_regions_with_underscores_label_codes_and_bad_labels(tmp_path):
    labels = np.arange(64, dtype=np.uint8).reshape(8, 8) % 9  # codes 0..8
    for region, n in (("aachen", 1), ("santa_cruz", 2), ("chiclayo", 3), ("chiclayo", 4), ("chiclayo", 5)):
        tif(tmp_path / region / "images" / f"{region}_{n}.tif", np.zeros((8, 8, 3), dtype=np.uint8))
    tif(tmp_path / "aachen/labels/aachen_1.tif", labels)
    tif(tmp_path / "santa_cruz/labels/santa_cruz_2.tif", labels)
    tif(tmp_path / "chiclayo/labels/chiclayo_3.tif", np.full((8, 8), 12, dtype=np.uint8))  # code 12
    tif(tmp_path / "chiclayo/labels/chiclayo_4.tif", np.zeros((8, 8, 3), dtype=np.uint8))  # RGB colour label
    (tmp_path / "train.txt").write_text("aachen_1.tif\nsanta_cruz_2.tif\nchiclayo_3.tif\nchiclayo_4.tif\nlima_9.tif\n")
    (tmp_path / "test.txt").write_text("chiclayo_5.tif\n")
    records, report = read_openearthmap(tmp_path, split="train")
    assert [r.record_id for r in records] == ["aachen_1", "santa_cruz_2"]
    semantic = records[1].semantic
    assert semantic.class_names == {  # canonical names (geopilot.vocabulary), by OpenEarthMap's label codes
        1: "bare land",
        2: "rangeland",
        3: "developed space",
        4: "road",
        5: "tree",
        6: "water",
        7: "agricultural land",
        8: "building",
    }
    assert semantic.ignore_values == (0,)
    assert semantic.mask_path.endswith("santa_cruz/labels/santa_cruz_2.tif")
    assert report.skipped == {"unknown_class": 1, "malformed_file": 1, "missing_image": 1}
    test_records, test_report = read_openearthmap(tmp_path, split="test")  # test labels are withheld
    assert test_records == [] and test_report.skipped == {"missing_label": 1}


# --- RICE -------------------------------------------------------------------------------------------------------


def test_rice_pairs_by_name_numeric_order_fixed_split_and_bad_pairs(tmp_path):
    for n in range(12):
        png(tmp_path / f"RICE1/cloud/{n}.png", np.zeros((16, 16, 3), dtype=np.uint8))
        if n != 11:
            png(tmp_path / f"RICE1/label/{n}.png", np.zeros((16, 16, 3), dtype=np.uint8))
    png(tmp_path / "RICE2/cloud/3.png", np.zeros((16, 16, 3), dtype=np.uint8))
    png(tmp_path / "RICE2/label/3.png", np.zeros((8, 8, 3), dtype=np.uint8))  # size differs
    records, report = read_rice(tmp_path, split="all")
    assert [r.record_id for r in records] == [f"RICE1/{n}" for n in range(11)]  # 10 after 9
    assert records[4].cloud_free_image.endswith("RICE1/label/4.png")
    assert report.skipped == {"missing_label": 1, "size_mismatch": 1}
    train, _ = read_rice(tmp_path, split="train")
    test, _ = read_rice(tmp_path, split="test")
    assert {r.record_id for r in train} | {r.record_id for r in test} == {r.record_id for r in records}
    assert not {r.record_id for r in train} & {r.record_id for r in test}
    # RICE1 without a list file: SpA-GAN's published RICE1 split (0, 6, 7, 8, 9 are in its test list)
    assert {r.record_id for r in test} == {"RICE1/0", "RICE1/6", "RICE1/7", "RICE1/8", "RICE1/9"}
    single, _ = read_rice(tmp_path / "RICE1", split="all")  # root may be one subset folder
    assert len(single) == 11


def test_rice1_uses_spagan_published_split():
    assert len(SPAGAN_RICE1_TEST) == 100 and max(SPAGAN_RICE1_TEST) < 500
    assert {70, 232, 51, 488, 0} <= SPAGAN_RICE1_TEST  # the first lines of its test_list.txt, and the last
    assert not {476, 62, 215, 487, 431} & SPAGAN_RICE1_TEST  # the first lines of its train_list.txt


def test_rice_spagan_layout_and_list_files(tmp_path):
    """SpA-GAN's layout (cloudy_image/ + ground_truth/) and its list file decide the split when present."""
    for n in (0, 1, 2, 3):
        png(tmp_path / f"RICE2/cloudy_image/{n}.png", np.zeros((16, 16, 3), dtype=np.uint8))
        png(tmp_path / f"RICE2/ground_truth/{n}.png", np.full((16, 16, 3), 9, dtype=np.uint8))
    (tmp_path / "RICE2/test_list.txt").write_bytes(b"1.png\r\n3.png\r\n")  # CRLF, as SpA-GAN writes
    (tmp_path / "RICE2/train_list.txt").write_bytes(b"0.png\r\n2.png\r\n")
    test, report = read_rice(tmp_path, split="test")
    assert [r.record_id for r in test] == ["RICE2/1", "RICE2/3"] and report.skipped == {}
    assert test[0].cloud_free_image.endswith("RICE2/ground_truth/1.png")
    train, _ = read_rice(tmp_path / "RICE2", split="train")
    assert [r.record_id for r in train] == ["RICE2/0", "RICE2/2"] and {r.split for r in train} == {"train"}


def test_rice_split_is_about_one_in_five_and_stable():
    splits = [rice_split("RICE1", str(n)) for n in range(500)]
    assert 0.12 < splits.count("test") / 500 < 0.28
    assert rice_split("RICE1", "488") == rice_split("RICE1", "488")
    with pytest.raises(DatasetRootError):
        read_rice(Path("/nonexistent/rice"))
