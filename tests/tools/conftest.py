"""Shared helpers for the tool-layer tests: where the real SpA-GAN weights are, small images and records."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def shared_weights_root() -> Path | None:
    """$GEOPILOT_WEIGHTS_DIR if set, else <repo>/../shared/weights (where CI keeps the real checkpoints)."""
    root = os.environ.get("GEOPILOT_WEIGHTS_DIR")
    candidate = Path(root) if root else REPO.parent / "shared" / "weights"
    return candidate if candidate.is_dir() else None


def spa_gan_checkpoint(variant: str = "RICE1") -> Path:
    root = shared_weights_root()
    path = root / "spa_gan" / variant / "gen_model_epoch_200.pth" if root else None
    if path is None or not path.is_file():
        pytest.skip(f"real SpA-GAN weights absent (looked for spa_gan/{variant}/gen_model_epoch_200.pth under {root})")
    return path


@pytest.fixture
def weights_root(monkeypatch) -> Path:
    """The shared weights folder, exported as $GEOPILOT_WEIGHTS_DIR (skips when absent)."""
    spa_gan_checkpoint()
    root = shared_weights_root()
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(root))
    return root
