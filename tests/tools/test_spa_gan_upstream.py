"""SpA-GAN against upstream's generator in fp32 (issue 23 item 6): same random weights, and the shipped RICE1 weights.

Upstream: github.com/Penn000/SpA-GAN_for_cloud_removal at 63f9866, `models/gen/SPANet.py`; it imports nothing we lack
but sits in an unpackaged repo, so the module is reimplemented below with upstream's module and parameter names
(its state dict is upstream's, key for key) and upstream's forward step for step, line numbers cited:
- `Bottleneck` L17-31: group1 = conv1 (1x1) -> ReLU -> conv2 (3x3, dilation 2) -> ReLU -> conv3 (1x1), no bias;
- `irnn_layer` L33-51: clones of x, rows/columns 1.. overwritten by ReLU(w * neighbour + x), returned as
  (up, right, down, left);
- `Attention` L54-72 and `SAM` L75-121: the direction weights are computed (L96) and multiplied out of place
  (L102-105, L112-115: results dropped); `conv_in` and `relu1` exist but are never called;
- `SPANet.forward` L153-185: one SAM1 evaluated four times, blocks 4-15 gated; returns (Attention4, out);
- `Generator` L187-200: `gen` Sequential holding `gen` (keys `gen.gen.*`); `weights_init` (`models_utils.py` L2-8)
  draws every conv weight from N(0, 0.02), biases keep torch's default init.
Our `SpaGan` takes upstream's state dict through `geopilot.tools.spa_gan.upstream_key_to_ours` (keymap rules).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from helpers.weights import FIXTURES, spa_gan_checkpoint
from PIL import Image
from torch import nn

from geopilot.tools.spa_gan import SpaGan, SpaNet, upstream_key_to_ours
from geopilot.tools.weights import load_strict, remap_keys

FP32_TOLERANCE = 1e-5  # same float32 ops in the same order (concatenation vs clone-and-assign): measured 0.0


class UpstreamBottleneck(nn.Module):  # SPANet.py L17-31
    def __init__(self):
        super().__init__()
        self.group1 = nn.Sequential()
        self.group1.add_module("conv1", nn.Conv2d(32, 32, 1, bias=False))
        self.group1.add_module("relu1", nn.ReLU(True))
        self.group1.add_module("conv2", nn.Conv2d(32, 32, 3, padding=2, dilation=2, bias=False))
        self.group1.add_module("relu2", nn.ReLU(True))
        self.group1.add_module("conv3", nn.Conv2d(32, 32, 1, bias=False))
        self.relu = nn.Sequential(nn.ReLU(True))  # L27: defined, never called

    def forward(self, x):
        return self.group1(x)


class UpstreamIrnn(nn.Module):  # SPANet.py L33-51
    def __init__(self, channels: int = 32):
        super().__init__()
        for side in ("left", "right", "up", "down"):
            setattr(self, f"{side}_weight", nn.Conv2d(channels, channels, 1, groups=channels))

    def forward(self, x):
        _, _, h, w = x.shape
        left, right, up, down = x.clone(), x.clone(), x.clone(), x.clone()
        left[:, :, :, 1:] = F.relu(self.left_weight(x)[:, :, :, : w - 1] + x[:, :, :, 1:])
        right[:, :, :, :-1] = F.relu(self.right_weight(x)[:, :, :, 1:] + x[:, :, :, : w - 1])
        up[:, :, 1:, :] = F.relu(self.up_weight(x)[:, :, : h - 1, :] + x[:, :, 1:, :])
        down[:, :, :-1, :] = F.relu(self.down_weight(x)[:, :, 1:, :] + x[:, :, : h - 1, :])
        return up, right, down, left


class UpstreamAttention(nn.Module):  # SPANet.py L54-72
    def __init__(self, channels: int = 32):
        super().__init__()
        half = channels // 2
        self.conv1 = nn.Conv2d(channels, half, 3, padding=1)
        self.conv2 = nn.Conv2d(half, half, 3, padding=1)
        self.conv3 = nn.Conv2d(half, 4, 1)

    def forward(self, x):
        return torch.sigmoid(self.conv3(F.relu(self.conv2(F.relu(self.conv1(x))))))


class UpstreamSam(nn.Module):  # SPANet.py L75-121
    def __init__(self, channels: int = 32):
        super().__init__()
        self.irnn1, self.irnn2 = UpstreamIrnn(channels), UpstreamIrnn(channels)
        self.conv_in = nn.Conv2d(channels, channels, 3, padding=1, bias=False)  # L81: never called
        self.conv1 = nn.Conv2d(channels, channels, 1)
        self.conv2 = nn.Conv2d(4 * channels, channels, 1)
        self.conv3 = nn.Conv2d(4 * channels, channels, 1)
        self.attention_layer = UpstreamAttention(channels)
        self.conv_out = nn.Conv2d(channels, 1, 1, bias=False)

    def forward(self, x):
        weight = self.attention_layer(x)  # L96
        parts = self.irnn1(self.conv1(x))
        for i, part in enumerate(parts):
            part.mul(weight[:, i : i + 1])  # L102-105: out of place, result dropped (upstream's quirk)
        parts = self.irnn2(self.conv2(torch.cat(parts, dim=1)))
        for i, part in enumerate(parts):
            part.mul(weight[:, i : i + 1])  # L112-115
        out = F.relu(self.conv3(torch.cat(parts, dim=1)))
        return torch.sigmoid(self.conv_out(out))


class UpstreamSpaNet(nn.Module):  # SPANet.py L124-185
    def __init__(self):
        super().__init__()
        self.conv_in = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.ReLU(True))
        self.SAM1 = UpstreamSam()
        for i in range(1, 18):
            setattr(self, f"res_block{i}", UpstreamBottleneck())
        self.conv_out = nn.Sequential(nn.Conv2d(32, 3, 3, padding=1, bias=False))

    def forward(self, x):
        out = self.conv_in(x)
        attention = None
        for i in range(1, 18):
            if i in (4, 7, 10, 13):  # L160, L165, L170, L175
                attention = self.SAM1(out)
            block = getattr(self, f"res_block{i}")(out)
            out = F.relu((block * attention if 4 <= i <= 15 else block) + out)
        return attention, self.conv_out(out)


class UpstreamGenerator(nn.Module):  # SPANet.py L187-200 (CPU: no data_parallel)
    def __init__(self):
        super().__init__()
        self.gen = nn.Sequential()
        self.gen.add_module("gen", UpstreamSpaNet())

    def forward(self, x):
        return self.gen(x)


def random_upstream(seed: int) -> UpstreamGenerator:
    """Upstream's generator with random weights. Upstream's `weights_init` (N(0, 0.02)) leaves outputs near 0.01,
    where every difference would drown; N(0, 0.1) conv weights and U(-0.5, 0.5) biases give outputs of order 1."""
    torch.manual_seed(seed)
    model = UpstreamGenerator().eval()
    for param in model.parameters():
        param.data.normal_(0.0, 0.1) if param.dim() > 1 else param.data.uniform_(-0.5, 0.5)
    return model


def _ours_from(state: dict[str, torch.Tensor]) -> SpaNet:
    ours = SpaNet().eval()
    load_strict(ours, remap_keys(state, upstream_key_to_ours), source="upstream state dict")
    return ours


def _fixed_input(seed: int, height: int, width: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).random((1, 3, height, width), dtype=np.float32))


def test_same_random_weights_give_upstreams_attention_and_output_in_fp32():
    upstream = random_upstream(23)
    state = upstream.state_dict()
    assert len(state) == 83 and all(k.startswith("gen.gen.") for k in state)
    ours = _ours_from(state)
    for seed, h, w in ((0, 40, 56), (1, 33, 27)):
        x = _fixed_input(seed, h, w)
        with torch.no_grad():
            up_att, up_out = upstream(x)
            our_att, our_out = ours(x)
        assert our_out.shape == up_out.shape == (1, 3, h, w) and our_att.shape == up_att.shape == (1, 1, h, w)
        assert (our_out - up_out).abs().max().item() <= FP32_TOLERANCE
        assert (our_att - up_att).abs().max().item() <= FP32_TOLERANCE
        assert up_out.abs().max().item() > 0.5 and up_att.std().item() > 1e-3  # order-1 outputs, a varying gate


def test_the_comparison_sees_a_changed_block():
    """The comparison can fail: a 1.5x larger weight in block 15 moves the output well past the tolerance."""
    upstream = random_upstream(23)
    ours = _ours_from(upstream.state_dict())
    x = _fixed_input(0, 40, 56)
    with torch.no_grad():
        _, expected = upstream(x)
        ours.blocks[14].conv3.weight.mul_(1.5)
        _, moved = ours(x)
    assert (moved - expected).abs().max().item() > 100 * FP32_TOLERANCE


def test_rice1_checkpoint_gives_upstreams_own_fp32_output():
    """The shipped RICE1 weights in both: float outputs within FP32_TOLERANCE, 8-bit images identical, and equal
    to `fixtures/spagan_rice1_expected_64.png`, which upstream's own code wrote (see tests/tools/test_spa_gan.py)."""
    path = spa_gan_checkpoint("RICE1")
    state = torch.load(path, map_location="cpu", weights_only=True)
    upstream = UpstreamGenerator().eval()
    upstream.load_state_dict(state, strict=True)
    backend = SpaGan.from_weights(path, device="cpu", precision="fp32", tile_size=0)
    rgb = np.asarray(Image.open(FIXTURES / "spagan_rice1_input_64.png").convert("RGB"), dtype=np.float32) / 255.0
    bgr = np.ascontiguousarray(rgb[:, :, ::-1].transpose(2, 0, 1))
    with torch.no_grad():
        up_att, up_out = (t[0].numpy() for t in upstream(torch.from_numpy(bgr)[None]))
    our_att, our_out = backend.generate(bgr)
    assert np.abs(our_out - up_out).max() <= FP32_TOLERANCE
    assert np.abs(our_att - up_att[0]).max() <= FP32_TOLERANCE
    upstream_rgb = (np.clip(up_out, 0, 1) * 255).transpose(1, 2, 0).astype("uint8")[:, :, ::-1]  # demo.py L55-56
    ours_rgb = np.asarray(backend.restore(Image.fromarray((rgb * 255).round().astype("uint8"))).restored)
    expected = np.asarray(Image.open(FIXTURES / "spagan_rice1_expected_64.png").convert("RGB"))
    assert np.array_equal(upstream_rgb, expected)  # the reimplementation above is upstream's code's output
    assert np.array_equal(ours_rgb, expected)
