"""train.py under hostile input (issue 37): configs that are FIFOs, devices or nested too deep, and a folder another
user owns: exit 2, one line on stderr, no traceback (config cases in a fresh process, measured)."""

from __future__ import annotations

import pytest
from helpers.hostile import not_a_small_file, run_cli

from geopilot.commands import train as command


@pytest.mark.parametrize(
    ("config", "message"),
    [("fifo", "is a FIFO"), ("dev_zero", "character device"), ("deep", "nested too deep")],
)
def test_configs_that_are_not_small_yaml_files(tmp_path, config, message):
    path = not_a_small_file(tmp_path / "stage1.yaml", config)
    if config == "deep":
        path.write_text("optim: " + "{a: " * 30_000 + "1" + "}" * 30_000)
    assert message in run_cli(["--config", path], tmp_path, module="geopilot.commands.train").refused()


def test_a_folder_another_user_owns_is_one_line(monkeypatch, capsys):
    # As root (the test machine) no folder refuses a write, so the PermissionError a tracker or the datasets cache
    # raises for another user's folder is raised where training starts.
    def train(cfg, on_step=None):
        raise PermissionError(13, "Permission denied", "/shared/runs/stage1/wandb")

    monkeypatch.setattr(command, "train", train)
    monkeypatch.setattr(command, "load_train_config", lambda path, overrides: None)
    assert command.main(["--config", "stage1.yaml"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "no permission to use '/shared/runs/stage1/wandb' (Permission denied)" in line and "output_dir" in line
