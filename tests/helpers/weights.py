"""Where the real weights are (the shared folder CI keeps the real checkpoints in) and the tool-test fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "tools" / "fixtures"


def weights_candidate() -> Path:
    """$GEOPILOT_WEIGHTS_DIR if set, else <repo>/../shared/weights (where CI keeps the real checkpoints)."""
    root = os.environ.get("GEOPILOT_WEIGHTS_DIR")
    return Path(root) if root else REPO.parent / "shared" / "weights"


def spa_gan_checkpoint(variant: str = "RICE1") -> Path:
    path = weights_candidate() / "spa_gan" / variant / "gen_model_epoch_200.pth"
    if not path.is_file():
        pytest.skip(f"real SpA-GAN weights absent: {path} not found (set GEOPILOT_WEIGHTS_DIR)")
    return path


def bit_cd_checkpoint() -> Path:
    """Upstream's released BIT_LEVIR checkpoint in the shared weights folder (skips when absent)."""
    path = weights_candidate() / "bit_cd" / "BIT_LEVIR" / "best_ckpt.pt"
    if not path.is_file():
        pytest.skip(f"real BIT weights absent: {path} not found (set GEOPILOT_WEIGHTS_DIR)")
    return path
