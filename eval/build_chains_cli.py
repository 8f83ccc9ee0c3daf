"""`geopilot eval build-chains --out FILE`: the chain suite (docs/chains.md), its images (`chain_images/`) and its
annotations (`<stem>.annotations.json`) next to FILE. It reproduces the frozen chains_v1.jsonl byte for byte."""

from __future__ import annotations

import argparse
import json

from geopilot.eval.chain_set import write_chains


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="the case file to write (JSONL); images and annotations beside it")
    parser.add_argument("--json", action="store_true", help="print the manifest as JSON")


def run(args: argparse.Namespace) -> int:
    manifest = write_chains(args.out)
    if args.json:
        print(json.dumps(manifest, indent=1))
    else:
        print(f"wrote {manifest['cases']} chain cases to {args.out} (sha256 {manifest['sha256']})")
    return 0
