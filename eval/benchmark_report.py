"""Reports of runs: per-case CSV, summary.json, the leaderboard in the layouts of the paper's Tables 5-7, a PNG,
and the comparison of several run folders (`geopilot eval leaderboard DIR1 DIR2 ...`) with paired bootstrap CIs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from geopilot.errors import GeoPilotInputError
from geopilot.eval.metrics import METRICS, per_case_counts
from geopilot.eval.results_log import RESULTS, read_rows
from geopilot.eval.stats import paired_difference_ci

CSV_COLUMNS = [
    "case_id",
    "seed",
    "category",
    "difficulty",
    "modality",
    "dialect",
    "passed",
    "failure",
    "failures",
    "TSA",
    "PA",
    "NTA",
    "OPA",
    "tools_called",
    "rounds",
    "latency_s",
    "tokens_in",
    "tokens_out",
    "cost_usd",
    "infra_error",
]


def _flag(value) -> str:
    return "" if value is None else str(int(bool(value)))


def write_cases_csv(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_COLUMNS)
        for row in sorted(rows, key=lambda r: (r["case_id"], r["seed"])):
            run, sc = row["run"], row["score"]
            writer.writerow(
                [
                    row["case_id"],
                    row["seed"],
                    row["category"],
                    row["difficulty"],
                    row["modality"],
                    run["dialect"],
                    _flag(sc["passed"]),
                    sc["category"] or "",
                    ";".join(sc["categories"]),
                    _flag(sc["tsa"]),
                    _flag(sc["pa"]),
                    _flag(sc["nta"]),
                    _flag(sc["opa"]),
                    ";".join(c["tool"] for c in run["calls"]),
                    run["rounds"],
                    f"{run['latency_s']:.4f}",
                    run["tokens_in"],
                    run["tokens_out"],
                    "" if run["cost_usd"] is None else run["cost_usd"],
                    run["infra_error"] or "",
                ]
            )


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def pm(value: float | None, spread: float | None) -> str:
    return pct(value) if value is None or not spread else f"{100 * value:.1f} ± {100 * spread:.1f}"


def ci(bounds: list[float] | None) -> str:
    return "–" if not bounds else f"[{100 * bounds[0]:.1f}, {100 * bounds[1]:.1f}]"


def _breakdown(
    runs: list[tuple[str, dict]], title: str, head: str, breakdown: str, keys, metric: str, row_title
) -> list[str]:
    """A table section, one row per key of a summary breakdown ("by_difficulty": "easy", ...): the key's case count
    and every run's `metric` on it."""
    names = [name for name, _ in runs]
    lines = ["", f"## {title}", "", f"| {head} | " + " | ".join(names) + " |", "|---|---" + "|---" * len(names) + "|"]
    for key in keys:
        n = next((s[breakdown][key]["n"] for _, s in runs if key in s[breakdown]), 0)
        cells = [pct(s[breakdown].get(key, {}).get(metric)) for _, s in runs]
        lines.append(f"| {row_title(key)} | {n} | " + " | ".join(cells) + " |")
    return lines


def leaderboard_markdown(runs: list[tuple[str, dict]]) -> str:
    """Table 5 (TSA/PA/NTA/OPA per model), Table 6 (TSA per tool category), Table 7 (OPA per difficulty)."""
    from geopilot.eval.planning_set import CATEGORY_TITLES

    lines = [
        "## Planning (Table 5)",
        "",
        "mean ± std over seeds (%), 95 % bootstrap CI over cases in brackets",
        "",
        "| Model | TSA | PA | NTA | OPA | OPA 95 % CI | seeds | infra errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in runs:
        cells = [pm(s[m], s["std"][m]) for m in METRICS]
        lines.append(
            f"| {name} | "
            + " | ".join(cells)
            + f" | {ci(s['ci95']['OPA'])} | {len(s['seeds'])} | {s['infra_errors']} |"
        )
    categories = list(dict.fromkeys(c for _, s in runs for c in s["by_category"]))
    lines += _breakdown(
        runs,
        "Tool Selection Accuracy by tool category (Table 6)",
        "Tool Category | # Samples",
        "by_category",
        categories,
        "TSA",
        row_title=lambda category: CATEGORY_TITLES.get(category, category),
    )
    lines.append(f"| Overall TSA | {runs[0][1]['n_cases']} | " + " | ".join(pct(s["TSA"]) for _, s in runs) + " |")
    lines += _breakdown(
        runs,
        "Overall planning accuracy by difficulty (Table 7)",
        "Difficulty | # Queries",
        "by_difficulty",
        ("easy", "medium", "hard"),
        "OPA",
        row_title=str.capitalize,
    )
    lines += [
        "",
        "## Failures (first failing check) and cost",
        "",
        "| Model | failures | dialects | latency p50 (s) | tokens in/out | cost (USD) |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in runs:
        failures = ", ".join(f"{k} {v}" for k, v in s["failures"].items()) or "none"
        dialects = ", ".join(f"{k} {v}" for k, v in s["dialects"].items())
        p50 = s["latency_s"]["p50"]
        cost = "–" if s["cost_usd"] is None else f"{s['cost_usd']:.4f}"
        lines.append(
            f"| {name} | {failures} | {dialects} | {'–' if p50 is None else f'{p50:.3f}'} | "
            f"{s['tokens']['in']}/{s['tokens']['out']} | {cost} |"
        )
    return "\n".join(lines) + "\n"


def plot(runs: list[tuple[str, dict]], path: Path) -> None:
    """Grouped bars of the four metrics per run: mean ± std over seeds, the bootstrap CI as a thin line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2.0 + 1.6 * len(METRICS), 3.6), dpi=120)
    width = 0.8 / len(runs)
    for i, (name, s) in enumerate(runs):
        xs = [m + (i - (len(runs) - 1) / 2) * width for m in range(len(METRICS))]
        means = [100 * (s[m] or 0.0) for m in METRICS]
        stds = [100 * (s["std"][m] or 0.0) for m in METRICS]
        ax.bar(xs, means, width * 0.9, yerr=stds, capsize=3, label=name)
        for x, m in zip(xs, METRICS, strict=True):
            if s["ci95"][m]:
                ax.vlines(x, 100 * s["ci95"][m][0], 100 * s["ci95"][m][1], colors="black", linewidth=0.8)
    ax.set_xticks(range(len(METRICS)), METRICS)
    ax.set_ylim(0, 105)
    ax.set_ylabel("%")
    ax.set_title("GeoPilotBench planning: mean ± std over seeds, 95 % bootstrap CI")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_reports(out: Path, rows: list[dict], summary: dict) -> None:
    write_cases_csv(rows, out / "cases.csv")
    (out / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    runs = [(summary["agent"], summary)]
    (out / "leaderboard.md").write_text(leaderboard_markdown(runs), encoding="utf-8")
    plot(runs, out / "leaderboard.png")


def load_run(folder: str | Path) -> tuple[dict, list[dict]]:
    folder = Path(folder)
    summary_path = folder / "summary.json"
    if not summary_path.is_file():
        raise GeoPilotInputError(f"{str(folder)!r} has no summary.json; run `geopilot eval planning ... --out` into it")
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    seeds = set(summary["seeds"])
    rows = [row for row in read_rows(folder / RESULTS) if row["seed"] in seeds]
    return summary, rows


def compare(folders: list[str | Path]) -> tuple[str, dict]:
    """The leaderboard of several runs (sorted by OPA), with paired bootstrap CIs of each run minus the best."""
    names: dict[str, int] = {}
    runs = []
    for folder in folders:
        summary, rows = load_run(folder)
        name = summary["agent"]
        names[name] = names.get(name, 0) + 1
        runs.append((name if names[name] == 1 else f"{name} ({folder})", str(folder), summary, rows))
    runs.sort(key=lambda r: -(r[2]["OPA"] or 0.0))
    best_name, _, best_summary, best_rows = runs[0]
    differences = {}
    lines = [
        "",
        f"## Paired differences to {best_name} (95 % bootstrap CI over common cases, 2000 resamples)",
        "",
        "| Model | " + " | ".join(f"Δ{m}" for m in METRICS) + " |",
        "|---|" + "---|" * len(METRICS),
    ]
    for name, _, summary, rows in runs[1:]:
        cells, differences[name] = [], {}
        for metric in METRICS:
            ids_a, num_a, den_a = per_case_counts(rows, metric)
            ids_b, num_b, den_b = per_case_counts(best_rows, metric)
            common = sorted(set(ids_a) & set(ids_b))
            a = ([num_a[ids_a.index(i)] for i in common], [den_a[ids_a.index(i)] for i in common])
            b = ([num_b[ids_b.index(i)] for i in common], [den_b[ids_b.index(i)] for i in common])
            diff = paired_difference_ci(a, b)
            point = (
                None
                if summary[metric] is None or best_summary[metric] is None
                else summary[metric] - best_summary[metric]
            )
            differences[name][metric] = {"difference": point, "ci95": diff}
            cells.append(f"{'–' if point is None else f'{100 * point:+.1f}'} {ci(diff)}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    table = leaderboard_markdown([(name, summary) for name, _, summary, _ in runs])
    data = {
        "runs": [{"name": n, "folder": f, **{m: s[m] for m in METRICS}} for n, f, s, _ in runs],
        "differences": differences,
    }
    return table + ("\n".join(lines) + "\n" if len(runs) > 1 else ""), data
