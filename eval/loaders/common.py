"""The one item type every loader returns, and the loaded-split wrapper with its skip report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from geopilot.errors import GeoPilotInputError
from geopilot.records import ReadReport


class BenchmarkError(GeoPilotInputError):
    """A benchmark root or file that cannot be used at all (missing, unparsable, no items)."""


@dataclass
class EvalItem:
    """One benchmark question. `reference` is the answer string (VQA), the list of reference captions (captioning)
    or the list of ground-truth pixel polygons (referring). `kind` is the question type the scores are split by."""

    id: str
    image: str
    prompt: str
    reference: Any
    kind: str
    modality: str = "optical"
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Loaded:
    name: str
    items: list[EvalItem]
    report: ReadReport = field(default_factory=ReadReport)
    notes: list[str] = field(default_factory=list)  # documented handling applied while loading (repairs, joins)

    def __post_init__(self) -> None:
        if not self.items:
            skipped = ", ".join(f"{k}={v}" for k, v in self.report.skipped.items()) or "nothing found"
            raise BenchmarkError(f"{self.name}: no usable items ({skipped})")
        ids = [item.id for item in self.items]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise BenchmarkError(f"{self.name}: duplicate item id {dup!r}")
        self.report.records = len(self.items)
