"""Typed configs: YAML onto pydantic models, unknown keys are errors, `a.b=value` overrides from the CLI.

Every config class derives from `StrictConfig`, so a misspelt key fails loudly with its dotted path.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from geopilot.errors import ConfigError

ConfigT = TypeVar("ConfigT", bound="StrictConfig")


class StrictConfig(BaseModel):
    """Base for every config: no unknown keys, validated on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())


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


def describe_validation_error(err: ValidationError, source: str) -> str:
    """One line per problem, each naming the dotted key, e.g. `train.lr: Input should be a valid number`."""
    lines = []
    for problem in err.errors():
        key = ".".join(str(part) for part in problem["loc"]) or "<root>"
        message = "unknown key (misspelt?)" if problem["type"] == "extra_forbidden" else problem["msg"]
        lines.append(f"{key}: {message}")
    return f"{source}: " + "; ".join(lines)


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
    Path(path).write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False), encoding="utf-8")
