"""What every per-item task result reports besides its metrics: items scored, items right, predictions missing."""

from __future__ import annotations

MISSING_SHOWN = 20  # ids of missing predictions a result lists (the count is always whole)


def coverage(total: int, correct: int, missing: list[str]) -> dict:
    return {"total": total, "correct": correct, "missing": len(missing), "missing_ids": missing[:MISSING_SHOWN]}
