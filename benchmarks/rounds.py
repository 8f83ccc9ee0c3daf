"""Rounds, their spread, and a verdict that never calls a target met on a measurement that contradicts itself.

Every benchmark measures both sides of a comparison in the same round, `--repeats` rounds, and judges the
per-round ratios. A target verdict is one of:

- "met" / "NOT met": every round agrees (all meet it, or none does), the rounds' relative spread
  (max - min) / median is at most `max_spread`, and no round contradicts itself;
- "noisy, rerun": the rounds disagree about the target, or spread more than `max_spread`, or a round broke a
  physical invariant (a tool query faster than a direct one, a speed-up beyond the concurrency): the machine's
  load decided the number, not the code. Rerun on a quieter machine or with more `--repeats`.
Fewer than two rounds give no spread to judge: "noisy, rerun (1 round)".
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

MAX_SPREAD = 0.25  # relative (max - min) / median of the per-round values beyond which the rounds disagree
NOISY = "noisy, rerun"


@dataclass(frozen=True)
class Rounds:
    """Per-round values of one quantity (usually a ratio measured within each round)."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def spread(self) -> float:
        """(max - min) / |median|: 0 for identical rounds; inf when the median is 0 and the rounds differ."""
        width = max(self.values) - min(self.values)
        if width == 0:
            return 0.0
        return width / abs(self.median) if self.median else float("inf")

    def describe(self, unit: str = "x", digits: int = 2) -> str:
        """`1.66x (rounds 1.60x 1.66x 1.71x, spread 7%)`."""
        each = " ".join(f"{v:.{digits}f}{unit}" for v in self.values)
        return f"{self.median:.{digits}f}{unit} (rounds {each}, spread {self.spread:.0%})"

    def as_dict(self) -> dict:
        values = list(self.values)
        return {"median": self.median, "min": min(values), "max": max(values), "spread": self.spread, "rounds": values}


@dataclass(frozen=True)
class Verdict:
    status: str  # "met", "NOT met" or NOISY
    reasons: tuple[str, ...] = field(default=())

    @property
    def met(self) -> bool:
        return self.status == "met"

    def __str__(self) -> str:
        return f"{self.status} ({'; '.join(self.reasons)})" if self.reasons else self.status


def judge(
    rounds: Rounds,
    target: float,
    higher_is_better: bool = True,
    max_spread: float = MAX_SPREAD,
    contradictions: Sequence[str] = (),
) -> Verdict:
    """The verdict on `rounds` against `target` (>= target when higher is better, else <=). `contradictions` are
    the per-round invariant violations the caller found, each a short sentence naming the round."""
    reasons = list(contradictions)
    if len(rounds.values) < 2:
        reasons.append(f"{len(rounds.values)} round")
    passed = [(v >= target) if higher_is_better else (v <= target) for v in rounds.values]
    if any(passed) and not all(passed):
        reasons.append(f"{sum(passed)} of {len(passed)} rounds meet the target")
    if rounds.spread > max_spread:
        reasons.append(f"rounds spread {rounds.spread:.0%} > {max_spread:.0%}")
    if reasons:
        return Verdict(NOISY, tuple(reasons))
    return Verdict("met" if all(passed) else "NOT met")
