"""The two-stage curriculum's data selection (paper §3): stage 1 = optical, stage 2 = SAR + optical replay.

Stage 2 keeps every SAR sample and adds a seeded random sample, without replacement, of round(alpha * |optical|)
optical samples (round half up). The same seed always picks the same samples; the picked ids are in the report.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field


def replay_count(alpha: float, num_optical: int) -> int:
    """round(alpha * |optical|), half rounded up (Python's `round` would round 2.5 to 2)."""
    return min(num_optical, math.floor(alpha * num_optical + 0.5))


@dataclass
class Mixture:
    """Indices (into the candidate list) chosen for one stage, and the counts that produced them."""

    stage: int
    indices: list[int]
    alpha: float
    seed: int
    available: dict[str, int] = field(default_factory=dict)  # per modality, before selection
    selected: dict[str, int] = field(default_factory=dict)  # per modality, after selection

    def summary(self) -> dict:
        return {
            "stage": self.stage,
            "alpha": self.alpha,
            "mixture_seed": self.seed,
            "available": self.available,
            "selected": self.selected,
            "total": len(self.indices),
        }


def select_stage(modalities: list[str], stage: int, alpha: float, seed: int) -> Mixture:
    """`modalities[i]` is sample i's modality -> the sorted indices that stage trains on."""
    optical = [i for i, m in enumerate(modalities) if m == "optical"]
    sar = [i for i, m in enumerate(modalities) if m == "sar"]
    available = {"optical": len(optical), "sar": len(sar)}
    if stage == 1:
        chosen = optical
    else:
        replay = random.Random(seed).sample(optical, replay_count(alpha, len(optical)))
        chosen = sorted(sar + replay)
    selected = Counter(modalities[i] for i in chosen)
    return Mixture(stage, chosen, alpha, seed, available, {m: selected.get(m, 0) for m in ("optical", "sar")})
