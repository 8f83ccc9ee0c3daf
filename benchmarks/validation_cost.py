"""The cost of validation during training, as a fraction of training time, from one run of the recipe.

One tiny stage-1 run (in-process `geopilot.commands.train.train`, the recipe with its planning probe) with a held-out file and evaluations every
`--every` steps; from its metrics.jsonl: the seconds of one training step (data + forward/backward + optimizer, the
logged time split), the seconds of one evaluation (`time/eval_s`), the fraction this run spent evaluating, and the
fraction at the default `eval.every_steps` (one evaluation per that many steps).

    python benchmarks/validation_cost.py [--steps 12] [--every 4] [--held-out 16] [--planning-cases 0] [--json]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from output import emit  # benchmarks/output.py (this folder is on sys.path when run as a script)

from geopilot.commands.train import train
from geopilot.data_gen.synthetic.samples import write_demo_dataset
from geopilot.eval.cases import load_cases
from geopilot.eval.planning_set import PLANNING_FILE
from geopilot.training.config import EvalConfig, load_train_config
from geopilot.training.tracking import read_metrics

ROOT = Path(__file__).resolve().parents[1]


def measure(steps: int, every: int, held_out: int, planning_cases: int, samples: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = write_demo_dataset(tmp / "train", optical=samples, sar=samples // 2, seed=0)
        eval_file = write_demo_dataset(tmp / "heldout", optical=held_out // 2, sar=held_out - held_out // 2, seed=9)
        overrides = [
            f"output_dir={tmp / 'run'}",
            f"data.files=[{data}]",
            f"data.eval_files=[{eval_file}]",
            f"optim.max_steps={steps}",
            "optim.epochs=100",
            "optim.global_batch_size=4",
            "optim.per_device_batch_size=4",
            f"eval.every_steps={every}",
            "checkpoint.save_steps=100000",
            "logging.logging_steps=1",
            "logging.tensorboard=false",
            "logging.progress_bar=false",
            "logging.log_sample_ids=false",
        ]
        if planning_cases:
            planning = load_cases(PLANNING_FILE)
            cases = tmp / "cases.jsonl"
            cases.write_text(
                "".join(
                    c.model_copy(update={"image": str(planning.image_path(c))}).model_dump_json() + "\n"
                    for c in planning.cases[:planning_cases]
                )
            )
            overrides += [f"eval.planning_cases={cases}", "eval.planning_max_new_tokens=32"]
        cfg = load_train_config(ROOT / "configs/tiny/stage1.yaml", overrides)
        assert train(cfg) == 0
        rows = read_metrics(tmp / "run")
    step_s = [r["time/data_s"] + r["time/forward_backward_s"] + r["time/optimizer_s"] for r in rows[1:]]  # 1st: warm-up
    eval_s = [r["time/eval_s"] for r in rows if "time/eval_s" in r]
    per_step, per_eval = statistics.median(step_s), statistics.median(eval_s)
    default_every = EvalConfig().every_steps
    return {
        "steps": steps,
        "every_steps": every,
        "held_out_samples": held_out,
        "planning_cases": planning_cases,
        "step_s": per_step,
        "eval_s": per_eval,
        "evaluations": len(eval_s),
        "fraction_this_run": sum(eval_s) / (per_step * steps),
        "default_every_steps": default_every,
        "fraction_at_default": per_eval / (per_step * default_every),
    }


def print_text(result: dict, args: argparse.Namespace) -> None:
    print(
        f"one training step {result['step_s']:.3f} s; one evaluation ({args.held_out} held-out samples, "
        f"{args.planning_cases} planning cases) {result['eval_s']:.3f} s"
    )
    print(
        f"this run (every {args.every} steps): {100 * result['fraction_this_run']:.1f}% of training time; "
        f"at the default eval.every_steps={result['default_every_steps']}: {100 * result['fraction_at_default']:.2f}%"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--held-out", type=int, default=16, help="held-out samples")
    parser.add_argument("--planning-cases", type=int, default=0, help="planning cases per evaluation (0: loss only)")
    parser.add_argument("--samples", type=int, default=48, help="optical training samples (+ half as many SAR)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = measure(args.steps, args.every, args.held_out, args.planning_cases, args.samples)
    return emit(result, args.json, lambda: print_text(result, args))


if __name__ == "__main__":
    raise SystemExit(main())
