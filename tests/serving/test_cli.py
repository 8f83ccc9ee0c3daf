"""`geopilot serve` and `python serve.py` are one command; bad arguments exit 2 with one line."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from geopilot.cli import main

_SPEC = importlib.util.spec_from_file_location("serve", Path(__file__).resolve().parents[2] / "serve.py")
serve = importlib.util.module_from_spec(_SPEC)  # the top-level script, loaded from its file
_SPEC.loader.exec_module(serve)


def test_help_lists_the_issue_flags(capsys):
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in (
        "--model",
        "--host",
        "--port",
        "--api-key",
        "--tools-config",
        "--max-batch",
        "--batch-wait-ms",
        "--controller",
        "--engine-url",
    ):
        assert flag in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "/no/such/model"], "model directory not found"),
        (["--model", "m", "--host", "0.0.0.0"], "without an API key"),
        (["--model", "m", "--max-batch", "0"], "max_batch"),
        (["--model", "m", "--max-body-mb", "nan"], "--max-body-mb: 'nan' is not a finite number"),
        (["--model", "m", "--request-timeout", "inf"], "--request-timeout: 'inf' is not a finite number"),
        (["--model", "m", "--port", "99999"], "--port: port 99999 is outside 0..65535"),
        (["--model", "m", "--tools-config", "/nonexistent.yaml"], "/nonexistent.yaml"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, message, capsys, monkeypatch):
    monkeypatch.delenv("GEOPILOT_API_KEY", raising=False)
    assert serve.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
