"""`tools list` says `ready` only when every file the backend loads is there (tools/weight_files.py), and loading
refuses the same folders with the same words."""

from __future__ import annotations

import json

import pytest

from geopilot.cli import main
from geopilot.errors import WeightsError
from geopilot.tools.registry import BACKENDS, load_tools_config, weights_path

CONFIG = {  # a tool of each backend, bound as configs/tools.yaml binds them
    "segearth_ov": "segment_semantic",
    "lae_dino": "detect_objects",
    "denodet": "sar_detect_all",
}


def _rows(capsys) -> dict:
    assert main(["tools", "list", "--json"]) == 0
    return {row["name"]: row for row in json.loads(capsys.readouterr().out)}


@pytest.mark.parametrize(
    ("backend", "files", "missing"),
    [
        ("segearth_ov", ["README.md"], "open_clip_model.safetensors"),
        ("lae_dino", ["bert-base-uncased/vocab.txt"], "*.pth"),
        ("denodet", ["notes.txt"], "*.pth"),
    ],
)
def test_a_folder_without_its_checkpoint_is_not_ready(tmp_path, monkeypatch, capsys, backend, files, missing):
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(tmp_path))
    for name in files:
        (tmp_path / backend / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / backend / name).write_text("x")
    tool = CONFIG[backend]
    config = load_tools_config(None)
    if config.tools[tool].backend != backend:
        pytest.skip(f"{tool} is bound to {config.tools[tool].backend} in configs/tools.yaml")
    row = _rows(capsys)[tool]
    assert row["status"] == "weights missing" and missing in row["status_detail"], row
    binding = config.tools[tool]
    with pytest.raises(WeightsError, match="weights not found"):
        weights_path(binding, BACKENDS[backend].options_model.model_validate(binding.options))


def test_two_candidate_checkpoints_are_ambiguous(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(tmp_path))
    (tmp_path / "denodet").mkdir()
    for name in ("a.pth", "b.safetensors"):
        (tmp_path / "denodet" / name).write_bytes(b"")
    row = _rows(capsys)["sar_detect_all"]
    if row["backend"] != "denodet":
        pytest.skip("sar_detect_all is not bound to denodet")
    assert row["status"] == "weights missing" and "ambiguous: 2 files" in row["status_detail"]
