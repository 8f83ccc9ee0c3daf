"""`geopilot weights check`: the shipped SpA-GAN weights present with their published hash, the other backends
missing with the files named, a corrupted copy reported as a wrong hash; exit 2 while a backend cannot load. A
folder with extra, renamed, empty or truncated files: each named, nothing loaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.weights import spa_gan_checkpoint

from geopilot.cli import main


def _check(capsys) -> tuple[int, dict]:
    code = main(["weights", "check", "--json"])
    return code, {entry["backend"]: entry for entry in json.loads(capsys.readouterr().out)}


def test_shipped_spa_gan_present_the_rest_missing_and_a_corrupt_copy(tmp_path, monkeypatch, capsys):
    shipped = spa_gan_checkpoint().parent.parent  # <weights>/spa_gan
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(tmp_path))
    shutil.copytree(shipped, tmp_path / "spa_gan")
    code, report = _check(capsys)
    assert code == 2
    assert report["spa_gan"]["status"] == "present" and report["spa_gan"]["tools"] == ["remove_clouds"]
    assert report["remotesam"]["status"] == "missing" and "checkpoint.pth" in report["remotesam"]["detail"]
    assert (
        report["segearth_ov"]["status"] == "missing"
        and "open_clip_model.safetensors" in report["segearth_ov"]["detail"]
    )
    assert report["sam_road"]["status"] == "missing" and ".ckpt" in report["sam_road"]["detail"]

    corrupt = tmp_path / "spa_gan" / "RICE1" / "gen_model_epoch_200.pth"
    corrupt.chmod(0o644)
    data = bytearray(corrupt.read_bytes())
    data[100] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    code, report = _check(capsys)
    assert (
        report["spa_gan"]["status"] == "wrong hash" and "RICE1/gen_model_epoch_200.pth" in report["spa_gan"]["detail"]
    )


def test_human_output_names_each_backend_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(tmp_path))
    assert main(["weights", "check"]) == 2
    lines = [line.split()[0] for line in capsys.readouterr().out.splitlines() if not line.startswith(" ")]
    assert "spa_gan" in lines and lines.count("remotesam") == 1


def _entry(capsys, backend: str) -> dict:
    _, report = _check(capsys)
    return report[backend]


def _safetensors(path: Path) -> Path:
    import numpy as np
    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"visual.proj": np.ones((64, 64), dtype=np.float32)}, str(path))
    return path


def _zip_checkpoint(path: Path) -> Path:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {"w": torch.ones(64, 64)}}, path)
    return path


def _cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    ("backend", "name", "write"),
    [
        ("segearth_ov", "open_clip_model.safetensors", _safetensors),  # safetensors: shorter than its header says
        ("denodet", "denodet.pth", _zip_checkpoint),  # torch.save's zip format: no end record
    ],
)
def test_a_truncated_checkpoint_is_named_and_never_loaded(tmp_path, monkeypatch, capsys, backend, name, write):
    from geopilot.errors import WeightsError
    from geopilot.tools.registry import BACKENDS, load_tools_config, weights_path

    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(tmp_path))
    path = write(tmp_path / backend / name)
    assert _entry(capsys, backend)["status"] == "present"  # the whole file passes
    _cut(path)
    entry = _entry(capsys, backend)
    assert entry["status"] == "truncated" and str(path) in entry["detail"], entry
    binding = next(b for b in load_tools_config(None).tools.values() if b.backend == backend)
    options = BACKENDS[backend].options_model.model_validate(binding.options)
    with pytest.raises(WeightsError, match=f"truncated: {path}"):  # what every load asks first: nothing is read
        weights_path(binding, options)


def test_an_empty_checkpoint_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(tmp_path))
    (tmp_path / "denodet").mkdir()
    (tmp_path / "denodet" / "denodet.pth").write_bytes(b"")
    entry = _entry(capsys, "denodet")
    assert entry["status"] == "empty" and "denodet.pth is 0 bytes" in entry["detail"]


def test_a_renamed_or_misplaced_file_is_named_where_the_expected_one_is_missing(tmp_path, monkeypatch, capsys):
    shutil.copytree(spa_gan_checkpoint().parent.parent, tmp_path / "spa_gan")  # from the real weights folder
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(tmp_path))
    checkpoint = tmp_path / "spa_gan" / "RICE1" / "gen_model_epoch_200.pth"
    checkpoint.rename(checkpoint.with_name("gen_model.pth"))
    entry = _entry(capsys, "spa_gan")
    assert entry["status"] == "missing"
    assert "RICE1/gen_model_epoch_200.pth" in entry["detail"] and "RICE1/gen_model.pth" in entry["detail"]
    (tmp_path / "sam_road").mkdir()
    assert "the folder is empty" in _entry(capsys, "sam_road")["detail"]
    assert "the folder does not exist" in _entry(capsys, "remotesam")["detail"]


def test_a_truncated_legacy_pickle_is_a_wrong_hash(tmp_path, monkeypatch, capsys):
    """SpA-GAN's published files are legacy pickles (no framing to read): their hash tells."""
    shutil.copytree(spa_gan_checkpoint().parent.parent, tmp_path / "spa_gan")  # from the real weights folder
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(tmp_path))
    checkpoint = tmp_path / "spa_gan" / "RICE1" / "gen_model_epoch_200.pth"
    checkpoint.chmod(0o644)
    _cut(checkpoint)
    entry = _entry(capsys, "spa_gan")
    assert entry["status"] == "wrong hash" and str(checkpoint) in entry["detail"]
