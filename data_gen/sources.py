"""Reading one source of a generation config, with nothing silent (issue 31 item 3).

A source whose root is unusable, or that yields no records, is a `SourceError` (exit 2) naming the layouts the
reader looks for and the first entries found under the root; a source whose skip rate is above
`max_skip_fraction` is one too, with the skips by cause. `geopilot generate` and `geopilot generate check` both read
their sources here, so a source that passes `generate check` passes `generate`.

Skip rate = skipped items / (skipped items + records + objects kept): readers count a skipped record (missing
image) and a skipped object (bad polygon) alike, so both kinds of kept item are in the denominator.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from geopilot.data_gen.readers.common import DatasetRootError, root_entries
from geopilot.errors import GeoPilotInputError
from geopilot.records import AnnotationRecord, ReadReport


class SourceError(GeoPilotInputError):
    """A source `generate` would fail on: unusable root, no records, or too many skipped items."""


@dataclass
class SourceRead:
    reader: str
    root: Path
    records: list[AnnotationRecord]
    report: ReadReport

    @property
    def skip_rate(self) -> float:
        skipped = sum(self.report.skipped.values())
        kept = len(self.records) + sum(len(r.objects) for r in self.records)
        return skipped / (skipped + kept) if skipped + kept else 0.0


def skips_line(report: ReadReport) -> str:
    """`missing_image 3, bad_polygon 1 (e.g. P0002.txt: image ... not found)`, or `none`."""
    if not report.skipped:
        return "none"
    causes = sorted(report.skipped.items(), key=lambda kv: -kv[1])
    first = (report.examples.get(causes[0][0]) or [""])[0]
    return ", ".join(f"{cause} {n}" for cause, n in causes) + (f" (e.g. {first[:160]})" if first else "")


def _where(root: Path, layouts: tuple[str, ...]) -> str:
    looked = " | ".join(layouts) if layouts else "(see docs/datasets.md)"
    return f"layouts looked for: {looked}; found under {root}: {root_entries(root)}"


def read_source(
    reader: str, root: Path, options: dict, readers: dict, layouts: dict, max_skip_fraction: float
) -> SourceRead:
    """Run one reader; SourceError (one line) when the source would give `generate` nothing or mostly skips."""
    root = Path(root)
    try:
        records, report = readers[reader](root, **options)
    except DatasetRootError as err:
        raise SourceError(f"source {reader}: {err}; {_where(root, layouts.get(reader, ()))}") from None
    except TypeError as err:  # an option the reader does not take
        raise SourceError(f"source {reader}: bad options {options}: {err}") from None
    read = SourceRead(reader, root, records, report)
    if not records:
        raise SourceError(
            f"source {reader} ({root}): no records (skipped: {skips_line(report)}); "
            f"{_where(root, layouts.get(reader, ()))}"
        )
    if read.skip_rate > max_skip_fraction:
        raise SourceError(
            f"source {reader} ({root}): {100 * read.skip_rate:.1f}% of its items skipped, above "
            f"max_skip_fraction {max_skip_fraction}: {skips_line(report)}"
        )
    return read
