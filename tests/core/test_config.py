"""geopilot/config.py: flags derived from a config model's fields (`add_config_flags`), as `geopilot serve` uses."""

from __future__ import annotations

import argparse

import pytest
from pydantic import Field

from geopilot.config import Flag, StrictConfig, add_config_flags, config_from_flags
from geopilot.serving.cli import SERVE_FLAGS, add_arguments, build_config
from geopilot.serving.config import ServeConfig


class Limits(StrictConfig):
    rounds: int = Field(2, ge=0, description="tool rounds")
    timeout_s: float = Field(5.0, gt=0, le=60, description="seconds per call")
    body_bytes: int = Field(2048, ge=1024, description="body limit")
    hosts: list[str] = Field([], description="allowed hosts")
    verbose: bool = Field(False, description="say more")
    name: str = Field("x", description="a name")


FLAGS = {
    "rounds": Flag("--rounds"),
    "timeout_s": Flag("--timeout"),
    "body_bytes": Flag("--body-kb", unit=1024),
    "hosts": Flag("--host", metavar="HOST"),
    "verbose": Flag("--verbose"),
    "name": Flag("--name"),
}


def parser() -> argparse.ArgumentParser:
    built = argparse.ArgumentParser(prog="t", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_config_flags(built, Limits, FLAGS)
    return built


def test_unset_flags_give_the_model_defaults_and_set_ones_its_units():
    assert Limits(**config_from_flags(parser().parse_args([]), FLAGS)) == Limits()
    args = parser().parse_args(["--rounds", "0", "--timeout", "60", "--body-kb", "3", "--host", "a", "--host", "b"])
    given = Limits(**config_from_flags(args, FLAGS))
    assert (given.rounds, given.timeout_s, given.body_bytes, given.hosts) == (0, 60.0, 3072, ["a", "b"])
    assert Limits(**config_from_flags(parser().parse_args(["--verbose", "--name", "y"]), FLAGS)).verbose


def test_help_text_and_default_come_from_the_field(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "--timeout TIMEOUT seconds per call (default: 5.0)" in out
        and "--body-kb BODY_KB body limit (default: 2.0)" in out
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--timeout", "0"], "--timeout: 0 must be above 0"),
        (["--timeout", "61"], "at most 60"),
        (["--timeout", "nan"], "not a finite number"),
        (["--body-kb", "0.5"], "--body-kb: 0.5 must be at least 1"),
    ],
)
def test_a_float_outside_the_fields_bounds_is_a_usage_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parser().parse_args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_serve_flag_defaults_are_servconfigs_own():
    serve = argparse.ArgumentParser(prog="serve")
    add_arguments(serve)
    args = serve.parse_args(["--model", "models/tiny"])
    assert build_config(args) == ServeConfig(model_name="tiny")
    assert set(SERVE_FLAGS) == set(ServeConfig.model_fields) - {"model_name", "api_key"}
    assert all(ServeConfig.model_fields[field].description for field in SERVE_FLAGS)
    args = serve.parse_args(
        ["--model", "m", "--max-body-mb", "1.5", "--allow-url-host", "10.0.0.0/8", "--prefix-cache", "0"]
    )
    config = build_config(args)
    assert (config.max_body_bytes, config.allowed_url_hosts, config.prefix_cache_entries) == (
        1572864,
        ["10.0.0.0/8"],
        0,
    )
