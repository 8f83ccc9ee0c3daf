"""VQA accuracy with one documented answer normalisation, per question type, pooled and mean-of-types.

Normalisation (`normalize_answer`): lower case; drop every `.` and all whitespace; strip surrounding quotes and
the punctuation `,;:!?`. This is the rule the community RSVQA scripts use for GeoChat-style answers
(`pred.replace(" ", "").lower().replace(".", "") == gt.lower()`), applied to both sides so that "1234 m2" and
"1234m2" agree. `exact_match` compares normalised strings; `sarlang_match` is SARLANG-1M's rule without its LLM judge:
a yes/no or integer 0-99 reference needs an exact match, any other reference counts when its normalised form is a
substring of the normalised prediction.

A prediction missing for an id scores as wrong and is listed in `missing`; a prediction for an unknown id is listed
in `unexpected` and not scored.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from geopilot.eval.task_metrics.coverage import coverage

_STRIP = "\"'`,;:!?"
_SHORT = re.compile(r"(yes|no|\d{1,2})")


def normalize_answer(text: str) -> str:
    return re.sub(r"\s+", "", text.lower()).replace(".", "").strip(_STRIP)


def exact_match(prediction: str, reference: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(reference)


def sarlang_match(prediction: str, reference: str) -> bool:
    pred, ref = normalize_answer(prediction), normalize_answer(reference)
    if _SHORT.fullmatch(ref):
        return pred == ref
    return bool(ref) and ref in pred


@dataclass
class AccuracyResult:
    """Accuracy as fractions: `per_type[t]`, `pooled` (correct / count over `averaged_types`) and `mean_of_types`
    (the unweighted mean of the per-type accuracies in `averaged_types`)."""

    per_type: dict[str, float]
    counts: dict[str, int]
    averaged_types: list[str]
    pooled: float
    mean_of_types: float
    total: int
    correct: int
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    correct_ids: set[str] = field(default_factory=set)

    def as_dict(self) -> dict:
        return (
            {
                "per_type": self.per_type,
                "counts": self.counts,
                "averaged_types": self.averaged_types,
                "pooled": self.pooled,
                "mean_of_types": self.mean_of_types,
            }
            | coverage(self.total, self.correct, self.missing)
            | {"unexpected": len(self.unexpected)}
        )


def accuracy(
    predictions: Mapping[str, str],
    references: Mapping[str, str],
    types: Mapping[str, str],
    *,
    match: Callable[[str, str], bool] = exact_match,
    averaged_types: list[str] | None = None,
) -> AccuracyResult:
    """Score `predictions[id]` against `references[id]`; `types[id]` groups them. `averaged_types` (default: all
    types present, in first-seen order) are the ones the pooled and mean-of-types averages cover."""
    seen_types = list(dict.fromkeys(types[i] for i in references))
    averaged = [t for t in (averaged_types if averaged_types is not None else seen_types) if t in seen_types]
    right: dict[str, int] = dict.fromkeys(seen_types, 0)
    counts: dict[str, int] = dict.fromkeys(seen_types, 0)
    missing, correct_ids = [], set()
    for item_id, reference in references.items():
        kind = types[item_id]
        counts[kind] += 1
        prediction = predictions.get(item_id)
        if prediction is None:
            missing.append(item_id)
            continue
        if match(prediction, reference):
            right[kind] += 1
            correct_ids.add(item_id)
    per_type = {t: right[t] / counts[t] for t in seen_types}
    pooled_n = sum(counts[t] for t in averaged)
    return AccuracyResult(
        per_type=per_type,
        counts=counts,
        averaged_types=averaged,
        pooled=sum(right[t] for t in averaged) / pooled_n if pooled_n else 0.0,
        mean_of_types=sum(per_type[t] for t in averaged) / len(averaged) if averaged else 0.0,
        total=len(references),
        correct=sum(right.values()),
        missing=missing,
        unexpected=[i for i in predictions if i not in references],
        correct_ids=correct_ids,
    )
