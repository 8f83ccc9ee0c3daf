"""One word per meaning (issue 39): renamed settings and commands keep their released names working for one release,
each saying its new name in one line; `geopilot train` is train.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from geopilot.errors import ConfigError
from geopilot.training.config import current_settings, load_train_config

ROOT = Path(__file__).resolve().parents[2]
STAGE2 = ROOT / "configs" / "tiny" / "stage2.yaml"


def test_data_alpha_is_read_as_replay_alpha_with_one_deprecation_line(capsys):
    assert load_train_config(STAGE2, ["data.alpha=0.4"]).data.replay_alpha == 0.4  # overrides the YAML's key
    assert capsys.readouterr().err.strip() == "warning: data.alpha is deprecated, use data.replay_alpha"


def test_data_alpha_beside_replay_alpha_is_an_error(tmp_path):
    config = tmp_path / "stage2.yaml"
    config.write_text(STAGE2.read_text(encoding="utf-8").replace("replay_alpha: 0.2", "alpha: 0.2"), encoding="utf-8")
    assert load_train_config(config).data.replay_alpha == 0.2
    assert load_train_config(config, ["data.replay_alpha=0.3"]).data.replay_alpha == 0.3
    with pytest.raises(ConfigError, match="data.alpha and data.replay_alpha are one setting; keep data.replay_alpha"):
        load_train_config(config, ["data.alpha=0.3", "data.replay_alpha=0.3"])


def test_a_run_recorded_with_data_alpha_has_the_same_identity():
    assert current_settings({"data.alpha": 0.2, "optim.lr": 1e-3}) == {"data.replay_alpha": 0.2, "optim.lr": 1e-3}
