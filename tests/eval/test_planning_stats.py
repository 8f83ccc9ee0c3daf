"""Statistics against hand-computed values: mean, sample std, bootstrap CIs with a fixed seed, and the metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest

from geopilot.eval.metrics import summarise
from geopilot.eval.stats import bootstrap_ci, mean, paired_difference_ci, std


def test_mean_and_sample_std_by_hand():
    # per-seed OPA 0.90, 0.92, 0.97: mean 0.93; deviations -0.03, -0.01, 0.04 -> (9+1+16)e-4 / 2 = 13e-4
    assert mean([0.90, 0.92, 0.97]) == pytest.approx(0.93)
    assert std([0.90, 0.92, 0.97]) == pytest.approx(math.sqrt(13e-4))
    assert std([0.5]) == 0.0 and mean([]) is None and std([]) is None


def test_bootstrap_all_equal_and_two_case_enumeration():
    assert bootstrap_ci([1.0] * 10, [1.0] * 10) == [1.0, 1.0]
    # two cases, one right: resampled means are 0, 0.5, 1 with p = 1/4, 1/2, 1/4 -> the 2.5 / 97.5 percentiles are 0, 1
    assert bootstrap_ci([1.0, 0.0], [1.0, 1.0]) == [0.0, 1.0]


def test_bootstrap_fixed_seed_matches_a_hand_written_resample():
    values = [1, 0, 1, 1, 0, 1, 1, 1, 0, 1]
    idx = np.random.default_rng(0).integers(0, 10, size=(2000, 10))
    by_hand = np.percentile(np.asarray(values, dtype=float)[idx].mean(axis=1), [2.5, 97.5])
    assert bootstrap_ci(values, [1] * 10) == pytest.approx(list(by_hand))
    assert bootstrap_ci(values, [1] * 10) == [0.4, 1.0]  # frozen: the seed fixes the draws


def test_bootstrap_agrees_with_the_normal_approximation():
    rng = np.random.default_rng(3)
    values = list((rng.random(400) < 0.5).astype(float))
    p = sum(values) / 400
    half = 1.96 * math.sqrt(p * (1 - p) / 400)
    low, high = bootstrap_ci(values, [1.0] * 400)
    assert low == pytest.approx(p - half, abs=0.01) and high == pytest.approx(p + half, abs=0.01)


def test_bootstrap_of_a_ratio_metric_ignores_cases_outside_the_denominator():
    # PA-like: cases 3 and 4 do not count (den 0); over the rest 2 of 2 are right -> always 1
    assert bootstrap_ci([1, 1, 0, 0], [1, 1, 0, 0]) == [1.0, 1.0]


def test_paired_difference_ci():
    a = ([1.0] * 20, [1.0] * 20)
    assert paired_difference_ci(a, a) == [0.0, 0.0]  # the same draws for both: no spurious spread
    b = ([1.0] * 10 + [0.0] * 10, [1.0] * 20)
    low, high = paired_difference_ci(a, b)
    assert 0.25 < low < 0.5 < high < 0.75


def row(case_id, seed, category, difficulty, tsa, pa, nta, opa, passed=True):
    return {
        "case_id": case_id,
        "seed": seed,
        "category": category,
        "difficulty": difficulty,
        "score": {"tsa": tsa, "pa": pa, "nta": nta, "opa": opa, "passed": passed, "category": None},
        "run": {"latency_s": 0.1, "cost_usd": None, "tokens_in": 1, "tokens_out": 1, "dialect": "text"},
    }


def test_metrics_by_hand():
    rows = []
    for seed, outcomes in ((1, (True, True, True)), (2, (True, False, False))):
        rows += [
            row("a", seed, "od", "easy", True, outcomes[1], None, outcomes[1]),  # tool case, right tool
            row("b", seed, "od", "hard", outcomes[2], True if outcomes[2] else None, None, outcomes[2]),
            row("n", seed, "no_tool", "easy", True, None, True, True),
        ]
    rows.append({**row("x", 1, "od", "easy", None, None, None, None, passed=None)})  # infra error: excluded
    s = summarise(rows, ["od", "no_tool"], ["easy", "medium", "hard"])
    # seed 1: TSA 3/3, PA 2/2, NTA 1/1, OPA 3/3; seed 2: TSA 2/3, PA 0/1, NTA 1/1, OPA 1/3
    assert s["per_seed"]["TSA"] == {"1": 1.0, "2": pytest.approx(2 / 3)}
    assert s["TSA"] == pytest.approx(5 / 6) and s["PA"] == pytest.approx(0.5) and s["NTA"] == 1.0
    assert s["OPA"] == pytest.approx(2 / 3)
    assert s["std"]["PA"] == pytest.approx(math.sqrt(0.5))
    assert s["by_category"]["od"]["TSA"] == pytest.approx(0.75) and s["by_category"]["od"]["n"] == 3
    assert s["by_difficulty"]["hard"]["OPA"] == pytest.approx(0.5) and "medium" not in s["by_difficulty"]
    assert s["infra_errors"] == 1 and s["n_cases"] == 4
