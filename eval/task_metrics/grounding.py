"""Acc@0.5 for referring detection / grounding, by object size, single vs multiple targets and task type.

Predicted and ground-truth polygons are paired one-to-one at IoU >= 0.5 (the `>=` of RMSIN), greedily by descending
IoU, each polygon used at most once. Two protocols score the pairing (docs/eval_tasks.md compares them):
- `per_object` (default): every ground-truth object is one trial, found when a predicted box is paired with it;
  Acc@0.5 = objects found / objects, pooled over the split, extra boxes cost nothing. GeoChat published no scorer
  (mbzuai-oryx/GeoChat: `geochat/eval/` only writes answers; issues #32 and #70 unanswered); of the readings of
  "acc@0.5" this one moves the overall, multi-object and [grounding] columns the way its paper's differ from
  `all_or_nothing` on GeoChat-7B's answers (overall down, the other two up).
- `all_or_nothing`: every sample is one trial, right only when every target is paired AND no box is left over
  (gRefCOCO's Pr(F1=1, IoU>=0.5)); for a single target this is plain IoU >= 0.5 with exactly one box.
A missing prediction, an empty one, or a predicted polygon with no area (`DegeneratePolygonError`) finds nothing;
missing ids are listed. IoU is exact rotated-polygon IoU (`geopilot.polygons`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from geopilot.eval.task_metrics.coverage import coverage
from geopilot.polygons import DegeneratePolygonError, convex_polygon, intersection_area, signed_area

Polygon = Sequence[Sequence[float]]
THRESHOLD = 0.5
SIZE_GROUPS = ("small", "medium", "large")
PROTOCOLS = ("per_object", "all_or_nothing")
DEFAULT_PROTOCOL = "per_object"


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


def objects_found(predicted: Sequence[Polygon], truth: Sequence[Polygon], threshold: float = THRESHOLD) -> int:
    """How many ground-truth polygons a distinct predicted polygon is paired with at IoU >= threshold."""
    return sum(iou >= threshold for iou in match_polygons(predicted, truth, threshold)) if predicted else 0


def trials(predicted: Sequence[Polygon], truth: Sequence[Polygon], protocol: str, threshold: float) -> tuple[int, int]:
    """(right, out of) for one sample under `protocol`."""
    if protocol == "per_object":
        return objects_found(predicted, truth, threshold), len(truth)
    return int(sample_correct(predicted, truth, threshold)), 1


@dataclass
class GroundingResult:
    """Acc@0.5 as fractions: overall, per size group, single vs multiple, per task type (ref / grounding)."""

    overall: float
    by_size: dict[str, float]
    by_count: dict[str, float]
    by_type: dict[str, float]
    counts: dict[str, int]  # samples per split
    total: int  # samples
    correct: int  # samples right under the protocol (per_object: every target found)
    protocol: str = DEFAULT_PROTOCOL
    objects: int = 0  # ground-truth objects
    found: int = 0  # of them, paired with a predicted box
    missing: list[str] = field(default_factory=list)
    correct_ids: set[str] = field(default_factory=set)

    def as_dict(self) -> dict:
        return {
            "Acc@0.5": self.overall,
            "protocol": self.protocol,
            "by_size": self.by_size,
            "by_count": self.by_count,
            "by_type": self.by_type,
            "counts": self.counts,
            "objects": self.objects,
            "objects_found": self.found,
        } | coverage(self.total, self.correct, self.missing)


def acc_at_iou(
    truth: Mapping[str, Sequence[Polygon]],
    predictions: Mapping[str, Sequence[Polygon] | None],
    size_group: Mapping[str, str | None] | None = None,
    task_type: Mapping[str, str | None] | None = None,
    threshold: float = THRESHOLD,
    targets: Mapping[str, str | None] | None = None,
    protocol: str = DEFAULT_PROTOCOL,
) -> GroundingResult:
    """Acc@threshold over `truth` under `protocol` (`PROTOCOLS`); `size_group[id]` in small/medium/large,
    `task_type[id]` e.g. ref/grounding, `targets[id]` single/multiple (default: from the number of ground-truth
    polygons)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown Acc@0.5 protocol {protocol!r}; choose from {', '.join(PROTOCOLS)}")
    groups: dict[str, list[tuple[int, int]]] = {}
    outcomes, missing, correct_ids = [], [], set()
    objects = found = 0
    for item_id, gts in truth.items():
        predicted = predictions.get(item_id)
        if predicted is None:
            missing.append(item_id)
        ok = trials(predicted or [], gts, protocol, threshold)
        outcomes.append(ok)
        objects, found = objects + len(gts), found + objects_found(predicted or [], gts, threshold)
        if ok[0] == ok[1]:  # right under the protocol: every target found (and, all-or-nothing, no box left over)
            correct_ids.add(item_id)
        keys = [(targets or {}).get(item_id) or ("single" if len(gts) == 1 else "multiple")]
        if size_group and size_group.get(item_id):
            keys.append(f"size:{size_group[item_id]}")
        if task_type and task_type.get(item_id):
            keys.append(f"type:{task_type[item_id]}")
        for key in keys:
            groups.setdefault(key, []).append(ok)

    def rate(key: str) -> float:
        return _pooled(groups.get(key, []))

    sizes = [s for s in SIZE_GROUPS if f"size:{s}" in groups] + sorted(
        k[5:] for k in groups if k.startswith("size:") and k[5:] not in SIZE_GROUPS
    )
    return GroundingResult(
        overall=_pooled(outcomes),
        by_size={s: rate(f"size:{s}") for s in sizes},
        by_count={k: rate(k) for k in ("single", "multiple") if k in groups},
        by_type={k[5:]: rate(k) for k in sorted(groups) if k.startswith("type:")},
        counts={k: len(v) for k, v in groups.items()},
        total=len(outcomes),
        correct=len(correct_ids),
        protocol=protocol,
        objects=objects,
        found=found,
        missing=missing,
        correct_ids=correct_ids,
    )


def _pooled(outcomes: list[tuple[int, int]]) -> float:
    out_of = sum(n for _, n in outcomes)
    return sum(right for right, _ in outcomes) / out_of if out_of else 0.0
