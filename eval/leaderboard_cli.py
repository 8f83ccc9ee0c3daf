"""`geopilot eval leaderboard DIR1 DIR2 ...`: the runs side by side (Tables 5-7), sorted by OPA, with paired
bootstrap 95 % CIs of each run's difference to the best over their common cases."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from geopilot.eval.benchmark_report import compare, plot


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", help="run folders written by `geopilot eval planning --out`")
    parser.add_argument("--out", help="also write leaderboard.md and leaderboard.png into this folder")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")


def run(args: argparse.Namespace) -> int:
    from geopilot.eval.benchmark_report import load_run

    markdown, data = compare(args.runs)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "leaderboard.md").write_text(markdown, encoding="utf-8")
        names = {entry["folder"]: entry["name"] for entry in data["runs"]}
        plot([(names[str(folder)], load_run(folder)[0]) for folder in args.runs], out / "leaderboard.png")
    print(json.dumps(data, indent=1) if args.json else markdown)
    return 0
