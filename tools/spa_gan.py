"""SpA-GAN cloud removal: a reimplementation of the upstream SPANet generator that loads the RICE checkpoints strictly.

Upstream: github.com/Penn000/SpA-GAN_for_cloud_removal (MIT), `models/gen/SPANet.py`. The generator is:
a 3x3 stem (3 -> 32, ReLU); 17 residual bottlenecks (1x1, 3x3 dilation 2, 1x1; no norm); ONE spatial attentive
module (SAM) evaluated after blocks 3, 6, 9 and 12, whose 1-channel map gates the residuals of blocks 4-15; a 3x3
head (32 -> 3). The SAM runs two rounds of IRNN (four one-pixel directional recurrences with depthwise 1x1 weights).
Upstream quirk kept on purpose: SAM computes direction-attention weights but multiplies them out of place and drops
the result, so they have no effect; we skip that computation (the parameters stay, so checkpoints load strictly).
I/O contract of the checkpoints: BGR floats in [0, 1], CHW; returns (attention, restored); restored is clipped to
[0, 1] and converted to 8 bits by truncation, as upstream's demo does (`(clip(x) * 255).astype("uint8")`).

    backend = SpaGan.from_weights("/path/RICE1/gen_model_epoch_200.pth")
    result = backend.restore(pil_image)   # -> CloudRemoval(restored=PIL RGB, attention=HxW float array)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from geopilot.cancellation import check_cancelled
from geopilot.tools.keymap import KeyRenames
from geopilot.tools.precision import check_precision
from geopilot.tools.weights import float_dtypes, load_strict, pick_device, place, read_state_dict, remap_keys

BACKEND = "spa_gan"
WIDTH = 32
N_BLOCKS = 17
GATED_BLOCKS = range(3, 15)  # 0-based indices of blocks 4..15, gated by the attention map
ATTENTION_AFTER = (3, 6, 9, 12)  # the shared SAM is re-evaluated before blocks 4, 7, 10, 13
VARIANTS = ("RICE1", "RICE2")
# Receptive radius: stem 1 + 17 dilated 3x3 blocks x 2 + 4 SAM passes x 2 (two one-pixel IRNN shifts) + head 1 = 44 px.
TILE_MARGIN = 48


class DilatedBottleneck(nn.Module):
    """1x1 -> ReLU -> 3x3 (dilation 2) -> ReLU -> 1x1, no bias; the caller adds the residual."""

    def __init__(self, width: int = WIDTH):
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 1, bias=False)
        self.conv2 = nn.Conv2d(width, width, 3, padding=2, dilation=2, bias=False)
        self.conv3 = nn.Conv2d(width, width, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv3(F.relu(self.conv2(F.relu(self.conv1(x)))))


class DirectionalRecurrence(nn.Module):
    """IRNN step: each pixel adds its neighbour's value (weighted per channel) in one of four directions, then ReLU.

    The first row/column in the direction of travel has no neighbour and keeps its input value.
    """

    def __init__(self, width: int = WIDTH):
        super().__init__()
        self.left = nn.Conv2d(width, width, 1, groups=width)
        self.right = nn.Conv2d(width, width, 1, groups=width)
        self.up = nn.Conv2d(width, width, 1, groups=width)
        self.down = nn.Conv2d(width, width, 1, groups=width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        left = torch.cat([x[..., :1], F.relu(self.left(x)[..., :-1] + x[..., 1:])], dim=3)
        right = torch.cat([F.relu(self.right(x)[..., 1:] + x[..., :-1]), x[..., -1:]], dim=3)
        up = torch.cat([x[..., :1, :], F.relu(self.up(x)[..., :-1, :] + x[..., 1:, :])], dim=2)
        down = torch.cat([F.relu(self.down(x)[..., 1:, :] + x[..., :-1, :]), x[..., -1:, :]], dim=2)
        return torch.cat([up, right, down, left], dim=1)  # upstream's concatenation order


class SpatialAttentiveModule(nn.Module):
    """SAM: 1x1 -> IRNN -> 1x1 -> IRNN -> 1x1 -> ReLU -> 1x1 -> sigmoid, a 1-channel attention map."""

    def __init__(self, width: int = WIDTH):
        super().__init__()
        self.proj_in = nn.Conv2d(width, width, 1)
        self.irnn1 = DirectionalRecurrence(width)
        self.fuse1 = nn.Conv2d(4 * width, width, 1)
        self.irnn2 = DirectionalRecurrence(width)
        self.fuse2 = nn.Conv2d(4 * width, width, 1)
        self.to_map = nn.Conv2d(width, 1, 1, bias=False)
        # Present in the checkpoints but without effect on the output upstream (see the module docstring).
        self.unused_conv_in = nn.Conv2d(width, width, 3, padding=1, bias=False)
        half = width // 2
        self.unused_direction_weights = nn.Sequential(
            nn.Conv2d(width, half, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(half, half, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(half, 4, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fuse1(self.irnn1(self.proj_in(x)))
        out = F.relu(self.fuse2(self.irnn2(out)))
        return torch.sigmoid(self.to_map(out))


class SpaNet(nn.Module):
    """The SpA-GAN generator; forward returns (attention map of the last SAM pass, restored image before clipping)."""

    def __init__(self, width: int = WIDTH):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.blocks = nn.ModuleList(DilatedBottleneck(width) for _ in range(N_BLOCKS))
        self.attention = SpatialAttentiveModule(width)
        self.head = nn.Conv2d(width, 3, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = F.relu(self.stem(x))
        attention = None
        for index, block in enumerate(self.blocks):
            check_cancelled()  # a timed-out call stops between blocks too (geopilot.cancellation; eager mode only)
            if index in ATTENTION_AFTER:
                attention = self.attention(out)
            residual = block(out)
            if index in GATED_BLOCKS:
                residual = residual * attention
            out = F.relu(residual + out)
        return attention, self.head(out)


# Upstream key -> our key (`geopilot.tools.keymap`), once the `Generator.gen (Sequential) .gen (SPANet)` nesting of
# upstream's generator is taken off.
_RENAMES = KeyRenames(
    [
        (r"conv_in\.0\.", "stem."),
        (r"conv_out\.0\.", "head."),
        (r"res_block(\d+)\.group1\.", lambda m: f"blocks.{int(m.group(1)) - 1}."),
        (r"SAM1\.conv_in\.", "attention.unused_conv_in."),
        (
            r"SAM1\.attention_layer\.conv([123])\.",
            lambda m: f"attention.unused_direction_weights.{2 * (int(m.group(1)) - 1)}.",
        ),
        (r"SAM1\.conv1\.", "attention.proj_in."),
        (r"SAM1\.conv2\.", "attention.fuse1."),
        (r"SAM1\.conv3\.", "attention.fuse2."),
        (r"SAM1\.conv_out\.", "attention.to_map."),
        (r"SAM1\.(irnn[12])\.(left|right|up|down)_weight\.", r"attention.\1.\2."),
    ]
)


def upstream_key_to_ours(key: str) -> str | None:
    return _RENAMES(key.removeprefix("gen.gen."))


@dataclass(frozen=True)
class CloudRemoval:
    restored: Image.Image  # 8-bit RGB, same size as the input
    attention: np.ndarray  # (H, W) float32 in [0, 1]: where the generator saw cloud


class SpaGan:
    """Cloud removal with one SpaNet. Images larger than `tile_size` run in tiles with a margin wider than the
    generator's receptive field, so the result equals a whole-image pass without its memory (0 = never tile)."""

    def __init__(self, model: SpaNet, device: torch.device, tile_size: int = 1024, tile_margin: int = TILE_MARGIN):
        self.model, self.device, self.tile_size, self.tile_margin = model, device, tile_size, tile_margin
        self.dtype = next(model.parameters()).dtype

    @classmethod
    def from_weights(
        cls, weights_path: str | Path, device: str = "cpu", precision: str = "fp32", tile_size: int = 1024
    ) -> SpaGan:
        precision = check_precision(BACKEND, precision)
        state = remap_keys(read_state_dict(weights_path), upstream_key_to_ours)
        model = SpaNet()
        load_strict(model, state, source=str(weights_path))
        chosen = pick_device(device)
        placed = place(model, chosen, precision, stored=float_dtypes(state), source=str(weights_path))
        return cls(placed, chosen, tile_size)

    @classmethod
    def tiny(cls, seed: int = 0, tile_size: int = 1024, tile_margin: int = TILE_MARGIN) -> SpaGan:
        """Random weights (the real generator is already small: 219,300 parameters)."""
        torch.manual_seed(seed)
        return cls(SpaNet().eval(), torch.device("cpu"), tile_size, tile_margin)

    @torch.inference_mode()
    def _forward(self, bgr_chw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = torch.from_numpy(np.ascontiguousarray(bgr_chw))[None].to(self.device, self.dtype)
        attention, out = self.model(x)
        return attention[0, 0].float().cpu().numpy(), out[0].float().cpu().numpy()

    def generate(self, bgr_chw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(3, H, W) BGR floats in [0, 1] -> (attention (H, W), restored (3, H, W) before clipping), tiled if large."""
        _, height, width = bgr_chw.shape
        tile = self.tile_size
        if tile <= 0 or (height <= tile and width <= tile):
            return self._forward(bgr_chw)
        margin = self.tile_margin
        attention = np.empty((height, width), dtype=np.float32)
        restored = np.empty((3, height, width), dtype=np.float32)
        for y0 in range(0, height, tile):
            for x0 in range(0, width, tile):
                y1, x1 = min(y0 + tile, height), min(x0 + tile, width)
                wy0, wx0 = max(0, y0 - margin), max(0, x0 - margin)
                wy1, wx1 = min(height, y1 + margin), min(width, x1 + margin)
                check_cancelled()  # a timed-out call stops here, between tiles (geopilot.cancellation)
                att, out = self._forward(bgr_chw[:, wy0:wy1, wx0:wx1])
                attention[y0:y1, x0:x1] = att[y0 - wy0 : y1 - wy0, x0 - wx0 : x1 - wx0]
                restored[:, y0:y1, x0:x1] = out[:, y0 - wy0 : y1 - wy0, x0 - wx0 : x1 - wx0]
        return attention, restored

    def restore(self, image: Image.Image) -> CloudRemoval:
        rgb = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
        attention, out = self.generate(rgb[:, :, ::-1].transpose(2, 0, 1))
        bgr = np.clip(out, 0.0, 1.0).transpose(1, 2, 0)
        restored = (bgr * 255.0).astype(np.uint8)[:, :, ::-1]  # truncation, as upstream; back to RGB
        return CloudRemoval(Image.fromarray(np.ascontiguousarray(restored), "RGB"), attention)
