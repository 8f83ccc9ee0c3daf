"""Tracking (issue 26 item 2): metrics.jsonl across a kill and resume, W&B offline, online without network, and
W&B asked for without the package."""

from __future__ import annotations

import signal
import sys
import time

import pytest
from test_validation import held_out
from train_helpers import run_killed, stage1_args

import train
from geopilot.data_gen.synthetic.samples import write_demo_dataset
from geopilot.training.tracking import read_metrics

ARGS = ["optim.max_steps=5", "optim.epochs=3", "checkpoint.save_steps=3", "eval.every_steps=2"]


def test_metrics_rows_have_no_gap_or_duplicate_across_a_kill_and_resume(tmp_path):
    data = write_demo_dataset(tmp_path / "data", optical=8, sar=2, seed=1)
    eval_file = held_out(tmp_path / "heldout", optical=1, sar=1)
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    command = stage1_args(data, resumed, *ARGS, f"data.eval_files=[{eval_file}]")
    assert train.main(stage1_args(data, reference, *ARGS, f"data.eval_files=[{eval_file}]")) == 0

    crashed = run_killed(4, "step", command)  # rows 1-4 written (an evaluation at 4), checkpoint at 3
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    assert [row["step"] for row in read_metrics(resumed)] == [1, 2, 3, 4]
    assert train.main(command) == 0

    rows, expected = read_metrics(resumed), read_metrics(reference)
    assert [row["step"] for row in rows] == [1, 2, 3, 4, 5]
    assert [row["step"] for row in rows if "val/loss" in row] == [2, 4, 5]  # neither repeated nor skipped
    for got, want in zip(rows, expected, strict=True):
        assert got.keys() == want.keys()
        for key in ("train/loss", "val/loss", "train/lr"):
            if key in want:
                assert got[key] == pytest.approx(want[key], abs=1e-6), (got["step"], key)


def test_wandb_offline_writes_a_run_folder_with_the_logged_keys(dataset, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    wandb = ["logging.wandb.project=geopilot-test", "logging.wandb.mode=offline"]
    assert train.main(stage1_args(dataset, out, "optim.max_steps=2", *wandb)) == 0
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    # the run's record log (protobuf records; `wandb sync` uploads it): history keys are stored as plain strings.
    # wandb's service process writes it on its own after finish() returns: wait for the final records.
    record_log = next(runs[0].glob("run-*.wandb"))
    deadline = time.monotonic() + 60
    while b"perf/tokens_per_s" not in record_log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.2)
    records = record_log.read_bytes()
    for key in ("train/loss", "train/lr", "train/grad_norm", "perf/tokens_per_s", "time/forward_backward_s"):
        assert key.encode() in records, key
    assert b"geopilot-test" in records and b"optim.lr" in records  # the project and the config


def test_wandb_online_without_network_falls_back_to_offline(dataset, tmp_path, monkeypatch, caplog):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    out = tmp_path / "run"
    wandb = ["logging.wandb.project=geopilot-test", "logging.wandb.mode=online"]
    with caplog.at_level("WARNING", logger="geopilot.train"):
        assert train.main(stage1_args(dataset, out, "optim.max_steps=1", *wandb)) == 0
    lines = [r.getMessage() for r in caplog.records if "wandb" in r.getMessage()]
    assert lines == [
        "logging.wandb.mode=online: 127.0.0.1 is unreachable (ConnectionRefusedError); logging offline "
        "instead (wandb sync later)"
    ]
    assert list((out / "wandb").glob("offline-run-*"))


def test_wandb_without_the_package_is_one_line(dataset, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    args = stage1_args(dataset, tmp_path / "run", "optim.max_steps=1", "logging.wandb.project=p")
    assert train.main(args) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "train.py: error: logging.wandb needs the wandb package: pip install wandb (or drop logging.wandb)"
    )
