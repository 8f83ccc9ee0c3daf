"""`geopilot eval build-change --out FILE`: the change question set change_v1 (docs/eval_tasks.md) and its
bi-temporal pairs (`change_images/`) next to FILE. It reproduces the frozen change_v1.jsonl byte for byte."""

from __future__ import annotations

import argparse
import json

from geopilot.eval.change_set import write_change_set


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="the case file to write (JSONL); the image pairs beside it")
    parser.add_argument("--json", action="store_true", help="print the manifest as JSON")


def run(args: argparse.Namespace) -> int:
    manifest = write_change_set(args.out)
    if args.json:
        print(json.dumps(manifest, indent=1))
    else:
        print(f"wrote {manifest['cases']} change cases to {args.out} (sha256 {manifest['sha256']})")
    return 0
