"""Shared fixtures: a small optical + SAR dataset on disk, and argv builders for in-process `train.main` runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from geopilot.data_gen.synthetic.samples import write_demo_dataset

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # train.py is a top-level script, not part of the package
sys.path.insert(0, str(Path(__file__).parent))  # train_helpers


@pytest.fixture(scope="session")
def dataset(tmp_path_factory) -> Path:
    """24 optical + 12 SAR samples with PNG images, in the real JSONL format."""
    return write_demo_dataset(tmp_path_factory.mktemp("data"), optical=24, sar=12, seed=0)


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """accelerate keeps process-wide singletons; in-process runs with different settings need them cleared."""
    yield
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
