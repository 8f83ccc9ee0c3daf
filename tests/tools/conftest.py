"""Shared helpers for the tool-layer tests: where the real SpA-GAN weights are, small images and records."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.weights import spa_gan_checkpoint, weights_candidate


@pytest.fixture
def weights_root(monkeypatch) -> Path:
    """The shared weights folder, exported as $GEOPILOT_WEIGHTS_DIR (skips when absent)."""
    spa_gan_checkpoint()
    root = weights_candidate()
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(root))
    return root
