"""Acc@0.5 for referring detection / grounding, by object size and by single vs multiple targets.

A sample is correct when its predicted polygons match its ground-truth polygons one-to-one at IoU >= 0.5 (the
`>=` of RMSIN): pairs are matched greedily by descending IoU, each polygon used at most once, and the sample counts
only if every ground-truth polygon is matched AND there is no extra prediction (our documented rule for
multi-object samples; GeoChat published none, see its issue #70). For a single target this is plain IoU >= 0.5 with
exactly one box. A missing prediction, an empty one, or a predicted polygon with no area (`DegeneratePolygonError`)
counts as a miss; missing ids are listed. IoU is exact rotated-polygon IoU (`eval.task_metrics.geometry`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from geopilot.eval.task_metrics.coverage import coverage
from geopilot.eval.task_metrics.geometry import DegeneratePolygonError, convex_polygon, intersection_area, signed_area

Polygon = Sequence[Sequence[float]]
THRESHOLD = 0.5
SIZE_GROUPS = ("small", "medium", "large")


def _iou_convex(a, b) -> float:
    inter = intersection_area(a, b)
    union = signed_area(a) + signed_area(b) - inter
    return inter / union if union > 0 else 0.0


def match_polygons(predicted: Sequence[Polygon], truth: Sequence[Polygon], threshold: float = THRESHOLD) -> list[float]:
    """Greedy one-to-one matching; the IoU matched to each ground-truth polygon (0.0 when unmatched)."""
    gts = [convex_polygon(g) for g in truth]
    preds = []
    for p in predicted:
        try:
            preds.append(convex_polygon(p))
        except DegeneratePolygonError:
            preds.append(None)
    pairs = sorted(
        ((_iou_convex(p, g), pi, gi) for pi, p in enumerate(preds) if p is not None for gi, g in enumerate(gts)),
        reverse=True,
    )
    matched = [0.0] * len(gts)
    used_pred: set[int] = set()
    used_gt: set[int] = set()
    for iou, pi, gi in pairs:
        if iou < threshold:
            break
        if pi in used_pred or gi in used_gt:
            continue
        used_pred.add(pi)
        used_gt.add(gi)
        matched[gi] = iou
    return matched


def sample_correct(predicted: Sequence[Polygon], truth: Sequence[Polygon], threshold: float = THRESHOLD) -> bool:
    if not predicted or len(predicted) != len(truth):
        return False
    return all(iou >= threshold for iou in match_polygons(predicted, truth, threshold))


@dataclass
class GroundingResult:
    """Acc@0.5 as fractions: overall, per size group, single vs multiple, per task type (ref / grounding)."""

    overall: float
    by_size: dict[str, float]
    by_count: dict[str, float]
    by_type: dict[str, float]
    counts: dict[str, int]
    total: int
    correct: int
    missing: list[str] = field(default_factory=list)
    correct_ids: set[str] = field(default_factory=set)

    def as_dict(self) -> dict:
        return {
            "Acc@0.5": self.overall,
            "by_size": self.by_size,
            "by_count": self.by_count,
            "by_type": self.by_type,
            "counts": self.counts,
        } | coverage(self.total, self.correct, self.missing)


def acc_at_iou(
    truth: Mapping[str, Sequence[Polygon]],
    predictions: Mapping[str, Sequence[Polygon] | None],
    size_group: Mapping[str, str | None] | None = None,
    task_type: Mapping[str, str | None] | None = None,
    threshold: float = THRESHOLD,
    targets: Mapping[str, str | None] | None = None,
) -> GroundingResult:
    """Acc@threshold over `truth`; `size_group[id]` in small/medium/large, `task_type[id]` e.g. ref/grounding,
    `targets[id]` single/multiple (default: from the number of ground-truth polygons)."""
    groups: dict[str, list[bool]] = {}
    outcomes, missing, correct_ids = [], [], set()
    for item_id, gts in truth.items():
        predicted = predictions.get(item_id)
        if predicted is None:
            missing.append(item_id)
        ok = sample_correct(predicted or [], gts, threshold)
        outcomes.append(ok)
        if ok:
            correct_ids.add(item_id)
        keys = [(targets or {}).get(item_id) or ("single" if len(gts) == 1 else "multiple")]
        if size_group and size_group.get(item_id):
            keys.append(f"size:{size_group[item_id]}")
        if task_type and task_type.get(item_id):
            keys.append(f"type:{task_type[item_id]}")
        for key in keys:
            groups.setdefault(key, []).append(ok)

    def rate(key: str) -> float:
        values = groups.get(key, [])
        return sum(values) / len(values) if values else 0.0

    sizes = [s for s in SIZE_GROUPS if f"size:{s}" in groups] + sorted(
        k[5:] for k in groups if k.startswith("size:") and k[5:] not in SIZE_GROUPS
    )
    return GroundingResult(
        overall=sum(outcomes) / len(outcomes) if outcomes else 0.0,
        by_size={s: rate(f"size:{s}") for s in sizes},
        by_count={k: rate(k) for k in ("single", "multiple") if k in groups},
        by_type={k[5:]: rate(k) for k in sorted(groups) if k.startswith("type:")},
        counts={k: len(v) for k, v in groups.items()},
        total=len(outcomes),
        correct=sum(outcomes),
        missing=missing,
        correct_ids=correct_ids,
    )
