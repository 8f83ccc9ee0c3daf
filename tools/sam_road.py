"""SAM-Road (road-network graph extraction) on transformers' SAM ViT image encoder.

Upstream: github.com/htcr/sam_road (MIT), `model.py::SAMRoad` with `USE_SAM_DECODER: False` (both released configs):
- image encoder: SAM ViT-B (`segment_anything.ImageEncoderViT`, img_size = PATCH_SIZE, window 14, global attention in
  blocks 2/5/8/11, 256-channel neck) -> transformers `SamVisionEncoder` (same computation; keys renamed below);
- map decoder ("naive"): 4 stride-2 transposed convs 256 -> 128 -> 64 -> 32 -> 2 with LayerNorm2d + GELU after the
  first and GELU after the next two; sigmoid channel 0 = keypoints (intersections), 1 = roads;
- TopoNet: point features bilinearly sampled from the encoder output (`grid_sample`, align_corners=False),
  Linear 256 -> 128 + ReLU; pair feature Linear([source, target, target - source offset]) -> 128 + ReLU; a 3-layer
  `nn.TransformerEncoder` (d=128, 4 heads, ff=128, ReLU, post-norm) over each point's neighbour pairs; Linear -> 1,
  sigmoid = edge probability.
Inference follows `inferencer.py`: SAM pixel mean/std on RGB 0-255; overlapping square patches (see
`geopilot.tools.sam_road_graph` for the patch grid and all graph post-processing). Differences from upstream, all at
the edges: the patch grid is upstream's at each preset's trained tile size (CityScale 2048 px with its 64 px blank
border, SpaceNet 400 px) and keeps upstream's spacing elsewhere (`sam_road_graph.patch_starts`); images smaller than
a patch are zero-padded (upstream needs >= PATCH_SIZE); non-square images get their own grid per axis (upstream:
square only). Both presets assume ~1 m/px imagery.

Weights: HF `congrui/sam_road` Lightning checkpoints (`cityscale_vitb_512_e10.ckpt`, `spacenet_vitb_256_e10.ckpt`;
`state_dict` with `image_encoder.*`, `map_decoder.*`, `topo_net.*`), or a safetensors file with our names.

    backend = SamRoad.from_weights("/w/sam_road/cityscale_vitb_512_e10.ckpt", preset="cityscale")
    graph = backend.extract(pil_image)   # -> geopilot.tool_output.RoadGraph (normalised nodes, undirected edges)
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from transformers import SamVisionConfig
from transformers.models.sam.modeling_sam import SamLayerNorm, SamVisionEncoder

from geopilot.errors import GeoPilotInputError, WeightsError
from geopilot.tool_output import RoadGraph
from geopilot.tools import weights as local_weights
from geopilot.tools.adapters import SamRoadOptions
from geopilot.tools.keymap import KeyRenames
from geopilot.tools.precision import PRECISIONS
from geopilot.tools.sam_road_graph import (
    PRESETS,
    PatchQuery,
    SamRoadPreset,
    graph_points,
    patch_windows,
    score_edges,
    to_road_graph,
    to_uint8,
)

BACKEND = "sam_road"
SAM_PIXEL_MEAN = (123.675, 116.28, 103.53)
SAM_PIXEL_STD = (58.395, 57.12, 57.375)
TOPO_HIDDEN, TOPO_HEADS, TOPO_LAYERS = 128, 4, 3


def vit_b_config(patch_size: int) -> SamVisionConfig:
    """SAM ViT-B as SAM-Road builds it: the stock ViT-B at img_size = PATCH_SIZE."""
    return SamVisionConfig(image_size=patch_size)


def tiny_config(patch_size: int = 64) -> SamVisionConfig:
    """A random-init encoder small enough for CPU unit tests."""
    return SamVisionConfig(
        image_size=patch_size,
        hidden_size=32,
        output_channels=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        mlp_dim=64,
        window_size=2,
        global_attn_indexes=[1],
    )


class TopoNet(nn.Module):
    """Upstream `TopoNet` (TOPONET_VERSION 'normal'): edge probability for each (source, target) point pair."""

    def __init__(self, feature_dim: int):
        super().__init__()
        self.feature_proj = nn.Linear(feature_dim, TOPO_HIDDEN)
        self.pair_proj = nn.Linear(2 * TOPO_HIDDEN + 2, TOPO_HIDDEN)
        layer = nn.TransformerEncoderLayer(
            TOPO_HIDDEN, TOPO_HEADS, dim_feedforward=TOPO_HIDDEN, dropout=0.1, activation="relu", batch_first=True
        )
        # Nested tensors would drop padded positions from the output; keep the full (samples, pairs) shape.
        self.transformer_encoder = nn.TransformerEncoder(layer, TOPO_LAYERS, enable_nested_tensor=False)
        self.output_proj = nn.Linear(TOPO_HIDDEN, 1)

    def forward(self, points, point_features, pairs, valid) -> torch.Tensor:
        """points (B, N, 2), point_features (B, N, D), pairs (B, S, K, 2), valid (B, S, K) -> (B, S, K) probs."""
        features = F.relu(self.feature_proj(point_features))
        batch, samples, k, _ = pairs.shape
        flat = pairs.reshape(batch, samples * k, 2)
        rows = torch.arange(batch, device=pairs.device)[:, None]
        source, target = flat[..., 0], flat[..., 1]
        offset = points[rows, target] - points[rows, source]
        pair = torch.cat([features[rows, source], features[rows, target], offset], dim=-1)
        pair = F.relu(self.pair_proj(pair)).reshape(batch * samples, k, TOPO_HIDDEN)
        valid = valid.reshape(batch * samples, k)
        valid = valid | ~valid.any(dim=-1, keepdim=True)  # an all-padding sample attends to everything (no NaN)
        pair = self.transformer_encoder(pair, src_key_padding_mask=~valid)
        return torch.sigmoid(self.output_proj(pair)).reshape(batch, samples, k)


def map_decoder(in_channels: int) -> nn.Sequential:
    """Upstream's naive decoder: x16 upsampling to 2 logit maps (keypoint, road); indices match the checkpoint."""
    return nn.Sequential(
        nn.ConvTranspose2d(in_channels, 128, kernel_size=2, stride=2),
        SamLayerNorm(128, eps=1e-6, data_format="channels_first"),
        nn.GELU(),
        nn.ConvTranspose2d(128, 64, kernel_size=2, stride=2),
        nn.GELU(),
        nn.ConvTranspose2d(64, 32, kernel_size=2, stride=2),
        nn.GELU(),
        nn.ConvTranspose2d(32, 2, kernel_size=2, stride=2),
    )


class SamRoadNet(nn.Module):
    def __init__(self, config: SamVisionConfig):
        super().__init__()
        self.patch_size = config.image_size
        self.image_encoder = SamVisionEncoder(config)
        self.map_decoder = map_decoder(config.output_channels)
        self.topo_net = TopoNet(config.output_channels)
        self.register_buffer("pixel_mean", torch.tensor(SAM_PIXEL_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(SAM_PIXEL_STD).view(1, 3, 1, 1), persistent=False)

    def masks_and_features(self, rgb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, 3, P, P) RGB 0-255 -> sigmoid masks (B, 2, P, P) and encoder features (B, D, P/16, P/16)."""
        x = (rgb - self.pixel_mean) / self.pixel_std
        features = self.image_encoder(pixel_values=x).last_hidden_state
        decoder_dtype = self.map_decoder[0].weight.dtype  # float32: the score maps before NMS (weights.place)
        return torch.sigmoid(self.map_decoder(features.to(decoder_dtype)).float()), features

    def edge_scores(self, features: torch.Tensor, points, pairs, valid) -> torch.Tensor:
        """Upstream `BilinearSampler` + TopoNet: points in patch pixels (x, y)."""
        grid = (points / self.patch_size * 2.0 - 1.0).unsqueeze(2).to(features.dtype)
        sampled = F.grid_sample(features, grid, mode="bilinear", align_corners=False)  # (B, D, N, 1)
        return self.topo_net(points.to(features.dtype), sampled.squeeze(-1).permute(0, 2, 1), pairs, valid)


# Upstream key (segment_anything ImageEncoderViT inside the Lightning module) -> transformers SamVisionEncoder key
# (`geopilot.tools.keymap`); SAM's own `pixel_mean`/`pixel_std` buffers are dropped (we hold them ourselves).
upstream_key_to_ours = KeyRenames(
    [
        (r"pixel_(mean|std)$", None),
        (r"image_encoder\.patch_embed\.proj\.", "image_encoder.patch_embed.projection."),
        (r"image_encoder\.blocks\.(\d+)\.norm([12])\.", r"image_encoder.layers.\1.layer_norm\2."),
        (r"image_encoder\.blocks\.(\d+)\.", r"image_encoder.layers.\1."),
        (r"image_encoder\.neck\.0\.", "image_encoder.neck.conv1."),
        (r"image_encoder\.neck\.1\.", "image_encoder.neck.layer_norm1."),
        (r"image_encoder\.neck\.2\.", "image_encoder.neck.conv2."),
        (r"image_encoder\.neck\.3\.", "image_encoder.neck.layer_norm2."),
    ]
)
_UPSTREAM_PREFIXES = ("image_encoder.", "map_decoder.", "topo_net.")


def is_upstream_state_dict(state: dict[str, torch.Tensor]) -> bool:
    return any(k.startswith(("image_encoder.blocks.", "image_encoder.patch_embed.proj.")) for k in state)


def load_sam_road_state(model: SamRoadNet, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Strict load of an upstream checkpoint (renamed) or of a state dict with our own names."""
    if is_upstream_state_dict(state):
        state = local_weights.remap_keys(state, upstream_key_to_ours)
    stray = sorted(k for k in state if not k.startswith(_UPSTREAM_PREFIXES))
    if stray:
        raise WeightsError(
            f"{source}: not a SAM-Road checkpoint: keys outside image_encoder/map_decoder/topo_net: "
            f"{', '.join(stray[:8])}{' ...' if len(stray) > 8 else ''}"
        )
    local_weights.load_strict(model, state, source=source)


def _preset(name: str) -> SamRoadPreset:
    if name not in PRESETS:
        raise GeoPilotInputError(f"unknown SAM-Road preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]


class SamRoad:
    """`extract(image) -> RoadGraph` with one SAM-Road network and one preset's thresholds."""

    def __init__(self, model: SamRoadNet, preset: SamRoadPreset, options: SamRoadOptions, device: torch.device):
        if model.patch_size != preset.patch_size:
            raise GeoPilotInputError(
                f"SAM-Road preset {preset.name!r} needs {preset.patch_size} px patches, the model takes "
                f"{model.patch_size} px"
            )
        self.model, self.preset, self.options, self.device = model, preset, options, device
        self.dtype = next(model.parameters()).dtype

    @classmethod
    def tiny(cls, seed: int = 0, patch_size: int = 64, preset: str = "cityscale", **options) -> SamRoad:
        """Random weights, tiny encoder; the preset's thresholds with its patch size replaced (outputs meaningless)."""
        torch.manual_seed(seed)
        base = _preset(preset)
        tiny_preset = replace(
            base, patch_size=patch_size, patch_stride=patch_size // 2, sample_margin=0, trained_image_size=None
        )
        model = SamRoadNet(tiny_config(patch_size)).eval()
        return cls(
            model, tiny_preset, SamRoadOptions(preset=preset, architecture="tiny", **options), torch.device("cpu")
        )

    @classmethod
    def from_weights(cls, weights_path: str | Path | None, device: str = "cpu", **options) -> SamRoad:
        opts = SamRoadOptions(**options)
        preset = _preset(opts.preset)
        checkpoint = local_weights.resolve_weights(BACKEND, weights_path, filename=preset.checkpoint)
        if checkpoint.is_dir():
            raise WeightsError(f"weights not found: put {preset.checkpoint} in {checkpoint}")
        config = vit_b_config(preset.patch_size) if opts.architecture == "vit-b" else tiny_config(preset.patch_size)
        target = local_weights.pick_device(device)
        parts = PRECISIONS[BACKEND].fp32_parts
        model = local_weights.load_checkpoint(
            SamRoadNet(config), checkpoint, load_sam_road_state, target, opts.precision, parts
        )
        return cls(model, preset, opts, target)

    @torch.inference_mode()
    def _fused_masks(self, rgb: np.ndarray, windows: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, list]:
        """Pass 1: per-patch masks averaged over overlaps (8-bit), and each patch's encoder features."""
        height, width, _ = rgb.shape
        size = self.preset.patch_size
        fused = torch.zeros(2, height, width, dtype=torch.float32)
        counter = torch.zeros(height, width, dtype=torch.float32)
        features = []
        pixels = torch.from_numpy(rgb).permute(2, 0, 1).float()
        for start in range(0, len(windows), self.options.batch_size):
            batch = windows[start : start + self.options.batch_size]
            patches = torch.stack([pixels[:, y : y + size, x : x + size] for x, y in batch])
            masks, feats = self.model.masks_and_features(patches.to(self.device, self.dtype))
            masks = masks.float().cpu()
            for (x, y), mask in zip(batch, masks, strict=True):
                fused[:, y : y + size, x : x + size] += mask
                counter[y : y + size, x : x + size] += 1.0
            features.extend(feats)
        fused = (fused / counter.clamp(min=1.0)).numpy()  # pixels no patch covers (sample margin) score 0
        return to_uint8(fused[0]), to_uint8(fused[1]), features

    def _scorer(self, features: list[torch.Tensor]):
        def score(patch_index: int, query: PatchQuery) -> np.ndarray:
            feats = features[patch_index][None]
            points = torch.as_tensor(query.points, dtype=torch.float32, device=self.device)[None]
            pairs = torch.as_tensor(query.pairs, dtype=torch.long, device=self.device)[None]
            valid = torch.as_tensor(query.valid, dtype=torch.bool, device=self.device)[None]
            with torch.inference_mode():
                return self.model.edge_scores(feats, points, pairs, valid)[0].float().cpu().numpy()

        return score

    def extract(self, image: Image.Image) -> RoadGraph:
        rgb = np.asarray(image.convert("RGB"), dtype=np.uint8)  # a 1-band image is replicated to RGB
        height, width, _ = rgb.shape
        size = self.preset.patch_size
        padded = np.zeros((max(height, size), max(width, size), 3), dtype=np.uint8)
        padded[:height, :width] = rgb
        windows = patch_windows(padded.shape[1], padded.shape[0], self.preset, self.options.sample_margin)
        if len(windows) > self.options.max_patches:
            raise GeoPilotInputError(
                f"a {width}x{height} scene needs {len(windows)} SAM-Road patches of {size} px (limit "
                f"{self.options.max_patches}); crop or downsample it to ~1 m/px tiles"
            )
        keypoint_mask, road_mask, features = self._fused_masks(padded, windows)
        keypoint_mask, road_mask = keypoint_mask[:height, :width], road_mask[:height, :width]
        points = graph_points(keypoint_mask, road_mask, self.preset)
        edges = score_edges(points, windows, self._scorer(features), self.preset) if len(points) else []
        return to_road_graph(points, edges, width, height)
