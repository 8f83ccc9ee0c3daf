"""The optical-replay ablation (paper Table 14): stage 2 trained from ONE stage-1 export for each alpha, each model
evaluated on SAR VQA (OI / IC / OC / OP, SAR Avg) and optical VQA (RSVQA-HRBEN), written as a table and a plot.

    geopilot ablate-alpha --config configs/ablate_alpha.yaml   (configs/tiny/ablate_alpha.yaml on CPU)

Each alpha trains with `<launcher or python> -m geopilot.commands.train --config <stage2_config> model.init=llava_hf
model.llava_path=<stage1> data.replay_alpha=<a> output_dir=<out>/alpha_<a>/train <overrides>` (a subprocess, so the
launcher can be torchrun); a run whose `export/` already exists is not retrained, and the evaluations resume from
their predictions files, so re-running the command after a crash finishes the grid. SAR Avg is the mean of the four
SAR VQA type accuracies (the paper's "average over the four subtasks"); HRBEN Avg is the pooled accuracy over
presence + comparison questions. Output: `<out>/ablate_alpha.md`, `ablate_alpha.png`, `ablate_alpha.json`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from pydantic import Field

from geopilot.config import StrictConfig, load_config
from geopilot.errors import GeoPilotInputError
from geopilot.eval.loaders.sarlang import SAR_TYPES

PAPER_ALPHAS = [0.0, 0.1, 0.2, 0.3, 0.5]


class AblateAlphaConfig(StrictConfig):
    stage1: str  # the stage-1 export every alpha starts from (llava-hf directory)
    stage2_config: str  # train.py YAML for stage 2 (configs/stage2.yaml, configs/tiny/stage2.yaml)
    sar_vqa: str  # SARLANG-1M root (SARVQA1_test)
    optical_vqa: str  # RSVQA-HR root (test set 2)
    out: str
    alphas: list[float] = Field(default_factory=lambda: list(PAPER_ALPHAS), min_length=1)
    overrides: list[str] = []  # extra train.py key=value overrides, applied to every alpha
    launcher: list[str] = []  # e.g. [torchrun, --nproc_per_node, "8"]; empty = this Python
    batch_size: int = Field(default=8, ge=1)
    max_new_tokens: int = Field(default=64, ge=1)
    device: str = "auto"


def _tag(alpha: float) -> str:
    return f"alpha_{alpha:g}"


def _train_overrides(cfg: AblateAlphaConfig, alpha: float) -> list[str]:
    run_dir = Path(cfg.out) / _tag(alpha) / "train"
    return [
        "model.init=llava_hf",
        f"model.llava_path={cfg.stage1}",
        f"data.replay_alpha={alpha}",
        f"output_dir={run_dir}",
    ]


def train_alpha(cfg: AblateAlphaConfig, alpha: float) -> Path:
    """Train stage 2 with this alpha (unless its export exists); the export directory."""
    run_dir = Path(cfg.out) / _tag(alpha) / "train"
    export = run_dir / "export"
    if (export / "config.json").is_file():
        return export
    command = [*cfg.launcher] if cfg.launcher else [sys.executable]
    command += [
        "-m",  # python -m and torchrun -m both run the recipe as a module (train.py is the same recipe)
        "geopilot.commands.train",
        "--config",
        cfg.stage2_config,
        *_train_overrides(cfg, alpha),
        *cfg.overrides,
    ]
    done = subprocess.run(command, check=False)
    if done.returncode != 0 or not (export / "config.json").is_file():
        raise GeoPilotInputError(
            f"stage-2 training for alpha={alpha:g} failed (exit {done.returncode}): {' '.join(command)}"
        )
    return export


def evaluate_alpha(cfg: AblateAlphaConfig, alpha: float, export: Path) -> dict:
    from geopilot import GeoPilot
    from geopilot.eval.benchmark_tasks import run_task

    pilot = GeoPilot.from_pretrained(export, device=cfg.device)
    generation = {"max_new_tokens": cfg.max_new_tokens}
    base = Path(cfg.out) / _tag(alpha)
    sar = run_task("sar-vqa", pilot, cfg.sar_vqa, base / "sar-vqa", cfg.batch_size, generation=generation)
    hr = run_task("rsvqa-hr", pilot, cfg.optical_vqa, base / "rsvqa-hr", cfg.batch_size, generation=generation)
    return {
        "alpha": alpha,
        **{t: sar["per_type"].get(t) for t in SAR_TYPES},
        "SAR Avg": sar["mean_of_types"],
        "HRBEN Avg": hr["pooled"],
    }


def write_table(rows: list[dict], out: Path) -> tuple[Path, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def cell(value) -> str:
        return "–" if value is None else f"{100 * value:.2f}"

    columns = [*SAR_TYPES, "SAR Avg", "HRBEN Avg"]
    lines = [
        "# Optical replay ratio α (Table 14)",
        "",
        "| Multi-Stage | α | " + " | ".join(columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    best = max(rows, key=lambda r: r["SAR Avg"] or 0.0)
    for row in rows:
        mark = " **(best SAR Avg)**" if row is best else ""
        lines.append(f"| ✓ | {100 * row['alpha']:g}%{mark} | " + " | ".join(cell(row[c]) for c in columns) + " |")
    lines += [
        "",
        "SAR Avg: mean of the OI/IC/OC/OP accuracies; HRBEN Avg: pooled accuracy over presence + comparison.",
        "",
        "![alpha ablation](ablate_alpha.png)",
        "",
    ]
    table = out / "ablate_alpha.md"
    table.write_text("\n".join(lines), encoding="utf-8")
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
    alphas = [100 * r["alpha"] for r in rows]
    ax.plot(alphas, [100 * (r["SAR Avg"] or 0) for r in rows], "o-", label="SAR Avg", color="#b5542f")
    ax.plot(alphas, [100 * (r["HRBEN Avg"] or 0) for r in rows], "s-", label="HRBEN Avg", color="#3b6ea8")
    ax.set_xlabel("optical replay α (%)")
    ax.set_ylabel("accuracy (%)")
    ax.set_xticks(alphas)
    ax.legend(fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    plot = out / "ablate_alpha.png"
    fig.savefig(plot)
    plt.close(fig)
    return table, plot


def check_inputs(cfg: AblateAlphaConfig) -> None:
    """Everything the grid reads, before the first alpha trains for hours: the stage-1 export, the stage-2 config and
    both benchmarks (loaded, and not empty). Each problem is one line naming the setting."""
    from geopilot.eval.benchmark_tasks import TASKS
    from geopilot.training.config import load_train_config

    if not (Path(cfg.stage1) / "config.json").is_file():
        raise GeoPilotInputError(f"stage1: {cfg.stage1} is not a model export (no config.json)")
    try:  # with what the first alpha's run will be given
        load_train_config(cfg.stage2_config, [*_train_overrides(cfg, cfg.alphas[0]), *cfg.overrides])
    except GeoPilotInputError as err:
        raise GeoPilotInputError(f"stage2_config: {err}") from None
    for key, task in (("sar_vqa", "sar-vqa"), ("optical_vqa", "rsvqa-hr")):
        try:
            loaded = TASKS[task].load(Path(getattr(cfg, key)))
        except GeoPilotInputError as err:
            raise GeoPilotInputError(f"{key}: {err}") from None
        if not loaded.items:
            raise GeoPilotInputError(f"{key}: {getattr(cfg, key)} holds no {task} questions")


def ablate_alpha(cfg: AblateAlphaConfig) -> list[dict]:
    out = Path(cfg.out)
    check_inputs(cfg)
    out.mkdir(parents=True, exist_ok=True)
    rows = [evaluate_alpha(cfg, alpha, train_alpha(cfg, alpha)) for alpha in cfg.alphas]
    (out / "ablate_alpha.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    write_table(rows, out)
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="ablation YAML (AblateAlphaConfig; docs/eval_tasks.md)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. 'alphas=[0,0.2]' out=runs/ab")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")


def run(args: argparse.Namespace) -> int:
    cfg = load_config(AblateAlphaConfig, args.config, args.overrides)
    rows = ablate_alpha(cfg)
    print(json.dumps(rows) if args.json else f"wrote {Path(cfg.out) / 'ablate_alpha.md'} and ablate_alpha.png")
    return 0
