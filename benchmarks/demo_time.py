"""How long `geopilot demo` takes with its default settings, and what it reaches: the wall time of every phase,
the total against the 10-minute target on 2 CPU cores, the held-out planning OPA (target >= 0.85) and the
SAR/optical routing of detection and grounding (target >= 0.95), and the chain suite's chain accuracy with its
breakdowns (first step, second step, both, answer; reported, no target). With `--twice` it runs the demo a second time
into another folder and checks that the same seed gives the same metrics.

    python benchmarks/demo_time.py [--out runs/bench_demo] [--quick] [--seed 0] [--threads N] [--twice] [--json]

The machine's load average and CPU count are printed with the numbers: on a shared machine the time is an upper
bound of what an idle 2-core laptop needs (docs/demo.md has the measured runs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

from output import emit  # benchmarks/output.py (this folder is on sys.path when run as a script)

from geopilot.commands.demo import choose_base
from geopilot.demo.run import read_results, run_demo
from geopilot.demo.settings import BASES, DemoSettings, Layout

TARGET_MINUTES = 10.0  # the default demo, worked examples included
TARGET_OPA = 0.85
TARGET_ROUTING = 0.95


def one_run(out: Path, settings: DemoSettings) -> dict:
    if out.exists():
        shutil.rmtree(out)  # a fresh run every time: a reused folder would time nothing
    load_before = os.getloadavg()
    started = time.perf_counter()
    run_demo(out, settings)
    seconds = time.perf_counter() - started
    results = read_results(Layout(out))
    evaluation = results["evaluate"]
    return {
        "out": str(out),
        "seconds": round(seconds, 1),
        "phases": results["seconds"],
        "load_before": [round(v, 2) for v in load_before],
        "load_after": [round(v, 2) for v in os.getloadavg()],
        "metrics": {k: evaluation[k] for k in ("TSA", "PA", "NTA", "OPA", "by_difficulty", "tsa_by_tool", "routing")},
        "chains": results["chain_eval"],
        "worked_examples": {"right": results["examples"].get("right", 0), "of": len(results["examples"]["examples"])},
    }


def print_text(report: dict) -> None:
    first = report["runs"][0]
    print(
        f"machine: {report['cpus']} CPUs, torch threads {report['torch_threads']}, load average before "
        f"{first['load_before']} after {first['load_after']}"
    )
    for phase, seconds in first["phases"].items():
        print(f"  {phase:<9} {seconds:7.1f} s")
    metrics = first["metrics"]
    print(
        f"total {report['minutes']:.1f} min (target <= {TARGET_MINUTES:g}): {'met' if report['time_target_met'] else 'NOT met'}"
    )
    print(
        f"OPA {metrics['OPA']:.3f} (target >= {TARGET_OPA}): {'met' if report['opa_target_met'] else 'NOT met'}; "
        f"TSA {metrics['TSA']:.3f} PA {metrics['PA']:.3f} NTA {metrics['NTA']:.3f}"
    )
    print(
        f"routing {metrics['routing']['accuracy']:.3f} (target >= {TARGET_ROUTING}): "
        f"{'met' if report['routing_target_met'] else 'NOT met'}"
    )
    chains = first["chains"]
    steps = "  ".join(f"{m} {chains[m]:.3f}" for m in ("first_step", "second_step", "both", "answer"))
    print(f"chains ({chains['cases']} cases): chain accuracy {chains['chain']:.3f}  OPA {chains['OPA']:.3f}  {steps}")
    for kind, group in chains["by_kind"].items():
        print(
            f"  {kind:<24} n={group['n']:<3} first {group['first_step']:.2f}  second {group['second_step']:.2f}  "
            f"chain {group['chain']:.2f}"
        )
    worked = first["worked_examples"]
    print(f"worked examples: {worked['right']} of {worked['of']} answered right")
    if report["same_metrics"] is not None:  # --twice
        print(f"same seed, same metrics: {report['same_metrics']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/bench_demo", help="scratch folder (deleted and rewritten)")
    parser.add_argument("--quick", action="store_true", help="time the --quick preset instead of the default")
    parser.add_argument(
        "--base", choices=BASES, default=None, help="the language model (default: as `geopilot demo` chooses it)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the demo's, 2)")
    parser.add_argument("--twice", action="store_true", help="run again with the same seed and compare the metrics")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    base = choose_base(argparse.Namespace(base=args.base, quick=args.quick, model_family="llava"))
    settings = DemoSettings.preset(args.quick, args.seed, args.threads, base=base)
    runs = [one_run(Path(args.out) / "run1", settings)]
    if args.twice:
        runs.append(one_run(Path(args.out) / "run2", settings))
    first = runs[0]
    report = {
        "cpus": os.cpu_count(),
        "torch_threads": settings.threads,
        "preset": "quick" if args.quick else "default",
        "base": base,
        "runs": runs,
        "minutes": round(first["seconds"] / 60, 2),
        "time_target_met": first["seconds"] / 60 <= TARGET_MINUTES,
        "opa_target_met": (first["metrics"]["OPA"] or 0) >= TARGET_OPA,
        "routing_target_met": first["metrics"]["routing"]["accuracy"] >= TARGET_ROUTING,
        "same_metrics": (runs[0]["metrics"], runs[0]["chains"]) == (runs[1]["metrics"], runs[1]["chains"])
        if args.twice
        else None,
    }
    return emit(report, args.json, lambda: print_text(report))


if __name__ == "__main__":
    raise SystemExit(main())
