"""`geopilot generate --config configs/data_gen/<name>.yaml --out DIR [key=value ...]`: write a tool-trace dataset.

Writes `DIR/shard-NNNNN.jsonl` (samples), `DIR/manifest.json`, `DIR/report.json` + `DIR/report.md`, and keeps
`DIR/journal/` so that a killed run, restarted with the same command, finishes with the same samples.
Exit codes: 0 done, 2 bad config or input, 1 the LLM endpoint failed (what was done is kept; rerun to resume).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from geopilot.config import add_override_arguments, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, type=Path, help="YAML config (see configs/data_gen/)")
    parser.add_argument("--out", required=True, type=Path, help="output folder (reuse it to resume)")
    add_override_arguments(parser, "backend.concurrency=32")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def run(args: argparse.Namespace) -> int:
    from geopilot.data_gen.generate import GenerateConfig, generate_dataset
    from geopilot.data_gen.llm import EndpointRejected, EndpointUnavailable

    config = load_config(GenerateConfig, args.config, args.overrides)
    step = {"next": 0}

    def progress(done: int, total: int) -> None:
        if args.quiet or done < step["next"] and done != total:
            return
        step["next"] = done + max(1, total // 20)
        print(f"generate: {done}/{total} jobs", file=sys.stderr, flush=True)

    try:
        result = generate_dataset(config, args.out, progress=progress)
    except (EndpointUnavailable, EndpointRejected) as err:
        print(f"geopilot generate: error: {err}", file=sys.stderr)
        return 1
    report = result.report
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"{report['kept']} samples in {len(result.manifest['shards'])} shard(s), {report['dropped']} dropped "
            f"({result.new} generated now, {result.resumed} already done); report: {Path(args.out) / 'report.md'}"
        )
    return 0
