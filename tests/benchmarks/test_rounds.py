"""Benchmarks report the spread of their rounds and never call a target met on rounds that disagree or on a
measurement that contradicts itself (a direct query slower than the tool query: overhead -7.1 s, "target met")."""

from __future__ import annotations

import pytest
from rounds import NOISY, Rounds, judge


def chat_round(**changes) -> dict:
    """One chat_latency round (the keys measure_once returns), consistent unless `changes` say otherwise."""
    r = {
        "answer_turn_reuse_s": 1.0,
        "answer_turn_reprefill_s": 2.2,
        "answer_first_token_reuse_s": 0.25,
        "answer_first_token_reprefill_s": 1.0,
        "direct_query_s": 2.0,
        "tool_query_s": 3.6,
        "tool_time_s": 0.05,
        "think_turn_s": 1.2,
        "answer_turn_s": 1.5,
        "quote_answer_lookup_s": 0.9,
        "quote_answer_reuse_s": 1.3,
        "quote_answer_reprefill_s": 2.5,
        **changes,
    }
    r["answer_turn_speedup"] = r["answer_turn_reprefill_s"] / r["answer_turn_reuse_s"]
    r["answer_first_token_speedup"] = r["answer_first_token_reprefill_s"] / r["answer_first_token_reuse_s"]
    r["tool_overhead_s"] = r["tool_query_s"] - r["tool_time_s"] - r["direct_query_s"]
    r["overhead_over_answer_turn"] = r["tool_overhead_s"] / r["answer_turn_s"]
    r["overhead_per_plan_token_over_answer_per_token"] = (r["tool_overhead_s"] / 53) / (r["answer_turn_s"] / 43)
    r["tool_overhead_without_reuse_s"] = r["tool_overhead_s"] + 0.7
    r["quote_answer_speedup"] = r["quote_answer_reprefill_s"] / r["quote_answer_lookup_s"]
    r["quote_lookup_gain"] = r["quote_answer_reuse_s"] / r["quote_answer_lookup_s"]
    return r


def test_rounds_spread_and_description():
    rounds = Rounds((1.6, 1.66, 1.72))
    assert rounds.median == 1.66 and rounds.spread == pytest.approx(0.12 / 1.66)
    assert rounds.describe() == "1.66x (rounds 1.60x 1.66x 1.72x, spread 7%)"
    assert Rounds((2.0, 2.0)).spread == 0.0 and Rounds((-1.0, 1.0)).spread == float("inf")


def test_verdicts():
    assert str(judge(Rounds((2.3, 2.4, 2.35)), 2.0)) == "met"
    assert str(judge(Rounds((1.6, 1.66, 1.7)), 2.0)) == "NOT met"
    assert str(judge(Rounds((0.9, 1.0, 0.95)), 1.1, higher_is_better=False)) == "met"
    split = judge(Rounds((1.9, 2.05, 2.1)), 2.0)  # the rounds disagree about the target
    assert split.status == NOISY and "2 of 3 rounds meet the target" in str(split)
    wide = judge(Rounds((2.1, 3.0, 4.5)), 2.0)  # all meet it, but 86 % apart
    assert wide.status == NOISY and "spread" in str(wide)
    assert judge(Rounds((2.5,)), 2.0).status == NOISY  # one round: no spread to judge
    assert judge(Rounds((2.3, 2.4)), 2.0, contradictions=["round 1: impossible"]).status == NOISY


def test_chat_latency_never_calls_a_contradiction_met(capsys):
    import chat_latency

    # The reported run: a loaded machine made the direct query slower than the tool query (overhead -7.1 s).
    rounds = [chat_round(), chat_round(direct_query_s=10.65), chat_round()]
    assert rounds[1]["tool_overhead_s"] == pytest.approx(-7.1)
    summary = chat_latency.summarize(rounds)
    assert summary["target_overhead_le_answer_plus_10pct"].startswith(NOISY)
    assert "round 2: the direct query (10.650 s) was not faster" in summary["target_overhead_le_answer_plus_10pct"]
    assert summary["spread"]["overhead_over_answer_turn"]["rounds"] == [r["overhead_over_answer_turn"] for r in rounds]
    report = {
        "device": "cpu",
        "dtype": "float32",
        "repeats": 3,
        "parameters_M": 109.0,
        "image_tokens": 576,
        "prompt_tokens": 650,
        "think_tokens": 53,
        "answer_tokens": 43,
        "answer_turn_prefilled_tokens_reuse": 176,
        "answer_turn_prefilled_tokens_reprefill": 860,
        **summary,
    }
    chat_latency.print_report(report)
    out = capsys.readouterr().out
    assert "target <= 1.10x" in out and NOISY in out and "(rounds " in out and "spread" in out

    slower_tools = {"tool_query_s": 3.9}  # overhead 1.85 s = 1.23x the answer turn, in every round
    steady = chat_latency.summarize(
        [
            chat_round(**slower_tools),
            chat_round(answer_turn_reprefill_s=2.3, **slower_tools),
            chat_round(**slower_tools),
        ]
    )
    assert steady["target_speedup_2x"] == "met" and steady["target_overhead_le_answer_plus_10pct"] == "NOT met"
    slow_reuse = chat_latency.summarize([chat_round(answer_first_token_reuse_s=1.2), chat_round(), chat_round()])
    assert slow_reuse["target_speedup_2x"].startswith(NOISY)


def test_train_throughput_ratio_is_per_round():
    import train_throughput

    def epoch(mode, rate, fraction):
        return {
            "mode": mode,
            "batches": 24,
            "tokens_processed": 1000,
            "tokens_useful": int(1000 * fraction),
            "useful_fraction": fraction,
            "seconds": 1000 / rate,
            "useful_tokens_per_s": rate,
            "processed_tokens_per_s": rate / fraction,
        }

    runs = {
        "llava_random_padded": [epoch("llava_random_padded", r, 0.55) for r in (100, 50, 100)],
        "geopilot_length_grouped": [epoch("geopilot_length_grouped", r, 0.97) for r in (170, 85, 160)],
    }
    summary = train_throughput.summarize(runs)  # the host halved both modes' speed in round 2: ratios still agree
    assert summary["throughput_ratio"]["rounds"] == [1.7, 1.7, 1.6]
    assert summary["target_throughput_ratio"] == "met" and summary["target_useful_fraction"] == "met"
    runs["geopilot_length_grouped"][1] = epoch("geopilot_length_grouped", 60, 0.97)  # round 2 says 1.2x
    assert train_throughput.summarize(runs)["target_throughput_ratio"].startswith(NOISY)


def test_gen_throughput_speedup_is_per_round_and_bounded_by_concurrency():
    import gen_throughput

    rounds = [{1: 2.4, 8: 17.9, 32: 69.0}, {1: 2.0, 8: 15.0, 32: 58.0}, {1: 2.5, 8: 18.5, 32: 72.0}]
    rows = {row["concurrency"]: row for row in gen_throughput.summarize(rounds)}
    assert rows[1]["verdict"] is None and rows[8]["verdict"] == "met" and rows[32]["verdict"] == "met"
    assert rows[32]["speedup"]["rounds"] == pytest.approx([69.0 / 2.4, 29.0, 72.0 / 2.5])
    rounds[1][8] = 80.0  # 40x at concurrency 8: more than linear, the serial run was slowed by something else
    assert "more than linear" in gen_throughput.summarize(rounds)[1]["verdict"]
