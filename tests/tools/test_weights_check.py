"""`geopilot weights check`: the shipped SpA-GAN weights present with their published hash, the other backends
missing with the files named, a corrupted copy reported as a wrong hash; exit 2 while a backend cannot load."""

from __future__ import annotations

import json
import shutil

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
