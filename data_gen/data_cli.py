"""`geopilot generate check --config configs/data_gen/<name>.yaml [--json]`: read every source without generating
(`geopilot data check`, its released name, still works for one release).

Run it on a new machine before a long `geopilot generate`: it prints, per source, the layout found, what was read,
what was skipped and why, and the samples each ability would get (`geopilot.data_gen.check`).
Exit codes: 0 every source is usable, 2 a source `generate` would fail on (or a bad config).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from geopilot.cli import Moved
from geopilot.config import add_override_arguments, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, type=Path, help="YAML generation config (see configs/data_gen/)")
    parser.add_argument("--json", action="store_true", help="print the check as JSON")
    add_override_arguments(parser, "max_skip_fraction=0.3")


def run(args: argparse.Namespace) -> int:
    from geopilot.data_gen.check import check_sources, first_failure, render_check
    from geopilot.data_gen.generate_config import GenerateConfig

    check = check_sources(load_config(GenerateConfig, args.config, args.overrides))
    print(json.dumps(check, indent=2, ensure_ascii=False) if args.json else render_check(check))
    failure = first_failure(check)
    if failure is not None:
        print(f"geopilot generate check: error: {failure}", file=sys.stderr)
        return 2
    return 0


COMMANDS = {"check": Moved("generate check")}  # the released name, for one release
