"""Resume: a run SIGKILLed after k of N steps and re-run with the same command ends with the same parameters
(atol 1e-6) as an uninterrupted N-step run, having trained on the same samples in the same order; checkpoints
that are half-written or truncated are never loaded."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from safetensors.torch import load_file
from train_helpers import run_killed, stage1_args

import train
from geopilot.data_gen.synthetic.samples import write_demo_dataset
from geopilot.training.checkpoint import CheckpointError, CheckpointStore
from geopilot.training.config import TrainConfig

# 8 optical samples = 4 batches of 2 = 2 steps of 4 per epoch; 5 steps cross two epoch boundaries.
ARGS = ["optim.max_steps=5", "optim.epochs=3", "checkpoint.save_steps=3"]


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory) -> Path:
    return write_demo_dataset(tmp_path_factory.mktemp("small"), optical=8, sar=2, seed=1)


def assert_same_training(reference: Path, resumed: Path) -> None:
    ref, res = load_file(reference / "export/model.safetensors"), load_file(resumed / "export/model.safetensors")
    assert ref.keys() == res.keys()
    worst = max((ref[k].double() - res[k].double()).abs().max().item() for k in ref)
    assert worst <= 1e-6, f"max parameter difference {worst}"
    assert (reference / "logs/samples.rank0.jsonl").read_text() == (resumed / "logs/samples.rank0.jsonl").read_text()
    ref_info = json.loads((reference / "export/geopilot_train.json").read_text())
    res_info = json.loads((resumed / "export/geopilot_train.json").read_text())
    assert ref_info["steps"] == res_info["steps"] == 5


def test_killed_run_resumes_to_the_same_parameters_and_sample_order(small_dataset, tmp_path, capsys):
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    events = []
    assert train.main(stage1_args(small_dataset, reference, *ARGS), on_step=lambda *e: events.append(e)) == 0
    checkpoint_then_step = [(3, "checkpoint"), (3, "step"), (4, "step"), (5, "checkpoint"), (5, "step")]
    assert events == [(1, "step"), (2, "step"), *checkpoint_then_step]  # the callback is the only crash hook:
    assert "debug" not in TrainConfig.model_fields  # fault injection is no part of the training config

    command = stage1_args(small_dataset, resumed, *ARGS)
    crashed = run_killed(4, "step", command)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    steps_logged = [
        json.loads(line)["step"] for line in (resumed / "logs/samples.rank0.jsonl").read_text().splitlines()
    ]
    assert max(steps_logged) == 4 and not (resumed / "export").exists()
    assert sorted(p.name for p in (resumed / "checkpoints").iterdir()) == ["latest", "step-00000003"]

    assert train.main(command) == 0  # the same command again: resumes mid-epoch at step 3, crosses into epoch 3
    assert_same_training(reference, resumed)

    # resuming with a different plan is refused rather than silently mixing two runs
    assert train.main(stage1_args(small_dataset, resumed, "optim.max_steps=4", "optim.epochs=3")) == 2
    assert "belongs to a different run (optim.max_steps: 5 -> 4, total_steps: 5 -> 4)" in capsys.readouterr().err

    # a truncated checkpoint is rejected (never loaded) in favour of the previous complete one
    store = CheckpointStore(reference / "checkpoints")
    newest, older = sorted(p for p in store.root.glob("step-*"))[::-1][:2]
    with (newest / "model.safetensors").open("r+b") as handle:
        handle.truncate(100)
    (store.root / ".tmp-step-00000009").mkdir()  # a half-written save is not even a candidate
    path, state = store.find_resumable()
    assert path == older and state["step"] == int(older.name.split("-")[1])
    (older / "trainer_state.json").unlink()
    with pytest.raises(CheckpointError, match="truncated"):
        store.find_resumable()


@pytest.mark.slow
def test_kill_during_checkpoint_write_never_leaves_a_loadable_half(small_dataset, tmp_path):
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    assert train.main(stage1_args(small_dataset, reference, *ARGS)) == 0
    command = stage1_args(small_dataset, resumed, *ARGS, "checkpoint.save_steps=2")
    crashed = run_killed(4, "checkpoint", command)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    checkpoints = resumed / "checkpoints"
    assert (checkpoints / ".tmp-step-00000004").is_dir() and not (checkpoints / "step-00000004").exists()
    assert (checkpoints / "latest").read_text().strip() == "step-00000002"
    assert train.main(command) == 0
    assert_same_training(reference, resumed)
