"""`geopilot eval`: GeoPilotBench. One explicit table of sub-subcommands, like `geopilot/cli.py`'s COMMANDS.

Each module in SUBCOMMANDS defines `add_arguments(parser)` and `run(args) -> int`; only the chosen one is imported.
Exit codes: 0 success, 2 bad input or usage (one line), 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib

from geopilot.errors import GeoPilotInputError

# name -> (module, one-line summary). Add a benchmark task by adding its entry here.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "planning": ("geopilot.eval.planning_cli", "task planning (TSA/PA/NTA/OPA) of an agent over the planning set"),
    "build-planning": ("geopilot.eval.build_cli", "rebuild the 500-query planning set over a folder of images"),
    "build-indicators": (
        "geopilot.eval.indicator_suite",
        "the indicator case suite over a `geopilot synth-region` folder",
    ),
    "leaderboard": ("geopilot.eval.leaderboard_cli", "compare run folders: Tables 5-7 + paired bootstrap CIs"),
    "rsvqa-lr": (
        "geopilot.eval.task_commands.rsvqa_lr",
        "RSVQA-LRBEN accuracy by type (avg: presence/comp/rural_urban)",
    ),
    "rsvqa-hr": (
        "geopilot.eval.task_commands.rsvqa_hr",
        "RSVQA-HRBEN (test set 2) accuracy by type (avg: presence/comp)",
    ),
    "referring": (
        "geopilot.eval.task_commands.referring",
        "GeoChat referring detection Acc@0.5 by size, single/multiple",
    ),
    "sar-vqa": ("geopilot.eval.task_commands.sar_vqa", "SAR VQA accuracy: OI, IC, OC, OP and their average"),
    "sar-caption": ("geopilot.eval.task_commands.sar_caption", "SARLANG-1M-Cap captioning: BLEU-1..4, ROUGE-L, CIDEr"),
    "captions": ("geopilot.eval.task_commands.captions", "caption metrics of --pred/--ref JSONL files (no model)"),
    "tools-e2e": ("geopilot.eval.task_commands.tools_e2e", "end-to-end tool tasks: GeoPilot vs the standalone tool"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # usage errors: one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "subcommands:\n" + "\n".join(
        f"  {name:<16} {summary}" for name, (_, summary) in SUBCOMMANDS.items()
    )
    parser.add_argument(
        "subcommand", choices=list(SUBCOMMANDS), metavar="subcommand", help="one of: " + ", ".join(SUBCOMMANDS)
    )
    parser.add_argument(
        "rest", nargs=argparse.REMAINDER, help="the subcommand's arguments (see geopilot eval <subcommand> --help)"
    )


def run(args: argparse.Namespace) -> int:
    module_name, summary = SUBCOMMANDS[args.subcommand]
    module = importlib.import_module(module_name)
    parser = _Parser(prog=f"geopilot eval {args.subcommand}", description=summary)
    module.add_arguments(parser)
    try:
        sub_args = parser.parse_args(args.rest)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        return int(module.run(sub_args) or 0)
    except GeoPilotInputError as err:  # re-raised with the subcommand in the message for the top-level handler
        raise GeoPilotInputError(f"{args.subcommand}: {err}") from None
