"""`geopilot generate [run] --config configs/data_gen/<name>.yaml --out DIR [--shard i/N] [key=value ...]`: write a
tool-trace dataset; `geopilot generate check --config C` reads every source first, generating nothing
(geopilot.data_gen.data_cli); `geopilot generate merge D1 D2 ... --out DIR` joins the N shards of one run into one
dataset.

Writes `DIR/shard-NNNNN.jsonl` (samples), `DIR/manifest.json`, `DIR/report.json` + `DIR/report.md`, and keeps
`DIR/journal/` so that a killed run (or shard), restarted with the same command, finishes with the same samples.
Run `geopilot generate check --config C` first on a new machine. Many machines: README.md, "Data generation".
Exit codes: 0 done, 2 bad config or input, 1 the LLM endpoint failed (what was done is kept; rerun to resume).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from geopilot.cli import Command
from geopilot.config import add_override_arguments, load_config
from geopilot.data_gen import data_cli
from geopilot.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, type=Path, help="YAML config (see configs/data_gen/)")
    parser.add_argument("--out", required=True, type=Path, help="output folder (reuse it to resume)")
    parser.add_argument("--shard", metavar="i/N", help="generate only shard i of N (0 <= i < N); merge them after")
    add_override_arguments(parser, "backend.concurrency=32")
    _add_report_flags(parser)


def _add_report_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def add_merge_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shards", nargs="+", type=Path, metavar="SHARD_DIR", help="the output folders of the shards")
    parser.add_argument("--out", required=True, type=Path, help="the merged dataset's folder")
    _add_report_flags(parser)


def run(args: argparse.Namespace) -> int:
    if args.overrides[:1] == ["merge"]:
        raise ConfigError("merge is its own command: geopilot generate merge D1 D2 ... --out D")
    from geopilot.data_gen.generate import generate_dataset
    from geopilot.data_gen.generate_config import GenerateConfig
    from geopilot.data_gen.llm import EndpointRejected, EndpointUnavailable
    from geopilot.data_gen.shards import parse_shard

    shard = parse_shard(args.shard) if args.shard is not None else None
    config = load_config(GenerateConfig, args.config, args.overrides)
    step = {"next": 0}

    def progress(done: int, total: int) -> None:
        if args.quiet or done < step["next"] and done != total:
            return
        step["next"] = done + max(1, total // 20)
        print(f"generate{f' shard {shard}' if shard else ''}: {done}/{total} jobs", file=sys.stderr, flush=True)

    try:
        result = generate_dataset(config, args.out, progress=progress, shard=shard)
    except (EndpointUnavailable, EndpointRejected) as err:
        print(f"geopilot generate: error: {err}", file=sys.stderr)
        return 1
    _print(
        args,
        result.report,
        len(result.manifest["shards"]),
        f" ({result.new} generated now, {result.resumed} already done)",
    )
    return 0


def merge(args: argparse.Namespace) -> int:
    from geopilot.data_gen.merge import merge_shards

    report = merge_shards(args.shards, args.out)
    manifest = json.loads((Path(args.out) / "manifest.json").read_text(encoding="utf-8"))
    _print(args, report, len(manifest["shards"]), f" (merged from {len(args.shards)} shards)")
    return 0


def _print(args: argparse.Namespace, report: dict, files: int, detail: str) -> None:
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"{report['kept']} samples in {files} shard(s), {report['dropped']} dropped{detail}; "
            f"report: {Path(args.out) / 'report.md'}"
        )


COMMANDS = {
    "run": Command("generate tool-trace training data from dataset annotations (the default)", add_arguments, run),
    "check": Command(
        "read every source of a generation config, generate nothing", data_cli.add_arguments, data_cli.run
    ),
    "merge": Command("join the shard folders of one `--shard i/N` run into one dataset", add_merge_arguments, merge),
}
