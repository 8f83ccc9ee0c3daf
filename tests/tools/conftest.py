"""Shared helpers for the tool-layer tests: where the real SpA-GAN weights are, small images and records."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def weights_candidate() -> Path:
    """$GEOPILOT_WEIGHTS_DIR if set, else <repo>/../shared/weights (where CI keeps the real checkpoints)."""
    root = os.environ.get("GEOPILOT_WEIGHTS_DIR")
    return Path(root) if root else REPO.parent / "shared" / "weights"


def spa_gan_checkpoint(variant: str = "RICE1") -> Path:
    path = weights_candidate() / "spa_gan" / variant / "gen_model_epoch_200.pth"
    if not path.is_file():
        pytest.skip(f"real SpA-GAN weights absent: {path} not found (set GEOPILOT_WEIGHTS_DIR)")
    return path


@pytest.fixture
def weights_root(monkeypatch) -> Path:
    """The shared weights folder, exported as $GEOPILOT_WEIGHTS_DIR (skips when absent)."""
    spa_gan_checkpoint()
    root = weights_candidate()
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(root))
    return root
