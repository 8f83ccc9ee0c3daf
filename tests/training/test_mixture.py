"""Stage mixtures: stage 1 = optical; stage 2 = all SAR + round(alpha * |optical|) seeded, distinct optical samples."""

from __future__ import annotations

import pytest

from geopilot.training.mixture import replay_count, select_stage

MODALITIES = ["optical"] * 50 + ["sar"] * 20 + ["optical"] * 27  # 77 optical, 20 SAR, interleaved by file order


def optical_picked(mixture) -> set[int]:
    return {i for i in mixture.indices if MODALITIES[i] == "optical"}


@pytest.mark.parametrize("alpha, expected", [(0.2, 15), (0.5, 39), (0.0, 0), (1.0, 77), (0.1, 8)])
def test_stage2_has_exactly_all_sar_plus_rounded_replay(alpha, expected):
    mixture = select_stage(MODALITIES, stage=2, alpha=alpha, seed=0)
    assert expected == replay_count(alpha, 77)
    assert len(mixture.indices) == 20 + expected
    assert len(set(mixture.indices)) == len(mixture.indices)  # no duplicates
    assert mixture.selected == {"optical": expected, "sar": 20}
    assert {i for i, m in enumerate(MODALITIES) if m == "sar"} <= set(mixture.indices)


def test_round_half_up():
    assert replay_count(0.5, 5) == 3  # 2.5 -> 3 (Python's round would give 2)
    assert replay_count(0.25, 10) == 3  # 2.5 -> 3


def test_same_seed_same_set_other_seed_different():
    first = select_stage(MODALITIES, 2, 0.2, seed=7)
    again = select_stage(MODALITIES, 2, 0.2, seed=7)
    other = select_stage(MODALITIES, 2, 0.2, seed=8)
    assert first.indices == again.indices
    assert optical_picked(first) != optical_picked(other)
    assert len(other.indices) == len(first.indices)


def test_alpha_one_replays_every_optical_sample_and_alpha_zero_none():
    assert select_stage(MODALITIES, 2, 1.0, 0).indices == list(range(len(MODALITIES)))
    assert optical_picked(select_stage(MODALITIES, 2, 0.0, 0)) == set()


def test_stage1_is_optical_only():
    mixture = select_stage(MODALITIES, 1, 0.2, 0)
    assert mixture.selected == {"optical": 77, "sar": 0}
    assert mixture.summary()["available"] == {"optical": 77, "sar": 20}
