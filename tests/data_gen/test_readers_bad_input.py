"""Every reader on garbage where its files should be: skipped and counted, or a DatasetRootError; never a crash."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from geopilot.data_gen.readers import READERS, DatasetRootError
from geopilot.data_gen.readers.coco import coco_records
from geopilot.errors import GeoPilotInputError

# reader -> files that make up a minimal layout (each gets random bytes)
LAYOUTS = {
    "dota": ["train/labelTxt/P0001.txt", "train/images/P0001.png"],
    "dior": ["ImageSets/Main/train.txt", "Annotations/Horizontal Bounding Boxes/00001.xml"],
    "fair1m": ["train/part1/labelXml/0.xml", "train/part1/images/0.tif"],
    "risbench": ["output_phrase_train.txt", "img_rgb/a.png", "mask/a.png"],
    "isaid": ["train/Annotations/iSAID_train.json"],
    "openearthmap": ["train.txt", "aachen/images/aachen_1.tif", "aachen/labels/aachen_1.tif"],
    "spacenet": ["AOI_2_Vegas/geojson_roads/x_geojson_roads_img1.geojson", "AOI_2_Vegas/PS-RGB/x_PS-RGB_img1.tif"],
    "cityscale": ["region_0_sat.png", "region_0_gt_graph.p"],
    "rice": ["RICE1/cloud/0.png", "RICE1/label/0.png"],
    "geochat_instruct": ["GeoChat_Instruct.json"],
    "sarlang": ["Text/caption/Caption-training.csv", "SARimages/a.png"],
    "sardet": ["Annotations/train.json"],
}
SPLITS = {"rice": "all"}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_garbage_files_are_counted_or_refused_never_a_crash(tmp_path, name, seed):
    rng = random.Random(f"{name}/{seed}")
    for relative in LAYOUTS[name]:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400))))
    try:
        records, report = READERS[name](tmp_path, split=SPLITS.get(name, "train"))
    except DatasetRootError as err:
        assert str(err)  # a one-line reason naming the dataset
        return
    assert all(r.objects == [] and r.roads is None and r.dialogues == [] for r in records) or report.skipped
    assert report.records == len(records)


def test_coco_entries_the_index_cannot_take_are_counted(tmp_path):
    (tmp_path / "a.png").write_bytes(b"")  # exists, but is not an image
    data = {
        "images": [{"id": 1, "file_name": "a.png"}, {"file_name": "b.png"}, "junk"],
        "annotations": [{"image_id": 1}, 5, {"id": 3, "image_id": 1, "category_id": 1, "bbox": ["a", 1, 2, 3]}],
        "categories": [{"id": 1, "name": "ship"}, "x"],
    }
    path = tmp_path / "train.json"
    path.write_text(json.dumps(data))
    records, report = coco_records(
        path, [tmp_path], source="SARDet-100K", modality="sar", dataset="SARDet-100K", split="train", with_masks=False
    )
    assert records == []
    assert report.skipped == {"malformed_line": 5, "unreadable_image": 1}


def test_missing_roots_raise_input_errors(tmp_path):
    for name, reader in READERS.items():
        with pytest.raises(GeoPilotInputError):
            reader(tmp_path / "absent", split=SPLITS.get(name, "train"))


def test_reader_messages_name_the_file(tmp_path):
    (tmp_path / "train/labelTxt").mkdir(parents=True)
    (tmp_path / "train/labelTxt/P0042.txt").write_text("1 1 5 1 5 5 1 5 plane 0\n")
    _, report = READERS["dota"](Path(tmp_path))
    (message,) = report.examples["missing_image"]
    assert "P0042.txt" in message and "P0042.png" in message


def test_a_class_name_in_no_vocabulary_is_kept_verbatim_and_counted_in_the_report(tmp_path):
    from PIL import Image

    from geopilot.data_gen.generate import generate_dataset
    from geopilot.data_gen.generate_config import GenerateConfig

    (tmp_path / "DOTA/train/images").mkdir(parents=True)
    Image.new("RGB", (100, 100)).save(tmp_path / "DOTA/train/images/P0001.png")
    (tmp_path / "DOTA/train/labelTxt").mkdir(parents=True)
    (tmp_path / "DOTA/train/labelTxt/P0001.txt").write_text(
        "10 10 30 10 30 30 10 30 Space-Ship 0\n50 50 70 50 70 70 50 70 plane 0\n60 10 80 10 80 30 60 30 Space-Ship 0\n"
    )
    (record,), report = READERS["dota"](tmp_path / "DOTA")
    assert [o.label for o in record.objects] == ["Space-Ship", "airplane", "Space-Ship"] and report.skipped == {}
    config = GenerateConfig(
        sources=[{"reader": "dota", "root": str(tmp_path / "DOTA")}], abilities=["panoptic_detection"]
    )
    result = generate_dataset(config, tmp_path / "out")
    assert result.report["unknown_class_names"] == {"DOTA": {"Space-Ship": 2}}
    assert (
        "Class names in no vocabulary (kept verbatim): `DOTA` 'Space-Ship' 2"
        in (tmp_path / "out/report.md").read_text()
    )
