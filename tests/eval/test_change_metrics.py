"""Change-mask scores on hand-computed cases: the changed class of one confusion matrix summed over the split;
`geopilot eval change-masks` scoring a change tool on a LEVIR-CD split."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from geopilot.data_gen.readers.levir_cd import read_levir_cd
from geopilot.data_gen.synthetic.change import change_pairs, write_levir_cd
from geopilot.eval.change_masks_cli import score_change_masks
from geopilot.eval.task_metrics.change import ChangeConfusion, change_scores
from geopilot.eval.task_metrics.segmentation import ConfusionMatrix, MaskShapeError
from geopilot.tool_protocol import ToolRegistry
from geopilot.tools.adapters import ChangeDetectorAdapter
from geopilot.tools.task_tools import TASKS_BY_NAME, TaskTool


def test_one_pair_by_hand():
    label = np.array([[0, 255, 255], [0, 0, 255]], dtype=np.uint8)  # LEVIR-CD's 0/255 labels
    predicted = np.array([[1, 1, 0], [0, 0, 1]])  # TP 2 (0,1), (1,2); FP 1 (0,0); FN 1 (0,2); TN 2
    scores = change_scores([(predicted, label)])
    assert scores == {"precision": 2 / 3, "recall": 2 / 3, "f1": 2 / 3, "iou": 0.5, "oa": 4 / 6, "pixels": 6}


def test_summed_over_the_split_not_averaged_per_image():
    # image 1: TP 1, FP 0, FN 0 (per-image F1 = 1); image 2: TP 0, FP 0, FN 3 (per-image F1 = 0)
    first = (np.array([[True, False]]), np.array([[True, False]]))
    second = (np.zeros((1, 4), dtype=bool), np.array([[1, 1, 1, 0]]))
    scores = change_scores([first, second])
    # summed: TP 1, FP 0, FN 3, TN 2 -> recall 1/4, F1 2/5, IoU 1/4; the per-image mean F1 would be 0.5
    assert scores["precision"] == 1.0 and scores["recall"] == 0.25
    assert scores["f1"] == pytest.approx(0.4) and scores["iou"] == 0.25 and scores["oa"] == 0.5
    assert scores["pixels"] == 6


def test_agrees_with_upstreams_cm2score_formulas_on_random_masks():
    rng = np.random.default_rng(0)
    pairs = [(rng.random((16, 16)) < 0.3, rng.random((16, 16)) < 0.2) for _ in range(5)]
    hist = np.zeros((2, 2))  # BIT_CD metric_tool.py get_confuse_matrix: rows = truth, columns = prediction
    for predicted, label in pairs:
        hist += np.bincount(2 * label.astype(int).ravel() + predicted.astype(int).ravel(), minlength=4).reshape(2, 2)
    eps = np.finfo(np.float32).eps
    tp = hist[1, 1]
    precision, recall = tp / (hist[:, 1].sum() + eps), tp / (hist[1].sum() + eps)
    scores = change_scores(pairs)
    assert scores["precision"] == pytest.approx(precision) and scores["recall"] == pytest.approx(recall)
    assert scores["f1"] == pytest.approx(2 * recall * precision / (recall + precision + eps))
    assert scores["iou"] == pytest.approx(tp / (hist[1].sum() + hist[:, 1].sum() - tp + eps))
    semantic = ConfusionMatrix(2)  # the project's own segmentation matrix gives the same changed-class IoU
    for predicted, label in pairs:
        semantic.update(label.astype(int), predicted.astype(int))
    assert scores["iou"] == pytest.approx(semantic.per_class_iou()[1])


def test_undefined_ratios_are_none_and_shapes_must_match():
    confusion = ChangeConfusion()
    confusion.add(np.zeros((2, 2)), np.zeros((2, 2)))
    assert confusion.scores() == {"precision": None, "recall": None, "f1": None, "iou": None, "oa": 1.0, "pixels": 4}
    with pytest.raises(MaskShapeError, match=r"predicted change mask is \(2, 3\) but the label is \(2, 2\)"):
        confusion.add(np.zeros((2, 3)), np.zeros((2, 2)))


class BrighterRed:
    """A per-pixel stand-in change model: changed where the after image is brighter in red."""

    change_class = "building"

    def detect(self, before: Image.Image, after: Image.Image) -> np.ndarray:
        return np.asarray(after)[..., 0].astype(int) > np.asarray(before)[..., 0].astype(int)


def test_change_masks_scores_the_tool_on_a_levir_cd_split(tmp_path):
    """`geopilot eval change-masks`' scoring: the tool's `change` segment against each label, one matrix."""
    pairs = change_pairs(seed=3, count=5)  # the fifth has no change: its label is all 0
    write_levir_cd(tmp_path / "LEVIR-CD", pairs)
    records, _ = read_levir_cd(tmp_path / "LEVIR-CD", "train")
    spec = TASKS_BY_NAME["detect_changes"]
    tool = TaskTool(spec, ChangeDetectorAdapter(BrighterRed(), tmp_path / "artifacts"), "stand-in", 10**8)
    scores = score_change_masks(ToolRegistry([tool]), records)
    expected = ChangeConfusion()
    for pair in pairs:
        expected.add(pair.after[..., 0].astype(int) > pair.before[..., 0].astype(int), pair.label)
    assert scores == {**expected.scores(), "pairs": 5, "failed": 0, "failures": []}
    assert 0.0 < scores["f1"] < 1.0 and scores["pixels"] == 5 * 256 * 256
