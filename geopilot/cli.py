"""The `geopilot` console script: one explicit table of subcommands.

Each subcommand module defines `add_arguments(parser)` and `run(args) -> int`; only the chosen one is imported,
so `geopilot --help` stays fast. Exit codes: 0 success, 2 bad input or usage (one line, no traceback), 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from geopilot.errors import GeoPilotInputError

# name -> (module, one-line summary). Keep in the order users meet them.
COMMANDS: dict[str, tuple[str, str]] = {
    "init-model": ("geopilot.commands.init_model", "build a LLaVA-1.5 model + processor in llava-hf layout"),
    "inspect": ("geopilot.commands.inspect", "show what each sample trains on (token counts, labelled spans)"),
    "chat": ("geopilot.commands.chat", "ask a question about an image (plans, runs tools, answers)"),
    "image": ("geopilot.commands.image", "`image info FILE`: bands shown, modality, CRS, footprint, decimation"),
    "tools": ("geopilot.tools.cli", "list the task-level tools, or run one on an image"),
    "mcp": ("geopilot.tools.mcp_server", "serve the tools over MCP (stdio or streamable HTTP)"),
    "geo": ("geopilot.tools.geo_cli", "`geo export`: a saved tool output -> GeoJSON (WGS 84), GeoPackage or class COG"),
    "synth": ("geopilot.data_gen.synth_cli", "write synthetic optical/SAR scenes with annotations in real formats"),
    "data": ("geopilot.data_gen.data_cli", "`data check`: read every source of a generation config, generate nothing"),
    "generate": ("geopilot.data_gen.generate_cli", "generate tool-trace training data from dataset annotations"),
    "synth-region": ("geopilot.tools.indicators.synth_region", "write a synthetic two-country indicator region (COGs)"),
    "indicators": ("geopilot.tools.indicators.http_api", "serve the indicator tools over HTTP (OpenAPI)"),
    "eval": ("geopilot.eval.cli", "GeoPilotBench: planning (TSA/PA/NTA/OPA), leaderboards; `geopilot eval --help`"),
    "ablate-alpha": (
        "geopilot.eval.ablate_alpha",
        "train stage 2 for each optical replay alpha; SAR + optical VQA table",
    ),
    "demo": ("geopilot.commands.demo", "the whole recipe on this CPU: data, two training stages, evaluation, report"),
    "serve": ("geopilot.serving.cli", "serve the OpenAI-compatible API + web demo, or a FastChat worker"),
}


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="geopilot",
        description="GeoPilot: a tool-augmented remote-sensing assistant.",
        epilog="commands:\n" + "\n".join(f"  {name:<12} {summary}" for name, (_, summary) in COMMANDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=list(COMMANDS), metavar="command", help="one of: " + ", ".join(COMMANDS))
    return parser


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # usage errors: one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        _top_parser().print_help()
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"geopilot: error: unknown command {name!r} (choose from {', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    from geopilot.config import parse_command_line  # key=value overrides anywhere on the line

    module_name, summary = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = _Parser(prog=f"geopilot {name}", description=summary)
    module.add_arguments(parser)
    try:
        args = parse_command_line(parser, rest)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        return int(module.run(args) or 0)
    except GeoPilotInputError as err:
        print(f"geopilot {name}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"geopilot {name}: interrupted", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
