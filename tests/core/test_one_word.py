"""One word per meaning (issue 39): renamed settings and commands keep their released names working for one release,
each saying its new name in one line; `geopilot train` is train.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from geopilot.errors import ConfigError
from geopilot.training.config import current_settings, load_train_config

ROOT = Path(__file__).resolve().parents[2]
STAGE2 = ROOT / "configs" / "tiny" / "stage2.yaml"


def test_data_alpha_is_read_as_replay_alpha_with_one_deprecation_line(capsys):
    assert load_train_config(STAGE2, ["data.alpha=0.4"]).data.replay_alpha == 0.4  # overrides the YAML's key
    assert capsys.readouterr().err.strip() == "warning: data.alpha is deprecated, use data.replay_alpha"


def test_data_alpha_beside_replay_alpha_is_an_error(tmp_path):
    config = tmp_path / "stage2.yaml"
    config.write_text(STAGE2.read_text(encoding="utf-8").replace("replay_alpha: 0.2", "alpha: 0.2"), encoding="utf-8")
    assert load_train_config(config).data.replay_alpha == 0.2
    assert load_train_config(config, ["data.replay_alpha=0.3"]).data.replay_alpha == 0.3
    with pytest.raises(ConfigError, match="data.alpha and data.replay_alpha are one setting; keep data.replay_alpha"):
        load_train_config(config, ["data.alpha=0.3", "data.replay_alpha=0.3"])


def test_a_run_recorded_with_data_alpha_has_the_same_identity():
    assert current_settings({"data.alpha": 0.2, "optim.lr": 1e-3}) == {"data.replay_alpha": 0.2, "optim.lr": 1e-3}


# (command, the words it needs, released flag, its new name, value, the attribute it sets, the parsed value)
RENAMED_FLAGS = [
    (
        "eval planning",
        ["--agent", "reference", "--out", "o"],
        "--base-url",
        "--engine-url",
        "http://h/v1",
        "engine_url",
    ),
    (
        "eval planning",
        ["--agent", "reference", "--out", "o"],
        "--timeout-s",
        "--request-timeout",
        "5",
        "request_timeout",
    ),
    ("geo export", ["--image", "s.tif", "--out", "x.gpkg"], "--output", "--tool-output", "t.json", "tool_output"),
    ("chat", ["--model", "m", "--image", "i.png", "q"], "--save-vis", "--out", "v.png", "out"),
    ("indicators serve", ["--catalog", "c"], "--artifacts-dir", "--out", "charts", "out"),
]


def _parser(prog: str):
    import argparse

    from geopilot.cli import walk

    holder = next(holder for name, _, holder in walk() if name == f"geopilot {prog}")
    parser = argparse.ArgumentParser(prog=f"geopilot {prog}")
    holder.add_arguments(parser)
    return parser


@pytest.mark.parametrize(("prog", "words", "old", "new", "value", "dest"), RENAMED_FLAGS)
def test_a_released_flag_sets_the_new_one_and_names_it_in_one_line(prog, words, old, new, value, dest, capsys):
    parser = _parser(prog)
    released, current = parser.parse_args([*words, old, value]), parser.parse_args([*words, new, value])
    assert getattr(released, dest) == getattr(current, dest) is not None
    assert capsys.readouterr().err == f"geopilot {prog}: warning: {old} is deprecated, use {new}\n"
    assert old not in parser.format_help() and new in parser.format_help()


def test_every_command_that_writes_a_file_or_folder_names_it_out():
    """One word for where a command writes: no released output name is left in any --help."""
    from geopilot.cli import walk

    for prog, _, _ in walk():
        text = _parser(prog.removeprefix("geopilot ")).format_help()
        assert not {"--output", "--save-vis", "--artifacts-dir", "--base-url", "--timeout-s"} & set(text.split()), prog


def test_generate_merge_and_check_are_visible_subcommands_with_their_own_help(capsys):
    from geopilot.cli import main

    assert main(["generate", "--help"]) == 0
    listed = capsys.readouterr().out
    assert all(f"  {name} " in listed for name in ("run", "check", "merge"))
    assert main(["generate", "merge", "--help"]) == 0
    assert "usage: geopilot generate merge" in capsys.readouterr().out
    assert main(["generate", "merge", "--out", "o"]) == 2  # no shard folders: a usage error
    assert "SHARD_DIR" in capsys.readouterr().err


def test_data_check_runs_generate_check_after_one_line(tmp_path, capsys):
    from geopilot.cli import main

    assert main(["data", "check", "--config", str(tmp_path / "missing.yaml")]) == 2
    warning, error = capsys.readouterr().err.splitlines()
    assert warning == "geopilot data check: warning: deprecated, use `geopilot generate check`"
    assert error.startswith("geopilot generate check: error: config file not found")


def test_generate_without_a_subcommand_runs_the_generator(tmp_path, capsys):
    from geopilot.cli import main

    assert main(["generate", "--config", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "o")]) == 2
    assert "config file not found" in capsys.readouterr().err
    assert main(["generate", "--out", str(tmp_path / "o"), "--config", "c.yaml", "merge", "d1"]) == 2
    assert "merge is its own command" in capsys.readouterr().err


def test_geopilot_train_is_train_py():
    import importlib.util

    from geopilot.commands import train as command

    spec = importlib.util.spec_from_file_location("train", Path(__file__).resolve().parents[2] / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)

    assert (train.main, train.parse_args, train.train) == (command.main, command.parse_args, command.train)


def test_geopilot_train_stage2_without_the_stage1_export_says_what_to_run_first(tmp_path, capsys):
    from geopilot.cli import main

    overrides = [f"model.llava_path={tmp_path / 'none'}", f"output_dir={tmp_path / 'run'}"]
    assert main(["train", "--config", str(STAGE2), *overrides]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("geopilot train: error: stage 2 needs the stage-1 model")
    assert "run stage 1 first, e.g. `geopilot train --config configs/tiny/stage1.yaml`" in error
