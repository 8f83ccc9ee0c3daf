"""Semantic segmentation mIoU from one confusion matrix accumulated over the whole split, and oIoU / mIoU for
referring masks.

`ConfusionMatrix(num_classes, ignore=(0,))` accumulates label maps image by image: ground-truth pixels whose value is
in `ignore` are skipped; a predicted value outside [0, num_classes) ("no prediction", e.g. -1 where no class was
segmented) counts as a false negative of the true class and a false positive of none. IoU_c = TP / (TP + FP + FN);
a class absent from both ground truth and prediction gets NaN and is left out of the mean; ignored classes are never
in the mean. Masks of different shapes raise `MaskShapeError` (never silently resized).

Referring masks (`referring_mask_scores`): oIoU = sum(I) / sum(U) over samples; mIoU = the mean of per-sample IoU,
where a sample whose predicted and true masks are both empty has IoU 1; Pr@t = share of samples with IoU >= t.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


class MaskShapeError(ValueError):
    """A predicted mask whose height x width differs from the ground truth's."""


def _same_shape(truth: np.ndarray, predicted: np.ndarray, what: str = "mask") -> None:
    if truth.shape != predicted.shape:
        raise MaskShapeError(
            f"predicted {what} is {tuple(predicted.shape)} but the ground truth is {tuple(truth.shape)}"
        )


class ConfusionMatrix:
    def __init__(self, num_classes: int, ignore: Sequence[int] = (), class_names: Sequence[str] | None = None):
        if num_classes < 1:
            raise ValueError("num_classes must be >= 1")
        self.num_classes, self.ignore = num_classes, tuple(ignore)
        self.class_names = list(class_names) if class_names is not None else [str(c) for c in range(num_classes)]
        self.matrix = np.zeros((num_classes, num_classes + 1), dtype=np.int64)  # last column: no prediction

    def update(self, truth: np.ndarray, predicted: np.ndarray) -> None:
        truth, predicted = np.asarray(truth), np.asarray(predicted)
        _same_shape(truth, predicted, "label map")
        keep = ~np.isin(truth, self.ignore) if self.ignore else np.ones(truth.shape, dtype=bool)
        t, p = truth[keep].astype(np.int64), predicted[keep].astype(np.int64)
        if t.size and (t.min() < 0 or t.max() >= self.num_classes):
            raise ValueError(f"ground-truth label outside [0, {self.num_classes}) that is not ignored")
        p = np.where((p >= 0) & (p < self.num_classes), p, self.num_classes)
        k = self.num_classes + 1
        self.matrix += np.bincount(t * k + p, minlength=self.num_classes * k).reshape(self.num_classes, k)

    def per_class_iou(self) -> np.ndarray:
        square = self.matrix[:, : self.num_classes]
        tp = np.diag(square).astype(np.float64)
        fp = square.sum(axis=0) - tp
        fn = self.matrix.sum(axis=1) - tp
        denominator = tp + fp + fn
        with np.errstate(invalid="ignore", divide="ignore"):
            iou = np.where(denominator > 0, tp / np.maximum(denominator, 1), np.nan)
        for c in self.ignore:
            if 0 <= c < self.num_classes:
                iou[c] = np.nan
        return iou

    def miou(self) -> float:
        iou = self.per_class_iou()
        return float(np.nanmean(iou)) if np.any(~np.isnan(iou)) else 0.0

    def as_dict(self) -> dict:
        iou = self.per_class_iou()
        return {
            "mIoU": self.miou(),
            "per_class_iou": {
                name: (None if np.isnan(v) else float(v))
                for c, (name, v) in enumerate(zip(self.class_names, iou, strict=True))
                if c not in self.ignore
            },
            "pixels": int(self.matrix.sum()),
        }


def referring_mask_scores(
    pairs: Iterable[tuple[np.ndarray, np.ndarray]], thresholds: Sequence[float] = (0.5, 0.6, 0.7, 0.8, 0.9)
) -> dict[str, float]:
    """`pairs` of (true mask, predicted mask) booleans -> oIoU, mIoU and Pr@t as fractions."""
    inter_total = union_total = 0
    ious = []
    for truth, predicted in pairs:
        truth, predicted = np.asarray(truth, dtype=bool), np.asarray(predicted, dtype=bool)
        _same_shape(truth, predicted)
        inter, union = int(np.logical_and(truth, predicted).sum()), int(np.logical_or(truth, predicted).sum())
        inter_total, union_total = inter_total + inter, union_total + union
        ious.append(inter / union if union else 1.0)
    if not ious:
        raise ValueError("no masks to score")
    out = {"oIoU": inter_total / union_total if union_total else 1.0, "mIoU": float(np.mean(ious))}
    out.update({f"Pr@{t:g}": float(np.mean([v >= t for v in ious])) for t in thresholds})
    return out
