"""Change-detection scores of the changed class, as the BIT and LEVIR-CD papers report them: precision, recall, F1
and IoU of "changed" (and overall accuracy), from ONE confusion matrix summed over every pixel of the split, never a
mean of per-image scores (BIT_CD `misc/metric_tool.py`: `ConfuseMatrixMeter` sums `get_confuse_matrix` over the
batches, `cm2score` reads `precision_1`, `recall_1`, `F1_1`, `iou_1` off the sum).

    confusion = ChangeConfusion()
    for predicted, label in pairs:          # (H, W) masks: bool, 0/1 or LEVIR-CD's 0/255; nonzero = changed
        confusion.add(predicted, label)
    confusion.scores()  # {"precision", "recall", "f1", "iou", "oa", "pixels"}

precision = TP / (TP + FP), recall = TP / (TP + FN), F1 = 2 TP / (2 TP + FP + FN) (= 2PR / (P + R)),
IoU = TP / (TP + FP + FN), OA = (TP + TN) / pixels. Upstream adds a float32 epsilon to each denominator, so an
undefined ratio reads 0 there; here it is None (no changed pixel predicted, or none in the labels). Masks of
different shapes raise `MaskShapeError` (never resized).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from geopilot.eval.task_metrics.segmentation import MaskShapeError


def _ratio(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


@dataclass
class ChangeConfusion:
    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0

    def add(self, predicted: np.ndarray, label: np.ndarray) -> None:
        predicted, label = np.asarray(predicted) != 0, np.asarray(label) != 0
        if predicted.shape != label.shape:
            raise MaskShapeError(
                f"predicted change mask is {tuple(predicted.shape)} but the label is {tuple(label.shape)}"
            )
        tp = int(np.count_nonzero(predicted & label))
        fp, fn = int(np.count_nonzero(predicted)) - tp, int(np.count_nonzero(label)) - tp
        self.tp, self.fp, self.fn = self.tp + tp, self.fp + fp, self.fn + fn
        self.tn += label.size - tp - fp - fn

    def scores(self) -> dict[str, float | int | None]:
        tp, fp, fn = self.tp, self.fp, self.fn
        pixels = tp + fp + fn + self.tn
        return {
            "precision": _ratio(tp, tp + fp),
            "recall": _ratio(tp, tp + fn),
            "f1": _ratio(2 * tp, 2 * tp + fp + fn),
            "iou": _ratio(tp, tp + fp + fn),
            "oa": _ratio(tp + self.tn, pixels),
            "pixels": pixels,
        }


def change_scores(pairs: Iterable[tuple[np.ndarray, np.ndarray]]) -> dict[str, float | int | None]:
    """`ChangeConfusion.scores()` of (predicted, label) mask pairs, accumulated over all of them."""
    confusion = ChangeConfusion()
    for predicted, label in pairs:
        confusion.add(predicted, label)
    return confusion.scores()
