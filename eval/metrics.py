"""Planning metrics (paper §2.4.2, Tables 5-7) from scored result rows, with seed statistics and bootstrap CIs.

Per row (one case x one seed; infra errors excluded):
  TSA  the right tool set: every case (a no-tool case is right when it calls nothing)        numerator tsa, denominator 1
  PA   the right parameters (schema-valid and every param check), given the right tools    tool cases with tsa only
  NTA  no-tool cases that made no call                                                      no-tool cases only
  OPA  the planning decision is right: tsa and pa on tool cases, nta on no-tool cases       every case
A metric over a set of rows is sum(numerators) / sum(denominators); the reported value is the mean over seeds of
the per-seed values, `std` their sample std, and `ci95` a bootstrap CI over cases (geopilot.eval.stats).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable

from geopilot.eval.stats import bootstrap_ci, mean, ratio, std

METRICS = ("TSA", "PA", "NTA", "OPA")
FLAG = {"TSA": "tsa", "PA": "pa", "NTA": "nta", "OPA": "opa"}


def counts(row: dict, metric: str) -> tuple[float, float]:
    """(numerator, denominator) of one scored row for one metric; (0, 0) when the metric does not apply."""
    value = row["score"][FLAG[metric]]
    return (0.0, 0.0) if value is None else (float(bool(value)), 1.0)


def valid(rows: list[dict]) -> list[dict]:
    return [row for row in rows if row["score"]["passed"] is not None]


def per_seed(rows: list[dict], metric: str) -> dict[int, float | None]:
    totals: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for row in valid(rows):
        num, den = counts(row, metric)
        totals[row["seed"]][0] += num
        totals[row["seed"]][1] += den
    return {seed: ratio(num, den) for seed, (num, den) in sorted(totals.items())}


def per_case_counts(rows: list[dict], metric: str) -> tuple[list[str], list[float], list[float]]:
    """Case ids and their (numerator, denominator) averaged over the seeds they have valid rows for."""
    by_case: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in valid(rows):
        by_case[row["case_id"]].append(counts(row, metric))
    ids = sorted(by_case)
    nums = [sum(n for n, _ in by_case[i]) / len(by_case[i]) for i in ids]
    dens = [sum(d for _, d in by_case[i]) / len(by_case[i]) for i in ids]
    return ids, nums, dens


def metric_stats(rows: list[dict], metric: str, with_ci: bool = True) -> dict:
    seeds = per_seed(rows, metric)
    values = [v for v in seeds.values() if v is not None]
    out = {"mean": mean(values), "std": std(values), "per_seed": {str(s): v for s, v in seeds.items()}}
    if with_ci:
        _, nums, dens = per_case_counts(rows, metric)
        out["ci95"] = bootstrap_ci(nums, dens)
    return out


def _grouped(rows: list[dict], key: Callable[[dict], str], order: list[str]) -> dict[str, dict]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        groups[key(row)].append(row)
    out = {}
    for name in order + sorted(set(groups) - set(order)):
        if name not in groups:
            continue
        group = groups[name]
        stats = {metric: metric_stats(group, metric, with_ci=False) for metric in METRICS}
        out[name] = {
            "n": len({row["case_id"] for row in group}),
            **{metric: stats[metric]["mean"] for metric in METRICS},
            "std": {metric: stats[metric]["std"] for metric in METRICS},
        }
    return out


CHAIN_METRICS = ("first_step", "second_step", "both", "answer", "chain")


def chain_breakdown(rows: list[dict]) -> dict | None:
    """Chain suites: the share of rows with each step right, both, the answer right and the whole chain, overall,
    per chain kind and per modality (mean over rows of all seeds; a one-call kind has no second step)."""
    scored = [r for r in valid(rows) if r["score"].get("chain") is not None]
    if not scored:
        return None

    def shares(group: list[dict]) -> dict:
        out = {"n": len({r["case_id"] for r in group})}
        for metric in CHAIN_METRICS:
            values = [r["score"]["chain"][metric] for r in group if r["score"]["chain"][metric] is not None]
            out[metric] = ratio(sum(map(bool, values)), len(values))
        return out

    def by(key: str) -> dict:
        groups: dict[str, list[dict]] = defaultdict(list)
        for row in scored:
            groups[str(row[key])].append(row)
        return {name: shares(group) for name, group in groups.items()}

    return {**shares(scored), "by_kind": by("category"), "by_modality": by("modality")}


def summarise(rows: list[dict], category_order: list[str], difficulty_order: list[str]) -> dict:
    """summary.json: the four metrics (mean over seeds), std, ci95, per-seed values and breakdowns."""
    stats = {metric: metric_stats(rows, metric) for metric in METRICS}
    good = valid(rows)
    seeds = sorted({row["seed"] for row in rows})
    accuracy = [
        ratio(
            sum(1 for r in good if r["seed"] == seed and r["score"]["passed"]),
            sum(1 for r in good if r["seed"] == seed),
        )
        for seed in seeds
    ]
    latencies = sorted(row["run"]["latency_s"] for row in good)
    costs = [row["run"]["cost_usd"] for row in good]
    return {
        **{metric: stats[metric]["mean"] for metric in METRICS},
        "std": {metric: stats[metric]["std"] for metric in METRICS},
        "ci95": {metric: stats[metric]["ci95"] for metric in METRICS},
        "per_seed": {metric: stats[metric]["per_seed"] for metric in METRICS},
        "accuracy": {
            "mean": mean([a for a in accuracy if a is not None]),
            "std": std([a for a in accuracy if a is not None]),
        },
        "by_category": _grouped(rows, lambda r: r["category"], category_order),
        "by_difficulty": _grouped(rows, lambda r: r["difficulty"], difficulty_order),
        "n_cases": len({row["case_id"] for row in rows}),
        "n_rows": len(rows),
        "seeds": seeds,
        "infra_errors": len(rows) - len(good),
        "failures": dict(Counter(row["score"]["category"] for row in rows if row["score"]["category"]).most_common()),
        "dialects": dict(Counter(row["run"]["dialect"] for row in rows).most_common()),
        "latency_s": {
            "mean": mean(latencies),
            "p50": latencies[len(latencies) // 2] if latencies else None,
            "p95": latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))] if latencies else None,
        },
        "tokens": {"in": sum(r["run"]["tokens_in"] for r in good), "out": sum(r["run"]["tokens_out"] for r in good)},
        "cost_usd": sum(costs) if costs and all(c is not None for c in costs) else None,
        **({"chains": chains} if (chains := chain_breakdown(rows)) is not None else {}),
    }
