"""What would silently corrupt a run is refused: absurd or non-finite settings, a diverging loss, non-finite weights
at init, and a rerun of a run folder with settings that change the result."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from train_helpers import stage1_args, stage2_args

import train


@pytest.fixture(scope="module")
def stage1_run(dataset, tmp_path_factory):
    """A finished two-step stage-1 run folder."""
    from accelerate.state import AcceleratorState, GradientState

    out = tmp_path_factory.mktemp("s1") / "run"
    assert train.main(stage1_args(dataset, out, "optim.max_steps=2")) == 0
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    return out


def _export_with(stage1_run, tmp_path, change) -> str:
    """A copy of the stage-1 export with `change(name, tensor) -> tensor` applied to its weights."""
    copy = tmp_path / "export"
    shutil.copytree(stage1_run / "export", copy)
    for shard in copy.glob("*.safetensors"):
        tensors = load_file(shard)
        save_file({name: change(name, t) for name, t in tensors.items()}, shard, metadata={"format": "pt"})
    return copy


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ("optim.lr=.inf", "optim.lr: Input should be a finite number"),
        ("optim.lr=nan", "optim.lr: Input should be a finite number"),
        ("optim.lr=1e30", "optim.lr: Input should be less than or equal to 1"),
        ("optim.eps=-1", "optim.eps"),
        ("optim.betas=[0.9,1.5]", "optim.betas.1"),
        ("optim.max_grad_norm=.inf", "optim.max_grad_norm"),
    ],
)
def test_non_finite_or_absurd_settings_are_refused_at_load(dataset, tmp_path, capsys, override, reason):
    assert train.main(stage1_args(dataset, tmp_path / "run", override)) == 2
    assert reason in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_an_init_model_with_nan_weights_is_refused(dataset, stage1_run, tmp_path, capsys):
    def poison(name, tensor):
        return torch.full_like(tensor, float("nan")) if "multi_modal_projector" in name else tensor

    export = _export_with(stage1_run, tmp_path, poison)
    assert train.main(stage2_args(dataset, tmp_path / "s2", export, "optim.max_steps=1")) == 2
    err = capsys.readouterr().err
    assert "weight tensors hold NaN or inf" in err and "multi_modal_projector" in err
    assert not (tmp_path / "s2" / "export").exists()


def test_a_diverging_loss_stops_the_run_and_exports_nothing(dataset, stage1_run, tmp_path, capsys):
    def huge(name, tensor):  # finite weights whose activations overflow: the loss is NaN from the first step
        return torch.full_like(tensor, 3e38) if name.endswith("embed_tokens.weight") else tensor

    export = _export_with(stage1_run, tmp_path, huge)
    assert train.main(stage2_args(dataset, tmp_path / "s2", export, "optim.max_steps=2")) == 2
    assert "the loss is not finite (NaN or inf); stopped with nothing exported" in capsys.readouterr().err
    assert not (tmp_path / "s2" / "export").exists()
    assert not list((tmp_path / "s2").glob("checkpoints/step-*"))


def test_a_finished_run_rerun_with_changed_settings_is_refused(dataset, stage1_run, capsys):
    config_before = (stage1_run / "config.json").read_text()
    record_before = (stage1_run / "export" / "geopilot_train.json").read_text()
    assert json.loads(record_before)["final_loss"] == pytest.approx(json.loads(record_before)["final_loss"])  # not NaN

    assert train.main(stage1_args(dataset, stage1_run, "optim.max_steps=2", "optim.lr=0.1")) == 2
    assert "optim.lr: 0.001 -> 0.1" in capsys.readouterr().err
    assert train.main(stage1_args(dataset, stage1_run, "optim.max_steps=2", "freeze.vision_tower=false")) == 2
    assert "freeze.vision_tower: true -> false" in capsys.readouterr().err

    # the same command again: already finished, nothing rewritten; settings that change no result are accepted
    assert train.main(stage1_args(dataset, stage1_run, "optim.max_steps=2", "logging.logging_steps=5")) == 0
    assert (stage1_run / "config.json").read_text() == config_before
    assert (stage1_run / "export" / "geopilot_train.json").read_text() == record_before


@pytest.mark.parametrize("where", ["AFILE", "/proc/geopilot-run", "AFILE/sub"])
def test_an_output_dir_that_cannot_be_a_folder(dataset, tmp_path, capsys, where):
    (tmp_path / "afile").write_text("")
    out = Path(where.replace("AFILE", str(tmp_path / "afile")))
    assert train.main(stage1_args(dataset, out)) == 2
    assert "output_dir" in capsys.readouterr().err
