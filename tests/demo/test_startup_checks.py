"""`geopilot demo` refuses what it cannot use before any phase runs: one line, exit 2, nothing written."""

from __future__ import annotations

import json

import pytest

from geopilot.cli import main
from geopilot.demo.settings import DemoSettings, Layout


def _demo(capsys, *argv: str) -> str:
    assert main(["demo", "--quick", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(("threads", "message"), [("0", "0 is outside 1..256"), ("100000", "100000 is outside")])
def test_thread_counts_out_of_range(tmp_path, capsys, threads, message):
    assert message in _demo(capsys, "--out", str(tmp_path / "run"), "--threads", threads)


def test_an_out_folder_below_a_file(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    assert "which is a file" in _demo(capsys, "--out", str(tmp_path / "afile" / "sub"))


def _started_run(tmp_path) -> Layout:
    """A run folder as the demo leaves it after the data phase (settings record + marker)."""
    layout = Layout(tmp_path / "run")
    settings = DemoSettings.preset(True, 0, 1)
    layout.markers.mkdir(parents=True)
    record = {"fingerprint": settings.fingerprint(), "settings": settings.model_dump(mode="json")}
    layout.settings.write_text(json.dumps(record))
    layout.marker("data").write_text(json.dumps({"result": {"samples": 1}, "seconds": 1.0}))
    layout.train_file.parent.mkdir(parents=True)
    layout.train_file.write_text("{}\n")
    return layout


def test_a_corrupt_settings_record(tmp_path, capsys):
    layout = _started_run(tmp_path)
    layout.settings.write_text('{"fingerprint": "abc", "sett')
    err = _demo(capsys, "--out", str(layout.out), "--threads", "1")
    assert "demo.json" in err and "cannot be read" in err


@pytest.mark.parametrize("marker", ["{not json", "[1, 2]", '{"result": {}}'])
def test_a_corrupt_phase_marker(tmp_path, capsys, marker):
    layout = _started_run(tmp_path)
    layout.marker("data").write_text(marker)
    assert "data.done" in _demo(capsys, "--out", str(layout.out), "--threads", "1")


def test_a_deleted_data_folder_behind_its_marker(tmp_path, capsys):
    layout = _started_run(tmp_path)
    layout.train_file.unlink()
    err = _demo(capsys, "--out", str(layout.out), "--threads", "1")
    assert "says the data phase finished" in err
    assert layout.marker("data").is_file()  # nothing removed: the user decides


def test_a_warning_when_memory_is_below_the_training_peak():
    from geopilot.demo.run import TRAINING_PEAK_BYTES, memory_warning

    smollm2 = DemoSettings.preset(False, base="smollm2")
    assert memory_warning(smollm2, available=TRAINING_PEAK_BYTES["smollm2"] + 1) is None
    line = memory_warning(smollm2, available=8e9)
    assert line.startswith("training peaks at about 13.4 GB of memory and 8.0 GB is available")
    assert memory_warning(DemoSettings.preset(False), available=8e9) is None  # the scratch model needs 1.6 GB


def test_a_fresh_run_stopped_early_does_not_say_it_resumes(tmp_path):
    from rich.console import Console

    from geopilot.demo.run import run_demo

    console = Console(record=True, width=200)
    run_demo(tmp_path / "run", DemoSettings.preset(True, 0, 1), console, until="data")
    printed = console.export_text()
    assert "resuming" not in printed and "stopped after data" in printed
    again = Console(record=True, width=200)
    run_demo(tmp_path / "run", DemoSettings.preset(True, 0, 1), again, until="data")
    assert "resuming after data" in again.export_text()
