"""A quiet console (geopilot/quiet.py): the libraries' bars, routine lines and DeepSpeed's CPU warning are off unless
--verbose; the slow quick-demo test checks the whole console of a real run."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from geopilot.quiet import EXPECTED_WARNINGS, PROGRESS_BAR_SWITCHES, ROUTINE_LOGGERS, quiet_libraries


@pytest.fixture
def clean_logging(monkeypatch):
    for name in PROGRESS_BAR_SWITCHES:
        monkeypatch.delenv(name, raising=False)
    loggers = [logging.getLogger(name) for name in (*ROUTINE_LOGGERS, *EXPECTED_WARNINGS)]
    saved = [(logger, logger.level, list(logger.filters)) for logger in loggers]
    for logger in loggers:  # as before any `geopilot` command of this test session quietened them
        logger.setLevel(logging.NOTSET)
        logger.filters[:] = []
    yield
    for logger, level, filters in saved:
        logger.setLevel(level)
        logger.filters[:] = filters


def _passes(logger: logging.Logger, level: int, message: str) -> bool:
    record = logger.makeRecord(logger.name, level, __file__, 1, message, (), None)
    return logger.isEnabledFor(level) and logger.filter(record)


def test_quiet_turns_the_library_noise_off(clean_logging):
    quiet_libraries(verbose=False)
    assert all(os.environ[name] == value for name, value in PROGRESS_BAR_SWITCHES.items())
    accelerate = logging.getLogger("accelerate.checkpointing")
    assert not _passes(accelerate, logging.INFO, "Model weights saved in runs/x")
    assert _passes(accelerate, logging.WARNING, "a real warning")
    deepspeed = logging.getLogger("DeepSpeed")
    assert not _passes(deepspeed, logging.WARNING, "Setting accelerator to CPU. If you have GPU ...")
    assert _passes(deepspeed, logging.WARNING, "another warning")


def test_verbose_leaves_everything(clean_logging):
    quiet_libraries(verbose=True)
    assert not any(name in os.environ for name in PROGRESS_BAR_SWITCHES)
    assert _passes(logging.getLogger("DeepSpeed"), logging.WARNING, "Setting accelerator to CPU.")


def test_verbose_is_taken_anywhere_on_a_geopilot_line(capsys):
    from geopilot.cli import main

    config = Path(__file__).resolve().parents[2] / "configs" / "tools_examples.yaml"
    assert main(["tools", "list", "--verbose", "--tools-config", str(config), "--json"]) == 0
