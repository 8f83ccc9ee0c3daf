"""DIR/report.md and its plots: loss curves per stage, per-tool TSA, OPA by difficulty, the two sample chats."""

from __future__ import annotations

import json
from pathlib import Path

from geopilot.demo.settings import DemoSettings, Layout
from geopilot.fileio import atomic_write

BLUE, RUST, GREY = "#3b6ea8", "#b5542f", "#8a8a8a"


def _figure(width: float = 5.5, height: float = 3.2):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height), dpi=120)
    ax.spines[["top", "right"]].set_visible(False)
    return plt, fig, ax


def plot_losses(results: dict, path: Path) -> None:
    plt, fig, ax = _figure()
    offset = 0
    for stage, colour in (("stage1", BLUE), ("stage2", RUST)):
        losses = results[stage]["losses"]
        if losses:
            ax.plot(
                [offset + s for s, _ in losses],
                [v for _, v in losses],
                color=colour,
                lw=1.2,
                label=f"{stage[:-1]} {stage[-1]}",
            )
            offset += losses[-1][0]
    ax.set_yscale("log")
    ax.set_xlabel("optimizer step (stage 2 continues stage 1)")
    ax.set_ylabel("training loss (assistant tokens)")
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_bars(values: dict[str, float], path: Path, ylabel: str, colour: str = BLUE) -> None:
    plt, fig, ax = _figure(max(4.0, 0.6 * len(values) + 1.5))
    names = list(values)
    ax.bar(range(len(names)), [100 * values[n] for n in names], color=colour, width=0.65)
    for i, name in enumerate(names):
        ax.text(i, 100 * values[name] + 1, f"{100 * values[name]:.0f}", ha="center", fontsize=7, color=GREY)
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
    ax.set_ylim(0, 108)
    ax.set_ylabel(ylabel)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def write_report(layout: Layout, settings: DemoSettings, results: dict) -> Path:
    layout.plots.mkdir(parents=True, exist_ok=True)
    evaluation = results["evaluate"]
    plot_losses(results, layout.plots / "loss.png")
    plot_bars(evaluation["tsa_by_tool"], layout.plots / "tsa_by_tool.png", "TSA (%)")
    plot_bars(evaluation["by_difficulty"], layout.plots / "opa_by_difficulty.png", "OPA (%)", RUST)
    data, routing = results["data"], evaluation["routing"]
    seconds = results.get("seconds", {})
    lines = [
        "# GeoPilot demo",
        "",
        f"The whole recipe on this machine: {settings.optical} optical + {settings.sar} SAR synthetic scenes -> "
        f"{data['samples']} tool-trace samples (template backend; {data['optical']} optical, {data['sar']} SAR) -> "
        f"stage 1 ({results['stage1']['steps']} steps) -> stage 2 with alpha = {settings.alpha:g} "
        f"({results['stage2']['steps']} steps) -> planning evaluation -> two chats. Seed {settings.seed}; "
        f"settings fingerprint `{settings.fingerprint()}` (`demo.json`). The model is `model/` "
        "(`GeoPilot.from_pretrained('model')`, `geopilot chat --model model ...`).",
        "",
        "## Planning (held-out)",
        "",
        f"{evaluation['cases']} cases drawn (stratified by category, difficulty and modality) from the 500-case "
        "planning set that `eval/planning_set.py` builds over the same synthetic images; its query templates are "
        "written apart from data_gen's training templates. Scored by the deterministic scorer "
        "(`eval/run/`: results.jsonl, cases.csv, leaderboard.md).",
        "",
        "| TSA | PA | NTA | OPA | SAR/optical routing |",
        "|---|---|---|---|---|",
        f"| {_pct(evaluation['TSA'])} | {_pct(evaluation['PA'])} | {_pct(evaluation['NTA'])} | "
        f"**{_pct(evaluation['OPA'])}** | {_pct(routing['accuracy'])} |",
        "",
        f"Routing: of the cases that expect a detection or grounding tool, the share that called one of the image's "
        f"modality and none of the other's (optical {routing['correct']['optical']}/{routing['total']['optical']}, "
        f"SAR {routing['correct']['sar']}/{routing['total']['sar']}).",
        "",
        "OPA by category: " + ", ".join(f"{k} {_pct(v)}" for k, v in evaluation["by_category"].items()) + ".",
        "",
        "![TSA per tool](plots/tsa_by_tool.png) ![OPA by difficulty](plots/opa_by_difficulty.png)",
        "",
        "## Training",
        "",
        f"A LLaVA-1.5-shaped model trained from scratch: CLIP-style vision tower ({settings.model.vision_layers} layers, "
        f"width {settings.model.vision_hidden}, {settings.model.image_size} px, trainable), a 2-layer GELU projector and a "
        f"Llama decoder ({settings.model.text_layers} layers, width {settings.model.text_hidden}), with its own "
        f"{data['vocab']}-token BPE trained on the traces. Final loss: stage 1 "
        f"{results['stage1']['final_loss']:.4f}, stage 2 {results['stage2']['final_loss']:.4f}.",
        "",
        "![loss curves](plots/loss.png)",
        "",
        "## Sample chats (annotation-backed tools: the tool outputs are the scenes' ground truth)",
        "",
    ]
    for chat in results["chats"]["chats"]:
        calls = ", ".join(f"`{c['tool']}({json.dumps(c['params'])})`" for c in chat["tool_calls"]) or "none"
        lines += [
            f"**{chat['modality']}** — *{chat['query']}*",
            "",
            f"- plan: `{chat['plan']}`",
            f"- tool calls: {calls}",
            f"- answer: {chat['answer']}",
            "",
            f"![{chat['modality']} chat](chats/{chat['picture']})",
            "",
        ]
    if seconds:
        lines += ["## Time", "", "| phase | seconds |", "|---|---|"]
        lines += [f"| {phase} | {value:.0f} |" for phase, value in seconds.items()]
        lines.append("")
    atomic_write(layout.report, "\n".join(lines))
    return layout.report
