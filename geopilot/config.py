"""Typed configs: YAML onto pydantic models, unknown keys are errors, `a.b=value` overrides from the CLI.

Every config class derives from `StrictConfig`, so a misspelt key fails loudly with its dotted path.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from geopilot.errors import ConfigError, describe_validation_error
from geopilot.fileio import atomic_write

ConfigT = TypeVar("ConfigT", bound="StrictConfig")


class StrictConfig(BaseModel):
    """Base for every config: no unknown keys, no NaN/Infinity (`lr=.inf` trained to NaN), validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=(), allow_inf_nan=False)


def parse_overrides(overrides: list[str]) -> dict:
    """`["train.lr=1e-4", "data.alpha=0.2"]` -> nested dict; values are parsed as YAML scalars/lists."""
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
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
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
    data = read_yaml(path) if path is not None else {}
    data = merge(data, parse_overrides(overrides or []))
    return build_config(cls, data, source=str(path) if path is not None else "overrides")


def save_config(config: StrictConfig, path: str | Path) -> None:
    atomic_write(path, yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
