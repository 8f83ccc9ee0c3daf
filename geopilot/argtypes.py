"""argparse `type=` checks shared by every command, so a bad flag is one usage line and exit 2 before anything starts
(a NaN body limit, port 99999, 100000 threads or an output folder under a file used to be tracebacks)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

SYSTEM_TREES = ("/proc", "/sys", "/dev")  # not places a run writes to


def port(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535."""
    value = _number(text, int, "a port number")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is outside 0..65535")
    return value


def bands(text: str) -> list[int]:
    """`--bands 4,3,2`: band numbers (1-based) shown as red, green, blue, or one band shown grey."""
    from geopilot.bands import parse_bands

    try:
        return parse_bands(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def int_in(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = _number(text, int, "a whole number")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low}..{high}")
        return value

    return parse


def finite_float(low: float, high: float = math.inf, low_open: bool = True) -> Callable[[str], float]:
    """A finite number above `low` (or at it, with `low_open=False`) and at most `high`."""

    def parse(text: str) -> float:
        value = _number(text, float, "a number")
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if value < low or (low_open and value == low) or value > high:
            bound = f"{'above' if low_open else 'at least'} {low:g}" + (
                f" and at most {high:g}" if high < math.inf else ""
            )
            raise argparse.ArgumentTypeError(f"{value:g} must be {bound}")
        return value

    return parse


def output_folder(text: str) -> Path:
    """A folder a command may create or write into: not empty text, not a file, not below a file, not a system tree,
    and writable where it would be made."""
    error = output_folder_problem(text)
    if error:
        raise argparse.ArgumentTypeError(error)
    return Path(text)


def output_folder_problem(text: str) -> str | None:
    """Why `text` cannot be an output folder, or None. Also used by config validators (`output_dir=`)."""
    if not str(text).strip():
        return "an empty path is not a folder"
    path = Path(text).expanduser()
    resolved = path.resolve()
    if any(resolved == Path(tree) or Path(tree) in resolved.parents for tree in SYSTEM_TREES):
        return f"{text!r} is under {resolved.parts[0]}{resolved.parts[1]}, not a place for output"
    if path.exists() and not path.is_dir():
        return f"{text!r} exists and is not a folder"
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{text!r} is below {str(existing)!r}, which is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{text!r}: no permission to write in {str(existing)!r}"
    return None


class _DeprecatedName(argparse.Action):
    """An old flag name that still works for one release, saying its new name once on stderr."""

    def __init__(self, option_strings, dest, new_name: str, **kwargs):
        self.new_name = new_name
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: warning: {option_string} is deprecated, use {self.new_name}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_deprecated_name(parser: argparse.ArgumentParser, old_name: str, new_name: str, **kwargs) -> None:
    """`old_name` still sets what `new_name` sets, for one release, saying `new_name` on stderr when used (a
    `type` in `kwargs` converts its value the same way). Not in --help."""
    dest = new_name.lstrip("-").replace("-", "_")
    parser.add_argument(
        old_name, dest=dest, action=_DeprecatedName, new_name=new_name, help=argparse.SUPPRESS, **kwargs
    )


def add_tools_config_argument(parser: argparse.ArgumentParser, old_names: tuple[str, ...] = ()) -> None:
    """`--tools-config FILE`, the one name of the tools YAML in every command; `old_names` stay as deprecated
    aliases (`--tools`, `--config`) for one release."""
    parser.add_argument("--tools-config", default=None, metavar="FILE", help="tools YAML (default: configs/tools.yaml)")
    for name in old_names:
        add_deprecated_name(parser, name, "--tools-config")


def _number(text: str, kind: type, what: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
