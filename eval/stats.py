"""Statistics of a run: mean and sample std over seeds, and paired bootstrap 95 % CIs over cases.

A metric is a ratio of per-case counts (`num / den`: e.g. PA counts only tool cases with the right tools), so
a resample is scored as sum(num) / sum(den) over the resampled cases. The resample indices depend only on the
number of cases and the seed, so two runs over the same cases are resampled identically (paired): the CI of
their difference comes from the same draws.
"""

from __future__ import annotations

import statistics

import numpy as np

RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def std(values: list[float]) -> float | None:
    """Sample standard deviation (n - 1); 0.0 for a single value."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return statistics.stdev(values) if len(values) > 1 else 0.0  # exact arithmetic: equal values give 0.0


def ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def resample_indices(n: int, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """(resamples, n) case indices drawn with replacement; the same for every run with n cases."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def bootstrap_ci(
    num: list[float], den: list[float], resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED, level: float = 0.95
) -> list[float] | None:
    """Percentile CI of sum(num)/sum(den) over cases resampled with replacement (resamples with den 0 dropped)."""
    if not num or not sum(den):
        return None
    idx = resample_indices(len(num), resamples, seed)
    nums, dens = np.asarray(num, dtype=float)[idx].sum(axis=1), np.asarray(den, dtype=float)[idx].sum(axis=1)
    values = nums[dens > 0] / dens[dens > 0]
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return [float(low), float(high)]


def paired_difference_ci(
    a: tuple[list[float], list[float]],
    b: tuple[list[float], list[float]],
    resamples: int = RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = 0.95,
) -> list[float] | None:
    """CI of metric(a) - metric(b) over the same cases, both resampled with the same indices."""
    (num_a, den_a), (num_b, den_b) = a, b
    if len(num_a) != len(num_b) or not num_a:
        return None
    idx = resample_indices(len(num_a), resamples, seed)

    def metric(num, den):
        n, d = np.asarray(num, dtype=float)[idx].sum(axis=1), np.asarray(den, dtype=float)[idx].sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return n / d

    diff = metric(num_a, den_a) - metric(num_b, den_b)
    diff = diff[np.isfinite(diff)]
    if diff.size == 0:
        return None
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(diff, [tail, 100 - tail])
    return [float(low), float(high)]
