"""SpA-GAN: strict load of the real RICE checkpoints and parity with the upstream implementation.

How the expected output was obtained (once, outside the repo; nothing of upstream is committed):
1. Upstream code: `github:Penn000/SpA-GAN_for_cloud_removal` at commit 63f9866 ("Update README.md"), exported with
   `git --git-dir=<snapshot> archive HEAD models | tar x -C /tmp/spagan_upstream`.
2. Input: `fixtures/spagan_rice1_input_64.png`, a deterministic 64x64 RGB image (numpy default_rng(20261201):
   colour gradient + N(0, 12) noise, with a Gaussian white "cloud" blob of sigma 11 px centred at (40, 24)).
3. In /tmp/spagan_upstream, a script following upstream `demo.py`: `gen = Generator(gpu_ids=[])`,
   `gen.load_state_dict(torch.load(RICE1/gen_model_epoch_200.pth, map_location="cpu"))`, image read as BGR float
   /255 in CHW (PIL + channel reversal in place of `cv2.imread`, identical for an 8-bit PNG), `att, out = gen(x)`,
   `(np.clip(out, 0, 1) * 255).astype("uint8")`, channels reversed back to RGB and saved as
   `fixtures/spagan_rice1_expected_64.png` (torch 2.14.1 CPU). Our reimplementation matched it exactly (max diff 0).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers.weights import FIXTURES, spa_gan_checkpoint
from PIL import Image

from geopilot.cli import main
from geopilot.errors import WeightsError
from geopilot.tools.spa_gan import SpaGan, SpaNet, upstream_key_to_ours

INPUT = FIXTURES / "spagan_rice1_input_64.png"
EXPECTED = FIXTURES / "spagan_rice1_expected_64.png"


def test_key_map_covers_every_upstream_key_of_both_checkpoints():
    for variant in ("RICE1", "RICE2"):
        state = torch.load(spa_gan_checkpoint(variant), map_location="cpu", weights_only=True)
        assert len(state) == 83
        assert {upstream_key_to_ours(k) for k in state} == set(SpaNet().state_dict())


def test_real_checkpoint_loads_strictly_with_219300_parameters():
    backend = SpaGan.from_weights(spa_gan_checkpoint(), device="cpu")
    assert sum(p.numel() for p in backend.model.parameters()) == 219_300


def test_checkpoint_with_an_extra_key_is_rejected_with_its_name(tmp_path):
    state = torch.load(spa_gan_checkpoint(), map_location="cpu", weights_only=True)
    state["gen.gen.res_block18.group1.conv1.weight"] = torch.zeros(32, 32, 1, 1)
    path = tmp_path / "extra.pth"
    torch.save(state, path)
    with pytest.raises(WeightsError, match=r"unexpected keys \(1\): blocks\.17\.conv1\.weight"):
        SpaGan.from_weights(path)


def test_cli_remove_clouds_matches_upstream_output(tmp_path, weights_root, capsys):
    out = tmp_path / "out"
    code = main(["tools", "run", "remove_clouds", "--image", str(INPUT), "--out", str(out), "device=cpu", "--json"])
    assert code == 0, capsys.readouterr().err
    report = json.loads((out / "output.json").read_text())
    assert report["ok"] and report["output"]["provenance"] == "model"
    (artifact,) = report["output"]["artifacts"]
    assert artifact["kind"] == "image" and artifact["path"].startswith(str(out))
    restored = np.asarray(Image.open(artifact["path"]).convert("RGB"), dtype=np.int16)
    expected = np.asarray(Image.open(EXPECTED).convert("RGB"), dtype=np.int16)
    assert restored.shape == expected.shape == (64, 64, 3)
    assert np.abs(restored - expected).max() <= 1
    # the generator really changed the image (the cloud blob), so equality is not trivially input == output
    assert np.abs(np.asarray(Image.open(INPUT), dtype=np.int16) - expected).max() > 30


def test_tiny_random_generator_keeps_size_and_range():
    result = SpaGan.tiny(seed=0).restore(Image.new("RGB", (37, 23), (200, 210, 220)))
    assert result.restored.size == (37, 23) and result.restored.mode == "RGB"
    assert result.attention.shape == (23, 37)
    assert 0.0 <= float(result.attention.min()) <= float(result.attention.max()) <= 1.0


def test_tiled_restoration_equals_one_whole_image_pass():
    rng = np.random.default_rng(3)
    bgr = rng.random((3, 40, 120), dtype=np.float32)  # two tiles side by side
    whole_att, whole = SpaGan.tiny(seed=1, tile_size=0).generate(bgr)
    tiled_att, tiled = SpaGan.tiny(seed=1, tile_size=64).generate(bgr)
    assert np.abs(tiled - whole).max() < 1e-4 and np.abs(tiled_att - whole_att).max() < 1e-4
    # the margin is what makes it exact: without one, the tiles differ at the seams
    seams, _ = SpaGan.tiny(seed=1, tile_size=64, tile_margin=0).generate(bgr)
    assert np.abs(seams - whole_att).max() > 1e-3
