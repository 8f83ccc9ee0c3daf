"""Acc@0.5 protocols on GeoChat-format answer rows (`batch_geochat_grounding.py`'s output: a referring.jsonl row plus
`answer`), scored by `geopilot eval referring-answers`.

Row `fast_6217` is a real GeoChat-7B answer with its GeoChat-Bench ground truth, quoted in mbzuai-oryx/GeoChat issue
#41. The other rows are written in the same format; two hold a box whose unrotated rectangle pokes off the grid
(`<-3>`, `<-7>`), as GeoChat writes boxes of long objects turned near an image edge: decoded as written they land on
their targets (IoU 0.80 and 0.75), clipped to the grid first they do not (0.36, and the `<-7>` box was dropped).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from geopilot.cli import main
from geopilot.eval.benchmark_tasks import score_referring
from geopilot.eval.loaders.referring import decode_boxes, load_referring
from geopilot.eval.task_metrics.grounding import acc_at_iou
from geopilot.polygons import polygon_iou


def _box(x1: float, y1: float, x2: float, y2: float) -> list[list[float]]:
    return [[x1, y1], [x2, y1], [x2, y2], [x1, y2]]


def _turned(cx: float, cy: float, w: float, h: float, degrees: float) -> list[list[float]]:
    a = math.radians(degrees)
    corners = ((-w / 2, -h / 2), (w / 2, -h / 2), (w / 2, h / 2), (-w / 2, h / 2))
    return [
        [round(cx + dx * math.cos(a) - dy * math.sin(a), 1), round(cy + dx * math.sin(a) + dy * math.cos(a), 1)]
        for dx, dy in corners
    ]


def _row(qid, image_id, answer, truth, kind, size, dataset="DIOR") -> dict:
    return {
        "question_id": qid,
        "image_id": image_id,
        "answer": answer,
        "ground_truth": truth,
        "question": "the objects",
        "type": kind,
        "dataset": dataset,
        "obj_ids": list(range(1, len(truth) + 1)),
        "size_group": size,
    }


ROWS = [
    {  # real: GeoChat issue #41
        "question_id": "fast_6217",
        "image_id": "train_5007_0017",
        "answer": "{<89><47><97><55>|<58>}{<50><24><54><28>|<58>}{<48><16><52><20>|<58>}",
        "ground_truth": [
            [[584.0, 337.0], [619.0, 313.0], [601.0, 282.0], [565.0, 304.0]],
            [[553.0, 287.0], [592.0, 262.0], [573.0, 229.0], [534.0, 254.0]],
            [[517.0, 237.0], [555.0, 214.0], [534.0, 181.0], [498.0, 204.0]],
        ],
        "question": "3 airplanes at the right",
        "type": "ref",
        "dataset": "FAST",
        "obj_ids": [1, 2, 3],
        "size_group": "small",
    },
    _row(
        "sota_1", "P0003_0004", "{<10><40><15><44>|<0>}", [_box(102.4, 409.6, 153.6, 450.56)], "ref", "medium", "SOTA"
    ),
    _row(  # 2 of 3 tennis courts found, nothing extra
        "sior_1",
        "00017",
        "<p>tennis courts</p> {<10><10><20><20>|<0>}{<40><10><50><20>|<0>}",
        [_box(80, 80, 160, 160), _box(320, 80, 400, 160), _box(560, 80, 640, 160)],
        "grounding",
        "large",
    ),
    _row("sior_2", "00018", "{<10><10><20><20>|<0>}{<60><60><70><70>|<0>}", [_box(80, 80, 160, 160)], "ref", "small"),
    _row(
        "fast_1", "train_12_0003", "{<-3><48><13><52>|<85>}", [_turned(30, 300, 100, 20, 85)], "ref", "medium", "FAST"
    ),
    _row("fast_2", "train_12_0004", "{<-7><49><13><51>|<88>}", [_turned(18, 300, 120, 16, 88)], "ref", "small", "FAST"),
    _row("sior_3", "00019", "", [_box(80, 80, 160, 160), _box(320, 80, 400, 160)], "grounding", "medium"),
]


def _answers(tmp_path: Path, rows=ROWS) -> Path:
    path = tmp_path / "answers.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_off_grid_boxes_decoded_as_written_land_on_their_targets():
    for row, expected in zip(ROWS[4:6], (0.80, 0.75), strict=True):
        (box,) = decode_boxes(row["answer"], 600, 600)
        assert polygon_iou(box, row["ground_truth"][0]) == pytest.approx(expected, abs=0.01)
    clipped_first = decode_boxes("{<0><48><13><52>|<85>}", 600, 600)[0]  # what the former decoder read
    assert polygon_iou(clipped_first, ROWS[4]["ground_truth"][0]) < 0.5


def test_both_protocols_on_the_same_answers(tmp_path):
    loaded = load_referring(_answers(tmp_path), check_images=False)
    metrics = score_referring(loaded, {r["question_id"]: {"answer": r["answer"]} for r in ROWS})
    # per_object: 6 of 12 objects found; by targets 4/4 single, 2/8 multiple
    assert metrics["protocol"] == "per_object" and metrics["Acc@0.5"] == pytest.approx(0.5)
    assert (metrics["objects"], metrics["objects_found"]) == (12, 6)
    assert metrics["by_count"] == pytest.approx({"single": 1.0, "multiple": 0.25})
    assert metrics["by_size"] == pytest.approx({"small": 2 / 5, "medium": 2 / 4, "large": 2 / 3})
    assert metrics["by_type"] == pytest.approx({"grounding": 2 / 5, "ref": 4 / 7})
    # all_or_nothing: 3 of 7 samples (the extra box of sior_2 and the partial sior_1 fail)
    strict = metrics["alternatives"]["all_or_nothing"]
    assert strict["Acc@0.5"] == pytest.approx(3 / 7) and strict["correct"] == 3
    assert strict["by_count"] == pytest.approx({"single": 3 / 4, "multiple": 0.0})
    assert strict["by_type"] == pytest.approx({"grounding": 0.0, "ref": 3 / 5})
    assert metrics["box_repairs"] == {"box_off_grid": 2}


def test_protocols_differ_only_on_partial_and_extra_boxes():
    square, other = _box(0, 0, 10, 10), _box(20, 20, 30, 30)
    truth = {"partial": [square, other], "extra": [square], "exact": [square]}
    predictions = {"partial": [square], "extra": [square, other], "exact": [square]}
    per_object = acc_at_iou(truth, predictions)
    assert per_object.overall == pytest.approx(3 / 4) and per_object.correct_ids == {"extra", "exact"}
    strict = acc_at_iou(truth, predictions, protocol="all_or_nothing")
    assert strict.overall == pytest.approx(1 / 3) and strict.correct_ids == {"exact"}
    with pytest.raises(ValueError, match="unknown Acc@0.5 protocol"):
        acc_at_iou(truth, predictions, protocol="any")


def test_referring_answers_command(tmp_path, capsys):
    path = _answers(tmp_path)
    assert main(["eval", "referring-answers", "--pred", str(path), "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["Acc@0.5"] == pytest.approx(0.5) and metrics["total"] == 7 and metrics["missing"] == 0
    assert main(["eval", "referring-answers", "--pred", str(path)]) == 0
    per_object, strict = capsys.readouterr().out.strip().splitlines()
    assert per_object.startswith("per_object      Acc@0.5 50.0 (small 40.0, medium 50.0, large 66.7, single 100.0")
    assert strict.startswith("all_or_nothing  Acc@0.5 42.9")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "not found"),
        ("{not json\n", "line 1"),
        (json.dumps(ROWS[1]) + "\n" + json.dumps(ROWS[1]) + "\n", "duplicate question_id 'sota_1'"),
        (json.dumps({**ROWS[1], "ground_truth": [[1, 1], [1, 1]]}) + "\n", "no usable items (malformed_line=1)"),
    ],
)
def test_referring_answers_bad_input_is_one_line_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "answers.jsonl"
    if content is not None:
        path.write_text(content)
    assert main(["eval", "referring-answers", "--pred", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
