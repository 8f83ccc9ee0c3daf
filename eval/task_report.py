"""Markdown + PNG reports of the benchmark tasks (`report.md`, `<name>.png`); numbers shown as percentages with two
decimals, as in the paper's tables (metrics.json keeps fractions)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.2f}"


def bar_plot(path: Path, title: str, labels: list[str], values: list[float], ylabel: str = "%") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(labels) + 2), 3.2), dpi=120)
    bars = ax.bar(labels, [100 * v for v in values], color="#3b6ea8")
    ax.bar_label(bars, fmt="%.1f", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, max(100.0, *(100 * v for v in values)) * 1.08 if values else 100)
    ax.set_title(title, fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _rows(metrics: dict) -> tuple[list[str], list[tuple[str, ...]], list[str], list[float]]:
    """(header, rows, plot labels, plot values) for any task's metrics."""
    if "per_type" in metrics:  # VQA
        rows = [(t, str(metrics["counts"][t]), pct(a)) for t, a in metrics["per_type"].items()]
        averaged = "/".join(metrics["averaged_types"])
        rows.append((f"**Average, pooled** ({averaged})", "", pct(metrics["pooled"])))
        rows.append((f"**Average, mean of types** ({averaged})", "", pct(metrics["mean_of_types"])))
        labels = list(metrics["per_type"])
        return ["question type", "n", "accuracy (%)"], rows, labels, [metrics["per_type"][t] for t in labels]
    if "Acc@0.5" in metrics:  # referring: the default protocol, then the others on the same predictions
        runs = [metrics, *metrics.get("alternatives", {}).values()]
        groups = {**metrics["by_size"], **metrics["by_count"]}
        counts = metrics["counts"]
        rows = [
            (
                k.capitalize(),
                str(counts.get(f"size:{k}", counts.get(k, ""))),
                *(pct(r["by_size"].get(k, r["by_count"].get(k, 0.0))) for r in runs),
            )
            for k in groups
        ]
        rows += [
            (f"type {k}", str(counts.get(f"type:{k}", "")), *(pct(r["by_type"][k]) for r in runs))
            for k in metrics["by_type"]
        ]
        rows.append(("**All**", str(metrics["total"]), *(pct(r["Acc@0.5"]) for r in runs)))
        protocols = [metrics.get("protocol", ""), *metrics.get("alternatives", {})]
        header = ["split", "n (samples)", *(f"Acc@0.5 (%) {name}".strip() for name in protocols)]
        return header, rows, [k.capitalize() for k in groups], list(groups.values())
    keys = ["BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr"]
    rows = [(k, str(metrics.get("total", "")), pct(metrics[k])) for k in keys]
    return ["metric", "n", "score (x100)"], rows, keys, [metrics[k] for k in keys]


def write_task_report(name: str, metrics: dict, out_dir: Path) -> Path:
    header, rows, labels, values = _rows(metrics)
    lines = [f"# {name}", ""]
    data = metrics.get("data", {})
    if data:
        skipped = ", ".join(f"{k}: {v}" for k, v in data.get("skipped", {}).items()) or "none"
        lines += [f"Benchmark {data.get('benchmark')}: {data.get('items')} items; skipped while loading: {skipped}."]
        lines += [f"- {note}" for note in data.get("notes", [])]
        lines.append("")
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines.append("")
    if metrics.get("missing"):
        lines.append(f"**{metrics['missing']} item(s) had no prediction and were scored as wrong.**")
    if data.get("errors"):
        lines.append(f"{data['errors']} item(s) failed on input (unreadable image) and were scored as wrong.")
    if metrics.get("tokenizer"):
        lines.append(f"Caption tokenisation: `{metrics['tokenizer']}` (docs/eval_tasks.md).")
    plot = out_dir / f"{name}.png"
    bar_plot(plot, name, labels, values)
    lines += ["", f"![{name}]({plot.name})", ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def write_e2e_report(result: dict, out_dir: Path) -> Path:
    """Table 13 style: task, metric, standalone tool, GeoPilot, gap; plus a grouped bar plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [
        "# End-to-end tool tasks",
        "",
        "| Task | Metric | Standalone Tool | GeoPilot | Gap |",
        "|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        gap = f"{100 * row['gap']:+.2f}".replace("-", "−")
        lines.append(f"| {row['task']} | {row['metric']} | {pct(row['standalone'])} | {pct(row['geopilot'])} | {gap} |")
    lines += [
        "",
        "Standalone: the tool called directly with the ground-truth parameters; GeoPilot: the model chose "
        "the tool and its parameters (no call, or another tool, predicts nothing).",
        "",
    ]
    fig, ax = plt.subplots(figsize=(5.5, 3.2), dpi=120)
    x = np.arange(len(result["rows"]))
    for offset, side, colour in ((-0.2, "standalone", "#9aa5b1"), (0.2, "geopilot", "#3b6ea8")):
        bars = ax.bar(x + offset, [100 * r[side] for r in result["rows"]], 0.4, label=side, color=colour)
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
    ax.set_xticks(x, [f"{r['task']}\n({r['metric']})" for r in result["rows"]], fontsize=8)
    ax.set_ylim(0, 105)
    ax.legend(fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    fig.savefig(out_dir / "tools-e2e.png")
    plt.close(fig)
    lines += ["![tools-e2e](tools-e2e.png)", ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
