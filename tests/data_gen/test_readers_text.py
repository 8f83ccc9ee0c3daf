"""Text-supervision readers (GeoChat-Instruct, SARLANG-1M) on small fixtures in each real format."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from PIL import Image

from geopilot.data_gen.readers import DatasetRootError
from geopilot.data_gen.readers.geochat import read_geochat
from geopilot.data_gen.readers.sarlang import read_sarlang


def image(path: Path, width: int = 100, height: int = 100, mode: str = "RGB") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, (width, height)).save(path)
    return path


def human(value: str) -> dict:
    return {"from": "human", "value": value}


def gpt(value: str) -> dict:
    return {"from": "gpt", "value": value}


# --- GeoChat-Instruct -------------------------------------------------------------------------------------------


def geochat(tmp_path: Path, *entries) -> Path:
    (tmp_path / "GeoChat_Instruct.json").write_text(json.dumps(entries))
    return tmp_path


def entry(image_name: str, *turns: dict, record_id: str | None = None) -> dict:
    """One GeoChat-Instruct entry; its id is the image's stem unless given."""
    return {"id": record_id or Path(image_name).stem, "image": image_name, "conversations": list(turns)}


def read_one(tmp_path: Path, image_name: str, *turns: dict, size: tuple[int, int] = (100, 100)):
    """One entry, its image at images/<image_name>, read back: (its one record, the report)."""
    image(tmp_path / "images" / image_name, *size)
    (record,), report = read_geochat(geochat(tmp_path, entry(image_name, *turns)))
    return record, report


def test_geochat_refer_boxes_on_the_0_100_grid_with_negative_theta_and_concatenated_boxes(tmp_path):
    record, report = read_one(
        tmp_path,
        "P0003_0004.png",
        human("<image>\n[refer] give me the location of <p>the small vehicle on the left</p>"),
        gpt("{<12><40><15><44>|<0>}{<20><40><30><60>|<-90>}"),
        human("[identify] What is the object present at {<60><10><80><30>|<0>}"),
        gpt("A white storage tank."),
        size=(200, 100),
    )
    assert report.skipped == {}
    assert record.width == 200 and record.source == "GeoChat-Instruct" and record.record_id == "P0003_0004"
    small, rotated, region = record.objects
    assert small.label == "the small vehicle on the left" and small.box == pytest.approx((0.12, 0.40, 0.15, 0.44))
    # a 20 x 20 px box rotated by -90 degrees about its centre (50, 50) in a 200 x 100 image: 20 wide, 20 high
    assert rotated.box == pytest.approx((0.20, 0.40, 0.30, 0.60), abs=1e-9)
    assert region.label == "region" and region.box == pytest.approx((0.6, 0.1, 0.8, 0.3))
    (refer,) = record.referring
    assert refer.expression == "the small vehicle on the left" and refer.object_indices == (0, 1)
    (dialogue,) = record.dialogues
    assert dialogue.task == "refer"
    assert dialogue.turns[0] == ("user", "[refer] give me the location of <p>the small vehicle on the left</p>")
    assert [role for role, _ in dialogue.turns] == ["user", "assistant", "user", "assistant"]


def test_geochat_rotation_changes_the_box_in_pixel_space(tmp_path):
    record, _ = read_one(
        tmp_path,
        "a.png",
        human("[grounding] Describe the image in detail"),
        gpt("There is <p>a long ship</p> {<40><45><60><55>|<45>} near the pier."),
    )
    (ship,) = record.objects
    half = (10 * math.cos(math.pi / 4) + 5 * math.sin(math.pi / 4)) / 100  # rotated 20 x 10 box, half extent
    assert ship.box == pytest.approx((0.5 - half, 0.5 - half, 0.5 + half, 0.5 + half))
    assert len(ship.polygon) == 4 and ship.label == "a long ship"
    assert record.referring[0].expression == "a long ship" and record.dialogues[0].task == "grounding"


@pytest.mark.parametrize("theta", [30, -30, 60])
def test_geochat_rotation_is_clockwise_on_screen(tmp_path, theta):
    """GeoChat's own box-to-polygon helper (`bbox_and_angle_to_polygon`, geochat_demo.py, quoted in GeoChat issue
    #32): corners about the centre through [[cos, -sin], [sin, cos]] in image coordinates (y down), i.e. positive
    theta turns the box clockwise on screen; real GeoChat-Bench rows fit this reading (IoU 0.873 vs 0.504)."""
    record, _ = read_one(
        tmp_path,
        "a.png",
        human("[refer] give me the location of <p>the long ship</p>"),
        gpt(f"{{<40><45><60><55>|<{theta}>}}"),
        size=(200, 100),
    )
    (ship,) = record.objects
    left, top, right, bottom = 80.0, 45.0, 120.0, 55.0  # the 0-100 grid scaled to 200 x 100 px
    cx, cy, a = (left + right) / 2, (top + bottom) / 2, math.radians(theta)
    corners = [(left, top), (right, top), (right, bottom), (left, bottom)]
    expected = [
        (
            (cx + (x - cx) * math.cos(a) - (y - cy) * math.sin(a)) / 200,
            (cy + (x - cx) * math.sin(a) + (y - cy) * math.cos(a)) / 100,
        )
        for x, y in corners
    ]
    assert [tuple(p) for p in ship.polygon] == [pytest.approx(p) for p in expected]
    # clockwise on screen for positive theta: the right end of the long box goes down (larger y)
    right_end_y = max(ship.polygon, key=lambda p: p[0])[1]
    assert (right_end_y > 0.5) == (theta > 0)


def test_geochat_real_data_variants_clipped_grid_delim_answers_and_the_released_image_folder(tmp_path):
    image(tmp_path / "share/softwares/kartik/GeoChat_finetuning/final_images_llava/P0005_0001.png", 100, 100)
    root = geochat(
        tmp_path,
        entry(
            "P0005_0001.png",  # found where images.zip unpacks, without an image_dir override
            human("[grounding] Describe the image in detail"),
            gpt(
                "<p>two planes</p> {<51><-1><53><3>|<74>}<delim>{<60><60><70><70>|<0>} and <p><script></p> {<1><1><5><5>|<0>}"
            ),
        ),
    )
    (record,), report = read_geochat(root)
    clipped, second = record.objects  # the slightly negative grid value is kept, the polygon clipped to the image
    assert clipped.label == second.label == "two planes" and record.referring[0].object_indices == (0, 1)
    assert report.skipped == {"unsafe_class_name": 1}  # the markup phrase's box never reaches a trace


def test_geochat_phrase_that_is_a_class_name_becomes_canonical(tmp_path):
    record, _ = read_one(
        tmp_path,
        "a.png",
        human("[grounding] Describe the image"),
        gpt("<p>Storage-Tanks</p> {<10><10><20><20>|<0>} and <p>a pier</p> {<30><30><40><40>|<0>}"),
    )
    assert [o.label for o in record.objects] == ["storage tank", "a pier"]
    assert [r.expression for r in record.referring] == ["Storage-Tanks", "a pier"]  # expressions stay as written


def test_geochat_tasks_bad_boxes_missing_images_and_duplicate_ids(tmp_path):
    image(tmp_path / "images/b.png")
    image(tmp_path / "flat.png")  # image path relative to the root also works
    vqa = "Is it a rural or an urban area? Answer in one word or a short phrase."
    classify = "Classify the given image in one of the following classes. Classes: farm, forest."
    root = geochat(
        tmp_path,
        entry("b.png", human("<image>\n" + vqa), gpt("Urban")),
        entry("b.png", human(classify), gpt("forest")),
        entry("flat.png", human("Where? {<10><10><120><50>|<0>}"), gpt("{<5><5><5><9>}"), record_id="c"),
        entry("missing.png", human("hi"), gpt("hello"), record_id="d"),
        entry("b.png", {"from": "system", "value": "x"}, record_id="e"),
        {"id": "f", "image": "b.png"},
        "not an object",
    )
    records, report = read_geochat(root)
    assert [(r.record_id, r.dialogues[0].task) for r in records] == [
        ("b", "vqa"),
        ("b#1", "classification"),
        ("c", "conversation"),
    ]
    (wide,) = records[2].objects  # {<10><10><120><50>}: kept, clipped to the image; {<5><5><5><9>}: empty, dropped
    assert wide.box == pytest.approx((0.1, 0.1, 1.0, 0.5))
    assert report.skipped == {"bad_geometry": 1, "missing_image": 1, "malformed_line": 3}
    assert report.repaired == {"box_off_grid": 1, "polygon_clipped_to_image": 1}


def test_geochat_root_errors(tmp_path):
    with pytest.raises(DatasetRootError, match="GeoChat_Instruct.json"):
        read_geochat(tmp_path)
    (tmp_path / "GeoChat_Instruct.json").write_text('{"id": 1}')
    with pytest.raises(DatasetRootError, match="JSON array"):
        read_geochat(tmp_path)


# --- SARLANG-1M -------------------------------------------------------------------------------------------------


def text(path: Path, content: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")


def test_sarlang_sniffed_headers_splits_vqa_types_and_bad_rows(tmp_path):
    for name in ("France_Alpes-Maritimes_Nice_3.png", "SV_Darwin_-12.4278_130.8688.png", "0009787.jpg"):
        image(tmp_path / "SARimages" / name, 64, 64, mode="L")
    text(
        tmp_path / "Text/caption/Caption-training.csv",
        "\ufeffImage,Caption\n"
        'France_Alpes-Maritimes_Nice_3.png,"A coastal city, with a harbor and many ships."\n'
        "SARimages/SV_Darwin_-12.4278_130.8688.png,Dense urban area.\n"
        "missing.png,Nothing here.\n"
        "France_Alpes-Maritimes_Nice_3.png,\n",
    )
    text(
        tmp_path / "Text/VQA/SARVQA1_train.csv",
        "image_name,question,answer,question_type\n0009787,How many ships are there?,3,object counting\n",
    )
    text(tmp_path / "Text/caption/Caption_test.csv", "image,caption\n0009787.jpg,A complex caption of ships at sea.\n")
    text(tmp_path / "Text/caption/Caption_test1.csv", "0009787.jpg,Ships.\n")  # no header: positional
    records, report = read_sarlang(tmp_path, split="train")
    by_id = {r.record_id: r for r in records}
    assert set(by_id) == {"France_Alpes-Maritimes_Nice_3", "SV_Darwin_-12.4278_130.8688", "0009787"}
    assert all(r.modality == "sar" and r.source == "SARLANG-1M" for r in records)
    nice = by_id["France_Alpes-Maritimes_Nice_3"].dialogues
    assert nice[0].turns == (("assistant", "A coastal city, with a harbor and many ships."),)
    assert nice[0].task == "caption"
    (qa,) = by_id["0009787"].dialogues
    assert qa.turns == (("user", "How many ships are there?"), ("assistant", "3")) and qa.task == "vqa:object counting"
    assert report.skipped == {"missing_image": 1, "malformed_line": 1}
    (complex_record,), _ = read_sarlang(tmp_path, split="test")
    assert complex_record.dialogues[0].turns[0][1] == "A complex caption of ships at sea."  # not Caption_test1
    (concise,), _ = read_sarlang(tmp_path, split="test_concise")
    assert concise.dialogues[0].turns[0][1] == "Ships."


def test_sarlang_json_and_llama_factory_records(tmp_path):
    image(tmp_path / "SARimages/a.png", 32, 32, mode="L")
    rows = [
        {
            "images": ["SARimages/a.png"],
            "messages": [
                {"role": "user", "content": "<image>What is in the image?"},
                {"role": "assistant", "content": "Ships."},
            ],
        },
        {"img_name": "a.png", "question": "Is there a bridge?", "answer": "no"},
        {"img_name": "a.png", "messages": [{"role": "robot", "content": "?"}]},
    ]
    text(tmp_path / "Text/VQA/SARVQA2_test.json", json.dumps(rows))
    text(tmp_path / "Text/VQA/SARVQA1_test.jsonl", json.dumps({"image": "a.png", "q": "Sea?", "a": "yes"}) + "\n")
    text(tmp_path / "Text/caption/Caption_test.json", "[{broken")
    (record,), report = read_sarlang(tmp_path, split="test")
    assert [d.turns for d in record.dialogues] == [
        (("user", "Sea?"), ("assistant", "yes")),
        (("user", "What is in the image?"), ("assistant", "Ships.")),
        (("user", "Is there a bridge?"), ("assistant", "no")),
    ]
    assert report.skipped == {"malformed_file": 1, "malformed_line": 1}
    with pytest.raises(DatasetRootError, match="Caption-training"):
        read_sarlang(tmp_path, split="train")
