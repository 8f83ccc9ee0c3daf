"""`geopilot synth --out DIR [--seed N] [--optical N --sar N] [--json]`: write synthetic scenes in real formats.

See `geopilot.data_gen.synthetic.datasets` for what lands where; every folder under DIR is readable by its reader.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from geopilot.errors import GeoPilotInputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, type=Path, help="folder to write the dataset roots into")
    parser.add_argument("--seed", type=int, default=0, help="random seed (same seed, same bytes)")
    parser.add_argument("--optical", type=int, default=6, help="number of optical scenes (default 6)")
    parser.add_argument("--sar", type=int, default=6, help="number of SAR scenes (default 6)")
    parser.add_argument("--json", action="store_true", help="print the manifest summary as JSON")


def run(args: argparse.Namespace) -> int:
    from geopilot.data_gen.synthetic.datasets import MANIFEST, write_synthetic

    start = time.perf_counter()
    try:
        manifest = write_synthetic(args.out, seed=args.seed, optical=args.optical, sar=args.sar)
    except OSError as err:  # unwritable or full disk: the user's --out, so exit 2 with one line
        raise GeoPilotInputError(f"cannot write under {str(args.out)!r}: {err}") from err
    seconds = time.perf_counter() - start
    summary = {
        "out": str(args.out),
        "manifest": str(args.out / MANIFEST),
        "seconds": round(seconds, 3),
        "datasets": {
            name: {"root": d["root"], "records": len(d["records"])} for name, d in manifest["datasets"].items()
        },
    }
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        for name, entry in summary["datasets"].items():
            print(f"{name:<17} {entry['records']:>4} records  {args.out / entry['root']}")
        print(f"wrote {args.out} in {seconds:.2f} s (manifest: {summary['manifest']})")
    return 0
