"""`geopilot demo --out DIR [--quick] [--base scratch|smollm2] [--model-family F] [--seed N] [--threads N] [--until PHASE] [--json]`: the whole recipe on this machine, with a report.

synth -> generate (template backend) -> stage 1 -> stage 2 (alpha = 0.2) on SmolLM2-135M-Instruct (the `demo` extra;
without it, or with --base scratch or --quick, a small model trained from scratch) ->
planning evaluation on a held-out set -> two sample chats -> worked examples on examples/images/ -> DIR/report.md.
Interrupt it and run the same command again to resume from the last finished phase; a finished DIR is reused, a DIR with other settings is refused.
"""

from __future__ import annotations

import argparse
import json

from geopilot.argtypes import int_in, output_folder
from geopilot.demo.settings import BASES, MAX_THREADS, PHASES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", required=True, type=output_folder, help="the run folder (e.g. runs/demo); rerun to resume"
    )
    parser.add_argument("--quick", action="store_true", help="a reduced run (a few minutes; what the slow tests use)")
    parser.add_argument(
        "--base",
        choices=BASES,
        default=None,
        help="the language model: scratch (a tiny Llama trained from nothing; the default) or smollm2 "
        "(SmolLM2-135M-Instruct from the demo extra, fine-tuned; docs/demo.md)",
    )
    parser.add_argument(
        "--model-family",
        choices=("llava", "qwen2_5_vl"),
        default="llava",
        help="the base trained from scratch: LLaVA-1.5 (default) or Qwen2.5-VL (docs/models.md)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the seed of data, training and evaluation (default 0)")
    parser.add_argument(
        "--threads",
        type=int_in(1, MAX_THREADS),
        default=None,
        help="torch threads (default: 2, or 1 on a 1-CPU machine); use 1 when something else is busy",
    )
    parser.add_argument(
        "--until",
        choices=PHASES,
        default="report",
        help="stop after this phase (e.g. data: what configs/tiny/stage*.yaml train on)",
    )
    parser.add_argument("--json", action="store_true", help="print the metrics as JSON at the end")


def run(args: argparse.Namespace) -> int:
    from geopilot.demo.run import read_results, run_demo
    from geopilot.demo.settings import DemoSettings, Layout

    base = choose_base(args)
    settings = DemoSettings.preset(args.quick, args.seed, args.threads, args.model_family, base)
    report = run_demo(args.out, settings, until=args.until)
    if args.until != "report":
        return 0
    if args.json:
        results = read_results(Layout(args.out))
        print(
            json.dumps(
                {"report": str(report), "evaluate": results["evaluate"], "seconds": results["seconds"]}, indent=1
            )
        )
    else:
        print(report)
    return 0


def choose_base(args: argparse.Namespace) -> str:
    """The language-model base: as asked, else the from-scratch model (SmolLM2 is opt-in until a run of it beats
    the from-scratch model within the demo's budget: docs/demo.md); SmolLM2 that cannot be read here falls back to
    the from-scratch model with one line saying why."""
    import sys

    from geopilot.demo.base_model import BaseUnavailable, gguf_path
    from geopilot.errors import GeoPilotInputError

    base = args.base or "scratch"
    if base == "scratch":
        return base
    if args.model_family != "llava":
        raise GeoPilotInputError(
            f"--base smollm2 builds a LLaVA: it takes --model-family llava, not {args.model_family}"
        )
    try:
        gguf_path()
    except BaseUnavailable as err:
        print(f"geopilot demo: {err}; training the from-scratch model instead (--base scratch)", file=sys.stderr)
        return "scratch"
    return base
