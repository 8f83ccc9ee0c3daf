"""`geopilot eval build-planning --images DIR --out FILE`: the planning set over other images (same queries).

DIR holds optical/, cloudy/ and sar/ image folders, or is a `geopilot synth --out DIR` folder. With the shipped
images (geopilot/eval/data/planning_images) it reproduces the frozen planning_v1.jsonl byte for byte.
"""

from __future__ import annotations

import argparse
import json

from geopilot.eval.planning_set import write_planning


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--images", required=True, help="folder with optical/, cloudy/, sar/ (or a geopilot synth output)"
    )
    parser.add_argument("--out", required=True, help="the case file to write (JSONL); image paths are relative to it")
    parser.add_argument("--json", action="store_true", help="print the manifest as JSON")


def run(args: argparse.Namespace) -> int:
    manifest = write_planning(args.images, args.out)
    if args.json:
        print(json.dumps(manifest, indent=1))
    else:
        print(f"wrote {manifest['cases']} cases to {args.out} (sha256 {manifest['sha256']})")
    return 0
