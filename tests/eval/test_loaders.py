"""Each loader reads a fixture in the benchmark's real on-disk format, traps included."""

from __future__ import annotations

import json

import pytest
from helpers.bench_fixtures import write_referring, write_rsvqa, write_sarlang

from geopilot.errors import GeoPilotInputError
from geopilot.eval.loaders.referring import decode_boxes, image_size, load_referring, prompt_for
from geopilot.eval.loaders.rsvqa import load_rsvqa
from geopilot.eval.loaders.sarlang import infer_type, load_sar_captions, load_sar_vqa
from geopilot.polygons import polygon_iou


def test_rsvqa_lr_joins_answers_by_question_id_and_skips_inactive(tmp_path):
    loaded = load_rsvqa(write_rsvqa(tmp_path / "lr"), "lr")
    # images 0 and 2 are active (image 1 is another split's), 4 questions each
    assert [i.id for i in loaded.items] == ["0", "1", "2", "3", "8", "9", "10", "11"]
    by_id = {i.id: i for i in loaded.items}
    assert by_id["2"].kind == "rural_urban" and by_id["2"].reference == "rural"
    assert by_id["11"].kind == "count" and by_id["11"].reference == "12"
    assert by_id["8"].image.endswith("Images_LR/2.tif")
    assert by_id["0"].prompt.endswith("Answer the question using a single word or phrase.")
    assert "joined" in loaded.notes[0]


def test_rsvqa_hr_without_the_geochat_file_reads_active_questions(tmp_path):
    loaded = load_rsvqa(write_rsvqa(tmp_path / "hr", "hr", with_bench_file=False), "hr")
    assert {i.kind for i in loaded.items} == {"presence", "comp", "count", "area"}
    assert {i.reference for i in loaded.items if i.kind == "area"} == {"1234m2"}
    assert all("Data/" in i.image for i in loaded.items)


def test_rsvqa_missing_files_are_one_line_errors(tmp_path):
    with pytest.raises(GeoPilotInputError, match="LR_split_test_questions.json"):
        load_rsvqa(tmp_path, "lr")


def test_rsvqa_answer_for_unknown_question_is_skipped(tmp_path):
    root = write_rsvqa(tmp_path / "lr")
    with (root / "lrben.jsonl").open("a") as f:
        f.write(json.dumps({"question_id": 999, "image": "0.tif", "text": "?", "category": "presence"}) + "\n")
        f.write("{not json\n")
    loaded = load_rsvqa(root, "lr")
    assert len(loaded.items) == 8 and loaded.report.skipped == {"malformed_line": 2}


def test_rsvqa_ids_that_are_not_numbers_skip_their_entry_not_the_file(tmp_path):
    root = write_rsvqa(tmp_path / "lr", with_bench_file=False)
    questions_file = root / "LR_split_test_questions.json"
    questions = json.loads(questions_file.read_text())
    questions["questions"][0]["id"] = "q-zero"
    questions["questions"][1]["answers_ids"] = ["one"]
    questions_file.write_text(json.dumps(questions))
    loaded = load_rsvqa(root, "lr")
    assert [i.id for i in loaded.items] == ["2", "3", "8", "9", "10", "11"]
    assert loaded.report.skipped == {"malformed_line": 2}


def test_referring_sizes_polygons_and_traps(tmp_path):
    loaded = load_referring(write_referring(tmp_path / "ref"))
    assert loaded.report.skipped == {"bad_polygon": 1, "malformed_line": 1}
    assert "self-intersecting" in loaded.notes[0]
    dota, fair, dior = loaded.items
    assert (dota.meta["width"], fair.meta["width"], dior.meta["width"]) == (1024, 600, 800)
    assert image_size("P0001_0002") == 1024 and image_size("train_9") == 600 and image_size("11726") == 800
    assert fair.reference == [[(60.0, 60.0), (300.0, 60.0), (300.0, 240.0), (60.0, 240.0)]]  # unwrapped flat list
    assert dior.meta["targets"] == "multiple" and dior.kind == "grounding"
    assert dota.prompt == "[refer] Give me the location of <p> the small vehicle on the left </p>"
    assert dior.prompt == "[grounding]the two tennis courts"
    assert dior.image.endswith("00017.jpg")  # image_id without its extension


def test_referring_box_text_decodes_against_the_source_size():
    # {<10><40><15><44>|<0>} on a 1024 px DOTA patch = the fixture's first ground truth exactly
    truth = [(102.4, 409.6), (153.6, 409.6), (153.6, 450.56), (102.4, 450.56)]
    (box,) = decode_boxes("{<10><40><15><44>|<0>}", 1024, 1024)
    assert polygon_iou(box, truth) == pytest.approx(1.0)
    # boxes concatenated as }{, a negative angle inside brackets, one off the grid (kept as written, as GeoChat
    # decodes it: IoU needs the whole box) and one empty (dropped)
    boxes = decode_boxes(
        "<p>ships</p> {<10><10><20><20>|<-30>}{<50><50><60><70>|<45>}{<90><90><101><95>|<0>}{<9><9><130><9>}", 800, 800
    )
    assert len(boxes) == 3 and boxes[2] == [(720.0, 720.0), (808.0, 720.0), (808.0, 760.0), (720.0, 760.0)]
    assert image_size("valid_1234.tif") == image_size("train_17.tif") == 600  # FAIR1M patches, train and valid
    assert prompt_for(" a ship ", "ref1").startswith("[refer]")  # region-captioning rows
    cx = sum(x for x, _ in boxes[0]) / 4
    assert cx == pytest.approx(120.0)  # rotation keeps the centre


def test_sar_vqa_types_from_the_column_or_the_question(tmp_path):
    loaded = load_sar_vqa(write_sarlang(tmp_path / "sar"))
    assert [(i.id, i.kind, i.reference) for i in loaded.items] == [
        ("0009787", "OI", "Yes"),
        ("0009787#1", "IC", "3"),
        ("0009788", "OC", "aircraft"),
        ("0009788#1", "OP", "upper left"),  # no type column value: from the question
    ]
    assert loaded.report.skipped == {"malformed_line": 1}
    assert all(i.modality == "sar" for i in loaded.items)
    assert infer_type("Describe the weather") == "other"


def test_sar_captions_one_item_per_row_empty_reference_skipped(tmp_path):
    loaded = load_sar_captions(write_sarlang(tmp_path / "sar"))
    assert [i.id for i in loaded.items] == ["France_Alpes-Maritimes_Nice_3", "0009787", "0009787#1"]
    assert loaded.items[1].reference == ["Three ships are moored near the harbor."]
    assert loaded.report.skipped == {"malformed_line": 1}


def test_sar_missing_text_file_is_an_error(tmp_path):
    (tmp_path / "Text").mkdir()
    with pytest.raises(GeoPilotInputError, match="SARVQA1_test"):
        load_sar_vqa(tmp_path)
