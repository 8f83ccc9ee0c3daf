"""Metrics against hand-computed values: VQA accuracy, polygon IoU, Acc@0.5, mIoU, referring-mask IoU."""

from __future__ import annotations

import math

import numpy as np
import pytest

from geopilot.eval.task_metrics.grounding import acc_at_iou, sample_correct
from geopilot.eval.task_metrics.segmentation import ConfusionMatrix, MaskShapeError, referring_mask_scores
from geopilot.eval.task_metrics.vqa import accuracy, exact_match, normalize_answer, sarlang_match
from geopilot.polygons import DegeneratePolygonError, convex_polygon, is_simple, polygon_iou

SQUARE = [(0, 0), (2, 0), (2, 2), (0, 2)]


def test_answer_normalisation_and_matches():
    assert normalize_answer(" Yes. ") == "yes"
    assert normalize_answer("1234 m2") == normalize_answer("1234m2") == "1234m2"
    assert exact_match("Rural.", "rural") and not exact_match("urban", "rural")
    assert sarlang_match("There are 3 ships.", "3") is False  # short answers need an exact match
    assert sarlang_match("3", "3") and sarlang_match("It is an aircraft.", "aircraft")
    assert not sarlang_match("no", "yes")


def test_accuracy_pooled_vs_mean_of_types_and_missing_ids():
    refs = {"a": "yes", "b": "no", "c": "yes", "d": "rural", "e": "12"}
    types = {"a": "presence", "b": "presence", "c": "comp", "d": "rural_urban", "e": "count"}
    preds = {"a": "Yes", "b": "yes", "d": "rural", "e": "12", "zz": "yes"}  # c missing, zz unknown
    result = accuracy(preds, refs, types, averaged_types=["presence", "comp", "rural_urban"])
    assert result.per_type == {"presence": 0.5, "comp": 0.0, "rural_urban": 1.0, "count": 1.0}
    assert result.pooled == pytest.approx(2 / 4)  # count excluded
    assert result.mean_of_types == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert result.missing == ["c"] and result.unexpected == ["zz"]
    assert result.correct == 3 and result.total == 5
    shown = result.as_dict()
    assert list(shown)[-5:] == ["total", "correct", "missing", "missing_ids", "unexpected"]
    assert [shown[k] for k in ("total", "correct", "missing", "missing_ids", "unexpected")] == [5, 3, 1, ["c"], 1]


def test_a_result_lists_the_first_20_missing_ids_and_counts_them_all():
    refs = {f"q{i:02d}": "yes" for i in range(25)}
    shown = accuracy({}, refs, dict.fromkeys(refs, "presence")).as_dict()
    assert shown["missing"] == 25 and shown["missing_ids"] == sorted(refs)[:20]


def test_polygon_iou_hand_values():
    shifted = [(1, 1), (3, 1), (3, 3), (1, 3)]
    assert polygon_iou(SQUARE, shifted) == pytest.approx(1 / 7)  # 1 / (4 + 4 - 1)
    assert polygon_iou(SQUARE, list(reversed(SQUARE))) == pytest.approx(1.0)  # clockwise order is fine
    assert polygon_iou(SQUARE, [(5, 5), (6, 5), (6, 6)]) == 0.0
    # a 2x2 square rotated 45 degrees about (1, 1): the intersection is an octagon of area 8(sqrt2 - 1)
    r = math.sqrt(2)
    diamond = [(1, 1 - r), (1 + r, 1), (1, 1 + r), (1 - r, 1)]
    inter = 8 * (math.sqrt(2) - 1)
    assert polygon_iou(SQUARE, diamond) == pytest.approx(inter / (8 - inter))


def test_bow_tie_is_repaired_and_degenerate_raises():
    bow_tie = [(0, 0), (2, 2), (2, 0), (0, 2)]
    assert not is_simple(bow_tie) and is_simple(SQUARE)
    assert polygon_iou(bow_tie, SQUARE) == pytest.approx(1.0)
    for bad in (
        [(0, 0), (1, 1), (2, 2), (3, 3)],
        [(0, 0), (1, 1)],
        [(0, 0), (0, 0), (0, 0)],
        [(0, 0), (1, float("nan")), (1, 1)],
    ):
        with pytest.raises(DegeneratePolygonError):
            convex_polygon(bad)


def test_acc_at_05_greedy_one_to_one_and_splits():
    a, b = SQUARE, [(10, 10), (12, 10), (12, 12), (10, 12)]
    near_a = [(0, 0), (2, 0), (2, 1.2), (0, 1.2)]  # IoU 0.6
    far_a = [(0, 0), (2, 0), (2, 0.8), (0, 0.8)]  # IoU 0.4
    assert sample_correct([near_a], [a]) and not sample_correct([far_a], [a])
    exactly_half = [(0, 0), (2, 0), (2, 1), (0, 1)]  # IoU 0.5: counts (>=)
    assert sample_correct([exactly_half], [a])
    assert not sample_correct([a, a], [a])  # an extra prediction
    assert not sample_correct([a, a], [a, b])  # one prediction cannot match two targets
    assert sample_correct([b, a], [a, b])
    assert not sample_correct([[(0, 0), (1, 1), (2, 2)]], [a])  # degenerate prediction: a miss
    truth = {"1": [a], "2": [a, b], "3": [b], "4": [a]}
    preds = {"1": [near_a], "2": [a, b], "3": [far_a]}  # "4" missing
    sizes = {"1": "small", "2": "large", "3": "small", "4": "medium"}
    result = acc_at_iou(truth, preds, size_group=sizes, protocol="all_or_nothing")
    assert result.overall == 0.5 and result.missing == ["4"]
    assert result.by_size == {"small": 0.5, "medium": 0.0, "large": 1.0}
    assert result.by_count == {"single": 1 / 3, "multiple": 1.0}


def test_miou_confusion_matrix_over_the_split_with_ignore():
    cm = ConfusionMatrix(3, ignore=(0,), class_names=["unknown", "water", "tree"])
    truth1 = np.array([[1, 1], [2, 0]])
    pred1 = np.array([[1, 2], [2, 1]])  # the ignored pixel's prediction is not counted
    truth2 = np.array([[2, 2], [1, -1 + 1]])  # the last pixel is 0: ignored
    pred2 = np.array([[2, -1], [1, 2]])  # -1: no prediction -> false negative of class 2
    cm.update(truth1, pred1)
    cm.update(truth2, pred2)
    # class 1: TP 2 (one per image), FN 1 (predicted 2), FP 0 -> 2/3
    # class 2: TP 2, FN 1 (no prediction), FP 1 (a class-1 pixel predicted 2) -> 2/4
    iou = cm.per_class_iou()
    assert np.isnan(iou[0]) and iou[1] == pytest.approx(2 / 3) and iou[2] == pytest.approx(0.5)
    assert cm.miou() == pytest.approx((2 / 3 + 0.5) / 2)
    assert cm.as_dict()["per_class_iou"] == {"water": pytest.approx(2 / 3), "tree": 0.5}
    with pytest.raises(MaskShapeError):
        cm.update(np.zeros((2, 2)), np.zeros((3, 2)))


def test_class_absent_everywhere_is_left_out_of_the_mean():
    cm = ConfusionMatrix(4, ignore=(0,))
    cm.update(np.array([[1, 1]]), np.array([[1, 1]]))
    assert cm.miou() == 1.0 and np.isnan(cm.per_class_iou()[3])


def test_referring_mask_oiou_and_miou():
    t1, p1 = np.zeros((4, 4), bool), np.zeros((4, 4), bool)
    t1[:2, :2], p1[:2, :] = True, True  # I 4, U 8
    t2, p2 = np.zeros((4, 4), bool), np.zeros((4, 4), bool)
    t2[0, 0], p2[0, 0] = True, True  # I 1, U 1
    scores = referring_mask_scores([(t1, p1), (t2, p2)])
    assert scores["oIoU"] == pytest.approx(5 / 9)
    assert scores["mIoU"] == pytest.approx((0.5 + 1.0) / 2)
    assert scores["Pr@0.5"] == 1.0 and scores["Pr@0.6"] == 0.5
    with pytest.raises(MaskShapeError):
        referring_mask_scores([(t1, np.zeros((5, 4), bool))])
