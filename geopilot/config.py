"""Typed configs: YAML onto pydantic models, unknown keys are errors, `a.b=value` overrides from the CLI.

Every config class derives from `StrictConfig`, so a misspelt key fails loudly with its dotted path.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, TypeVar

import annotated_types
import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from geopilot.argtypes import finite_float
from geopilot.errors import ConfigError, GeoPilotInputError, describe_validation_error
from geopilot.fileio import MiB, atomic_write, read_bounded

CONFIG_MAX_BYTES = 16 * MiB  # the largest config file read (ours are a few KB)

ConfigT = TypeVar("ConfigT", bound="StrictConfig")


class StrictConfig(BaseModel):
    """Base for every config: no unknown keys, no NaN/Infinity (`lr=.inf` trained to NaN), validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=(), allow_inf_nan=False)
    RENAMED: ClassVar[dict[str, str]] = {}  # released dotted key -> current one, read (with a warning) one release


def parse_overrides(overrides: list[str]) -> dict:
    """`["train.lr=1e-4", "data.replay_alpha=0.2"]` -> nested dict; values are parsed as YAML scalars/lists."""
    nested: dict = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form key=value")
        node = nested
        *parents, leaf = key.strip().split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r} sets a key below a non-mapping value")
        node[leaf] = yaml.safe_load(raw) if raw.strip() else ""
    return nested


def add_override_arguments(parser: argparse.ArgumentParser, example: str) -> None:
    """The one override syntax of every command (train.py, geopilot init-model|generate|tools|mcp): positional
    `key=value` words, dotted keys, YAML values. `parse_command_line` also takes them after later options."""
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help=f"config overrides (dotted key = YAML value), e.g. {example}"
    )


def parse_command_line(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """`parser.parse_args`, except that `key=value` words anywhere on the line are overrides (argparse alone stops
    taking positionals once an option follows the first of them: `run TOOL --image x device=cpu`)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        stray = [word for word in extra if word.startswith("-") or "=" not in word]
        if stray or not hasattr(args, "overrides"):
            hint = " (config overrides are key=value words, no --set)" if "--set" in stray else ""
            parser.error(f"unrecognized arguments: {' '.join(stray or extra)}{hint}")
        args.overrides = [*args.overrides, *extra]
    return args


@dataclass(frozen=True)
class Flag:
    """A command-line flag that sets one field of a config model (`add_config_flags`)."""

    name: str  # "--request-timeout"
    unit: float = 1  # the field holds the flag's value times this (--max-body-mb sets bytes: 2**20)
    metavar: str | None = None


def add_config_flags(parser: argparse.ArgumentParser, model: type[BaseModel], flags: dict[str, Flag]) -> None:
    """One flag per field of `model` named in `flags` (field name -> Flag): its type, default and help come from
    the field, so a default lives once, in the model (the command's help formatter shows it). A float is checked
    finite and within the field's bounds as it is parsed; an int's bounds (like every other check) by the model when
    `config_from_flags` values build it."""
    for field, flag in flags.items():
        info = model.model_fields[field]
        default = info.get_default(call_default_factory=True)
        help_text = info.description or ""
        if info.annotation is bool:
            parser.add_argument(flag.name, dest=field, action="store_true", help=help_text)
            continue
        if isinstance(default, list):  # repeatable; unset leaves the model's default
            parser.add_argument(
                flag.name, dest=field, action="append", default=None, metavar=flag.metavar, help=help_text
            )
            continue
        if info.annotation is float or flag.unit != 1:
            parse = _bounded_float(info.metadata, flag.unit)
        else:
            parse = int if info.annotation is int else str
        parser.add_argument(
            flag.name,
            dest=field,
            type=parse,
            default=default / flag.unit if flag.unit != 1 else default,
            metavar=flag.metavar or flag.name.lstrip("-").upper().replace("-", "_"),
            help=help_text,
        )


def config_from_flags(args: argparse.Namespace, flags: dict[str, Flag]) -> dict:
    """The fields `add_config_flags` flags set, in the model's units (a repeatable flag never given: left out)."""
    values = {}
    for field, flag in flags.items():
        value = getattr(args, field)
        if value is not None:
            values[field] = int(value * flag.unit) if flag.unit != 1 else value
    return values


def _bounded_float(metadata: list, unit: float):
    low, high, low_open = -math.inf, math.inf, False
    for bound in metadata:
        if isinstance(bound, annotated_types.Gt | annotated_types.Ge):
            low, low_open = (bound.gt, True) if isinstance(bound, annotated_types.Gt) else (bound.ge, False)
            low /= unit
        elif isinstance(bound, annotated_types.Le):
            high = bound.le / unit
    return finite_float(low, high, low_open)


def merge(base: dict, update: dict) -> dict:
    """Deep-merge `update` into a copy of `base` (mappings merge, everything else is replaced)."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file not found: {path} does not exist")
    try:
        data = yaml.safe_load(read_bounded(path, CONFIG_MAX_BYTES, "config file").decode("utf-8"))
    except GeoPilotInputError as err:
        raise ConfigError(str(err)) from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text (expected YAML)") from None
    except RecursionError:
        raise ConfigError(f"{path}: YAML nested too deep to read") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(err).splitlines())}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def build_config(cls: type[ConfigT], data: dict, source: str = "config") -> ConfigT:
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise ConfigError(describe_validation_error(err, source)) from None


def load_config(cls: type[ConfigT], path: str | Path | None, overrides: list[str] | None = None) -> ConfigT:
    """The one way configs are loaded: YAML file (optional) + CLI overrides -> validated `cls`."""
    source = str(path) if path is not None else "overrides"
    data = renamed(read_yaml(path) if path is not None else {}, cls.RENAMED, source)
    data = merge(data, renamed(parse_overrides(overrides or []), cls.RENAMED, "overrides"))
    return build_config(cls, data, source=str(path) if path is not None else "overrides")


def renamed(data: dict, renames: dict[str, str], source: str) -> dict:
    """`data` with every released key of `renames` moved to its current name, each saying so in one line."""
    data = copy.deepcopy(data)
    for old, new in renames.items():
        *path, leaf = old.split(".")
        node = data
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict) or leaf not in node:
            continue
        print(f"warning: {old} is deprecated, use {new}", file=sys.stderr)
        *path, new_leaf = new.split(".")
        target = data
        for key in path:
            target = target.setdefault(key, {})
        if new_leaf in target:
            raise ConfigError(f"{source}: {old} and {new} are one setting; keep {new}")
        target[new_leaf] = node.pop(leaf)
    return data


def save_config(config: StrictConfig, path: str | Path) -> None:
    atomic_write(path, yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
