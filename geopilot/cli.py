"""The `geopilot` console script: one dispatcher over explicit tables of subcommands, at every level.

A table maps a name to a module (`add_arguments(parser)` and `run(args) -> int`), a `Command` (the same two
callables, for commands generated from a table), a `Group` (a module whose `COMMANDS` is the next level, e.g.
`geopilot eval`; its `default` runs when the next word is an option, so `geopilot generate --config C` is
`geopilot generate run --config C`) or a `Moved` name, which still works for one release and says its new words. Only the chosen modules are imported, so `geopilot --help` stays fast. Exit codes: 0 success, 2 bad input or usage (one line, no traceback), 1 otherwise.
`--verbose` anywhere on the line keeps the libraries' progress bars and routine lines (`geopilot.quiet`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from geopilot.errors import GeoPilotInputError, one_line


@dataclass(frozen=True)
class Command:
    """A command given by its callables (commands generated from a table, e.g. the eval tasks)."""

    summary: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Group:
    """A level of subcommands: `table` is a module path whose `COMMANDS` is the next level's table (imported only
    when the group is chosen)."""

    table: str
    summary: str
    default: str | None = None  # the entry run when the next word is an option (`-h`/`--help` show the group)


@dataclass(frozen=True)
class Moved:
    """A released command name that now lives at `words` (from the top, e.g. "generate check"): it runs that command
    after one deprecation line, for one release."""

    words: str

    @property
    def summary(self) -> str:
        return f"deprecated: now `geopilot {self.words}`"


Entry = tuple[str, str] | Command | Group | Moved


def _summary(entry: Entry) -> str:
    return entry[1] if isinstance(entry, tuple) else entry.summary


def _help(prog: str, description: str, table: dict[str, Entry], default: str | None = None) -> str:
    usage = (
        f"usage: {prog} [<command>] [options]  (no command: {default})"
        if default
        else f"usage: {prog} <command> [options]"
    )
    lines = [usage, "", description, "", "commands:"]
    lines += [f"  {name:<16} {_summary(entry)}" for name, entry in table.items()]
    return "\n".join(lines)


# name -> (module, one-line summary) | Group. Keep in the order users meet them.
COMMANDS: dict[str, Entry] = {
    "init-model": ("geopilot.commands.init_model", "build a LLaVA-1.5 model + processor in llava-hf layout"),
    "inspect": ("geopilot.commands.inspect", "show what each sample trains on (token counts, labelled spans)"),
    "train": ("geopilot.commands.train", "train one stage of the two-stage curriculum (same as train.py)"),
    "chat": ("geopilot.commands.chat", "ask a question about an image (plans, runs tools, answers)"),
    "image": Group("geopilot.commands.image", "`image info FILE`: bands shown, modality, CRS, footprint, decimation"),
    "tools": Group("geopilot.tools.cli", "list the task-level tools, or run one on an image"),
    "weights": Group("geopilot.commands.weights", "check the weights every configured tool needs (`weights check`)"),
    "mcp": ("geopilot.tools.mcp_server", "serve the tools over MCP (stdio or streamable HTTP)"),
    "geo": Group(
        "geopilot.tools.geo_cli", "`geo export`: a saved tool output -> GeoJSON (WGS 84), GeoPackage or class COG"
    ),
    "synth": ("geopilot.data_gen.synthetic.cli", "write synthetic optical/SAR scenes with annotations in real formats"),
    "generate": Group(
        "geopilot.data_gen.generate_cli",
        "tool-trace training data from dataset annotations: `generate [run]`, `generate check`, `generate merge`",
        default="run",
    ),
    "data": Group("geopilot.data_gen.data_cli", "deprecated: `data check` is now `generate check`"),
    "synth-region": ("geopilot.data_gen.synthetic.region", "write a synthetic two-country indicator region (COGs)"),
    "indicators": Group("geopilot.tools.indicators.http_api", "serve the indicator tools over HTTP (OpenAPI)"),
    "eval": Group("geopilot.eval.cli", "GeoPilotBench: planning (TSA/PA/NTA/OPA), tasks, leaderboards"),
    "ablate-alpha": (
        "geopilot.eval.ablate_alpha",
        "train stage 2 for each optical replay alpha; SAR + optical VQA table",
    ),
    "demo": ("geopilot.commands.demo", "the whole recipe on this CPU: data, two training stages, evaluation, report"),
    "serve": ("geopilot.serving.cli", "serve the OpenAI-compatible API + web demo, or a FastChat worker"),
}


class _DefaultsOnce(argparse.HelpFormatter):
    """Each flag's help ends with its default, once: added unless the help already states one, and never for
    flags without a value (switches) or without a default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, argparse.SUPPRESS, False) or action.nargs == 0:
            return text
        if action.option_strings:
            return f"{text} (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _DefaultsOnce)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # usage errors: one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def walk(table: dict[str, Entry] | None = None, prog: str = "geopilot") -> Iterator[tuple[str, Entry, object]]:
    """(prog, entry, its add_arguments/run holder) for every runnable command line, groups opened (tests list them)."""
    for name, entry in (COMMANDS if table is None else table).items():
        if isinstance(entry, Moved):
            continue
        if isinstance(entry, Group):
            group = importlib.import_module(entry.table).COMMANDS
            if entry.default is not None:  # the group's own name runs its default (`geopilot generate --config C`)
                yield f"{prog} {name}", group[entry.default], group[entry.default]
            yield from walk(group, f"{prog} {name}")
        else:
            yield f"{prog} {name}", entry, entry if isinstance(entry, Command) else importlib.import_module(entry[0])


def main(argv: list[str] | None = None) -> int:
    """Resolve the words of `argv` through the tables (COMMANDS, then a group's), parse the rest for the chosen
    command (`key=value` overrides anywhere on the line), run it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in argv  # any command: keep the libraries' own bars and lines (geopilot.quiet)
    argv = [word for word in argv if word != "--verbose"]
    prog, description, table, default = (
        "geopilot",
        "GeoPilot: a tool-augmented remote-sensing assistant.",
        COMMANDS,
        None,
    )
    while True:
        if not argv or argv[0] in ("-h", "--help"):
            print(_help(prog, description, table, default))
            return 0 if argv else 2
        if default is not None and argv[0].startswith("-"):
            argv = [default, *argv]
        name, argv = argv[0], argv[1:]
        if name not in table:
            listed = [name for name, entry in table.items() if not isinstance(entry, Moved)]
            print(f"{prog}: error: unknown command {name!r} (choose from {', '.join(listed)})", file=sys.stderr)
            return 2
        entry, prog = table[name], f"{prog} {name}"
        if isinstance(entry, Moved):
            print(f"{prog}: warning: deprecated, use `geopilot {entry.words}`", file=sys.stderr)
            argv = [*entry.words.split(), *argv]
            prog, table, default = "geopilot", COMMANDS, None
            continue
        if not isinstance(entry, Group):
            break
        description, table = entry.summary, importlib.import_module(entry.table).COMMANDS
        default = entry.default
    from geopilot.config import parse_command_line  # key=value overrides anywhere on the line
    from geopilot.quiet import quiet_libraries

    quiet_libraries(verbose)

    command = entry if isinstance(entry, Command) else importlib.import_module(entry[0])
    parser = _Parser(prog=prog, description=_summary(entry))
    command.add_arguments(parser)
    try:
        args = parse_command_line(parser, argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        return int(command.run(args) or 0)
    except GeoPilotInputError as err:
        print(f"{prog}: error: {one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 1


if __name__ == "__main__":  # `python -m geopilot.cli`: the imported module's main, whose Command/Group the tables use
    from geopilot import cli

    sys.exit(cli.main())
