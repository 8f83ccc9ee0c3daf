"""A run's results log, `DIR/results.jsonl`: one scored (case, seed) row a line, appended by
geopilot.eval.runner and read back by it and by the reports (geopilot.eval.benchmark_report)."""

from __future__ import annotations

from pathlib import Path

from geopilot.fileio import iter_jsonl

RESULTS = "results.jsonl"


def read_rows(path: Path) -> list[dict]:
    """The rows of a results log; a line cut off by a kill is skipped (it is re-run)."""
    return [row for _, row in iter_jsonl(path, "skip") if "case_id" in row and "seed" in row]
