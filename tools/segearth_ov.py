"""SegEarth-OV: training-free open-vocabulary semantic segmentation of remote-sensing images with CLIP ViT-B/16.

A reimplementation of likyoo/SegEarth-OV (`segearth_segmentor.py`, its vendored open_clip `VisionTransformer.forward`
with `model_type='SegEarth'`, and SimFeatUp's `upsamplers.py`) on open_clip_torch, weights from local files only:
- last block: its attention is replaced by softmax(q q^T s) + softmax(k k^T s) + softmax(v v^T s) applied to v, then
  `out_proj`; the residual and the MLP are dropped (`ignore_residual=True`); then `ln_post` and `proj`. The cls token
  goes through the same modified block;
- global bias alleviation: patch logits get `cls_token_lambda * (cls . text)` added (lambda = -0.3);
- upsampling: SimFeatUp JBU (joint bilateral, guided by the normalised crop); `jbu_one` (one shared radius-5 layer
  applied 4 times, the paper's default, `xclip_jbu_one_million_aid.ckpt`) or `jbu_stack` (4 radius-3 layers), with
  FeatUp's CUDA `AdaptiveConv` done in PyTorch (unfold for small maps, a loop over offsets for large ones);
  `bilinear` is upstream's `feature_up=False` path (patch-level logits, bilinearly resized) for when no JBU
  checkpoint is at hand;
- text: each query is embedded with the 80 OpenAI ImageNet templates (open_clip's `OPENAI_IMAGENET_TEMPLATES`, the
  same list as upstream's), normalised, averaged, normalised; comma-separated synonyms in a class name are separate
  queries merged by max;
- inference: long side resized to 448 as mmcv's `imrescale` does it (OpenCV's 8-bit bilinear resize,
  `geopilot.tools.cv2_resize`), 224 crops with stride 112 (padded to the patch size), logits averaged,
  resized to the input size, x50, softmax; pixels whose best probability is below `prob_threshold` go to the
  background class, which is the first query ("background" unless the classes name one themselves).
Outputs: one `SegmentClass` per requested class present (area fraction + COCO RLE). Tests: `tests/tools/test_segearth*.py`.
Against upstream: `tests/tools/test_segearth_ov_upstream.py` mirrors upstream's modules (file and line cited) and
compares on the same random weights in fp32: logits within 1e-5, identical label maps. Checked once before, outside
the repo: image tokens and cls of ViT-B/16 equal to 3e-6; `JBUStack` with the real `clip_jbu_stack_cocostuff.ckpt`
equal to 1.3e-6.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import numpy as np
import open_clip
import torch
import torch.nn.functional as F
from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES
from PIL import Image
from pydantic import Field
from torch import nn

from geopilot.config import StrictConfig
from geopilot.errors import GeoPilotInputError, WeightsError
from geopilot.tool_output import SegmentClass
from geopilot.tools import weights as local_weights
from geopilot.tools.canonical import segment_class
from geopilot.tools.cv2_resize import resize_bilinear_uint8
from geopilot.tools.precision import precision_setting

BACKEND = "segearth_ov"
CLIP_FILE = "open_clip_model.safetensors"  # an open_clip state dict of OpenAI CLIP ViT-B/16
CLIP_FILES = (CLIP_FILE, "open_clip_pytorch_model.bin")  # the names open_clip's own weight files carry
UPSAMPLER_FILES = {"jbu_one": "xclip_jbu_one_million_aid.ckpt", "jbu_stack": "clip_jbu_stack_cocostuff.ckpt"}
CLIP_MEAN = (122.771, 116.746, 104.094)  # OpenAI CLIP mean/std on 0-255 RGB, as upstream's data preprocessor
CLIP_STD = (68.501, 66.632, 70.323)
UNFOLD_MAX_ELEMENTS = 1 << 25  # 128 MB of fp32: above it the JBU kernels loop over offsets instead of unfolding
TINY_CLIP = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 64, "layers": 2, "width": 32, "patch_size": 16, "head_width": 16},
    "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


class SegEarthOptions(StrictConfig):
    model_name: str = "ViT-B-16"  # open_clip architecture name
    quick_gelu: bool = True  # OpenAI CLIP weights were trained with QuickGELU
    upsampler: Literal["jbu_one", "jbu_stack", "bilinear"] = "jbu_one"
    upsampler_path: str | None = None  # default: <weights folder>/<UPSAMPLER_FILES[upsampler]>
    cls_token_lambda: float = -0.3
    logit_scale: float = Field(50.0, gt=0.0)
    prob_threshold: float = Field(0.1, ge=0.0, le=1.0)  # upstream's OpenEarthMap prob_thd; per call: segment(...)
    background: str = "background"
    long_side: int = Field(448, ge=16)
    slide_crop: int = Field(224, ge=16)
    slide_stride: int = Field(112, ge=1)
    max_output_pixels: int = Field(4_000_000, ge=1)  # above this, labels are computed small and resized (nearest)
    text_batch: int = Field(256, ge=1)
    precision: precision_setting("segearth_ov") = "fp32"  # upstream's; fp16 (CUDA) allowed


def _windows(padded: torch.Tensor, size: int, height: int, width: int):
    """Every (i, j) offset of a size x size window over `padded`, in `F.unfold` order (row-major)."""
    for i in range(size):
        for j in range(size):
            yield i * size + j, padded[:, :, i : i + height, j : j + width]


def adaptive_conv(padded: torch.Tensor, filters: torch.Tensor) -> torch.Tensor:
    """FeatUp's AdaptiveConv: out[b,c,h,w] = sum_ij padded[b,c,h+i,w+j] * filters[b,h,w,i,j].

    Small inputs take SimFeatUp's unfold+einsum path; large ones loop over the k*k offsets, which keeps memory at one
    feature map (unfolding ViT-B/16 features at 224 px with radius 5 would hold 12 GB).
    """
    b, c = padded.shape[:2]
    _, h, w, k, _ = filters.shape
    flat = filters.reshape(b, h, w, k * k)
    if c * k * k * h * w <= UNFOLD_MAX_ELEMENTS:
        patches = F.unfold(padded, k).view(b, c, k * k, h, w)
        return (patches * flat.permute(0, 3, 1, 2)[:, None]).sum(2)
    out = padded.new_zeros((b, c, h, w))
    for p, window in _windows(padded, k, h, w):
        out.addcmul_(window, flat[:, None, :, :, p])
    return out


class JBULearnedRange(nn.Module):
    """SimFeatUp's joint bilateral upsampling layer (2x), parameter names as in its checkpoints."""

    def __init__(self, guidance_dim: int = 3, key_dim: int = 32, radius: int = 3):
        super().__init__()
        self.radius, self.diameter, self.key_dim = radius, 2 * radius + 1, key_dim
        self.range_temp = nn.Parameter(torch.tensor(0.0))
        self.range_proj = nn.Sequential(
            nn.Conv2d(guidance_dim, key_dim, 1), nn.GELU(), nn.Dropout2d(0.1), nn.Conv2d(key_dim, key_dim, 1)
        )
        d2 = self.diameter**2
        self.fixup_proj = nn.Sequential(
            nn.Conv2d(guidance_dim + d2, d2, 1), nn.GELU(), nn.Dropout2d(0.1), nn.Conv2d(d2, d2, 1)
        )
        self.sigma_spatial = nn.Parameter(torch.tensor(1.0))

    def range_kernel(self, guidance: torch.Tensor) -> torch.Tensor:
        b, _, h, w = guidance.shape
        proj = self.range_proj(guidance)
        padded = F.pad(proj, [self.radius] * 4, mode="reflect")
        d2 = self.diameter**2
        if self.key_dim * d2 * h * w <= UNFOLD_MAX_ELEMENTS:
            queries = F.unfold(padded, self.diameter).view(b, self.key_dim, d2, h, w)
            similarity = (queries * proj[:, :, None]).sum(1)
        else:
            similarity = torch.stack([(window * proj).sum(1) for _, window in _windows(padded, self.diameter, h, w)], 1)
        temperature = self.range_temp.exp().clamp(1e-4, 1e4)
        return F.softmax(temperature * similarity, dim=1)

    def spatial_kernel(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        steps = torch.linspace(-1, 1, self.diameter, device=device, dtype=dtype)
        x, y = torch.meshgrid(steps, steps, indexing="ij")
        return torch.exp(-(x.square() + y.square()) / (2 * self.sigma_spatial**2)).reshape(1, self.diameter**2, 1, 1)

    def forward(self, source: torch.Tensor, guidance: torch.Tensor) -> torch.Tensor:
        b, _, h, w = guidance.shape
        kernel = self.range_kernel(guidance) * self.spatial_kernel(source.device, guidance.dtype)
        kernel = kernel / kernel.sum(1, keepdim=True).clamp(1e-7)
        kernel = kernel + 0.1 * self.fixup_proj(torch.cat([kernel, guidance], dim=1))
        kernel = kernel.permute(0, 2, 3, 1).reshape(b, h, w, self.diameter, self.diameter)
        high = F.interpolate(source, (h, w), mode="bicubic", align_corners=False)
        return adaptive_conv(F.pad(high, [self.radius] * 4, mode="reflect"), kernel.to(high.dtype))


def _guided(source: torch.Tensor, guidance: torch.Tensor, layer: JBULearnedRange) -> torch.Tensor:
    h, w = source.shape[-2:]
    return layer(source, F.adaptive_avg_pool2d(guidance, (h * 2, w * 2)))


class JBUOne(nn.Module):
    """One shared radius-5 JBU layer applied four times (16x), the SegEarth-OV default."""

    def __init__(self, feat_dim: int):
        super().__init__()
        self.up = JBULearnedRange(radius=5)
        self.fixup_proj = nn.Sequential(nn.Dropout2d(0.2), nn.Conv2d(feat_dim, feat_dim, 1))

    def forward(self, source: torch.Tensor, guidance: torch.Tensor) -> torch.Tensor:
        for _ in range(4):
            source = _guided(source, guidance, self.up)
        return self.fixup_proj(source) * 0.1 + source


class JBUStack(nn.Module):
    """Four radius-3 JBU layers (16x), SimFeatUp's `jbu_stack`."""

    def __init__(self, feat_dim: int):
        super().__init__()
        self.up1, self.up2, self.up3, self.up4 = (JBULearnedRange(radius=3) for _ in range(4))
        self.fixup_proj = nn.Sequential(nn.Dropout2d(0.2), nn.Conv2d(feat_dim, feat_dim, 1))

    def forward(self, source: torch.Tensor, guidance: torch.Tensor) -> torch.Tensor:
        for layer in (self.up1, self.up2, self.up3, self.up4):
            source = _guided(source, guidance, layer)
        return self.fixup_proj(source) * 0.1 + source


UPSAMPLERS: dict[str, type[nn.Module]] = {"jbu_one": JBUOne, "jbu_stack": JBUStack}


def segearth_attention(attn: nn.MultiheadAttention, x: torch.Tensor) -> torch.Tensor:
    """SegEarth's last-block attention on batch-first tokens x (B, N, D): (qq + kk + vv self-similarity) @ v."""
    batch, tokens, dim = x.shape
    heads = attn.num_heads
    scale = (dim // heads) ** -0.5
    q, k, v = (
        t.reshape(batch, tokens, heads, -1).transpose(1, 2)
        for t in F.linear(x, attn.in_proj_weight, attn.in_proj_bias).chunk(3, -1)
    )
    weights = sum(F.softmax((t @ t.transpose(-1, -2)) * scale, dim=-1) for t in (q, k, v))
    out = (weights @ v).transpose(1, 2).reshape(batch, tokens, dim)
    return attn.out_proj(out)


def _position_embedding(visual, grid: tuple[int, int]) -> torch.Tensor:
    pos = visual.positional_embedding
    cls_pos, patch_pos = pos[:1], pos[1:]
    side = int(math.sqrt(patch_pos.shape[0]))
    if (side, side) == grid:
        return pos
    patch_pos = patch_pos.reshape(1, side, side, -1).permute(0, 3, 1, 2)
    # upstream's `interpolate_pos_encoding`: a scale factor with +0.1 (DINO's trick), not a target size
    scale = ((grid[0] + 0.1) / side, (grid[1] + 0.1) / side)
    patch_pos = F.interpolate(patch_pos.float(), scale_factor=scale, mode="bicubic").to(pos.dtype)
    return torch.cat([cls_pos, patch_pos.permute(0, 2, 3, 1).reshape(grid[0] * grid[1], -1)])


def segearth_image_tokens(visual, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cls (B, E), patch tokens (B, h*w, E)) from an open_clip VisionTransformer with SegEarth's last block."""
    x = visual.conv1(pixels)
    grid = tuple(x.shape[-2:])
    x = x.flatten(2).transpose(1, 2)
    cls = visual.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)
    x = torch.cat([cls, x], dim=1) + _position_embedding(visual, grid).to(x.dtype)
    x = visual.ln_pre(visual.patch_dropout(x))
    blocks = visual.transformer.resblocks
    for block in blocks[:-1]:
        x = block(x)
    last = blocks[-1]
    x = visual.ln_post(segearth_attention(last.attn, last.ln_1(x)))
    x = x @ visual.proj
    return x[:, 0], x[:, 1:]


def _check_visual(visual) -> None:
    """The reimplementation covers open_clip's plain CLIP ViT (cls-token pooling, batch-first blocks)."""
    ok = (
        getattr(visual, "attn_pool", None) is None
        and getattr(visual, "pool_type", "tok") == "tok"
        and not getattr(visual, "final_ln_after_pool", False)
        and getattr(visual.transformer, "batch_first", True)
        and visual.proj is not None
    )
    if not ok:
        raise WeightsError(
            f"{type(visual).__name__}: SegEarth-OV needs a plain open_clip ViT (cls pooling, projection)"
        )


def _pad_to_patch(crop: torch.Tensor, patch: int) -> tuple[torch.Tensor, tuple[int, int, int, int]]:
    """Upstream `compute_padsize`: pad (left, right, top, bottom) to a multiple of the patch size."""
    h, w = crop.shape[-2:]
    lr, tb = (-w) % patch, (-h) % patch
    pad = (lr // 2, lr - lr // 2, tb // 2, tb - tb // 2)
    return (F.pad(crop, pad) if any(pad) else crop), pad


def _queries(classes: list[str], background: str) -> tuple[list[str], list[int], int, bool]:
    """Text queries, the class index of each, the background class index, and whether background was requested."""
    names = [[s.strip() for s in c.split(",") if s.strip()] for c in classes]
    requested_bg = next((i for i, n in enumerate(names) if n and n[0].lower() == background.lower()), None)
    groups = names if requested_bg is not None else [[background], *names]
    queries = [q for group in groups for q in group]
    index = [i for i, group in enumerate(groups) for _ in group]
    return queries, index, (requested_bg if requested_bg is not None else 0), requested_bg is not None


class SegEarthOV:
    """`segment(image, classes) -> list[SegmentClass]` with SegEarth-OV."""

    def __init__(
        self, clip: nn.Module, tokenizer, upsampler: nn.Module | None, options: SegEarthOptions, device: torch.device
    ):
        _check_visual(clip.visual)
        self.clip, self.tokenizer, self.upsampler = clip, tokenizer, upsampler
        self.options, self.device = options, device
        self.patch = int(clip.visual.conv1.kernel_size[0])
        self._text_cache: dict[str, torch.Tensor] = {}

    @classmethod
    def tiny(cls, seed: int = 0, **options) -> SegEarthOV:
        """Random weights, tiny sizes: for tests and dry runs (outputs are meaningless)."""
        torch.manual_seed(seed)
        opts = SegEarthOptions(**{"long_side": 96, "slide_crop": 64, "slide_stride": 32, **options})
        clip = open_clip.model.CLIP(**TINY_CLIP, quick_gelu=opts.quick_gelu).eval()
        tokenizer = open_clip.tokenizer.SimpleTokenizer(context_length=TINY_CLIP["text_cfg"]["context_length"])
        upsampler = None if opts.upsampler == "bilinear" else UPSAMPLERS[opts.upsampler](TINY_CLIP["embed_dim"]).eval()
        return cls(clip, tokenizer, upsampler, opts, torch.device("cpu"))

    @classmethod
    def from_weights(cls, weights_path: str | None, device: str = "cpu", **options) -> SegEarthOV:
        opts = SegEarthOptions(**options)
        clip_file = local_weights.resolve_weights(BACKEND, weights_path, filename=CLIP_FILE)
        if clip_file.is_dir():
            found = [clip_file / name for name in CLIP_FILES if (clip_file / name).is_file()]
            if not found:
                raise WeightsError(f"weights not found: put {CLIP_FILE} in {clip_file}")
            clip_file = found[0]
        clip = open_clip.create_model(opts.model_name, pretrained=None, force_quick_gelu=opts.quick_gelu)
        try:
            state = local_weights.read_state_dict(clip_file)
        except WeightsError as err:
            if clip_file.suffix != ".pt":
                raise
            raise WeightsError(
                f"{err} (OpenAI's TorchScript .pt is not loaded; save `model.state_dict()` of an open_clip model instead)"
            ) from None
        local_weights.load_strict(clip, state, source=str(clip_file))
        upsampler = None
        if opts.upsampler != "bilinear":
            name = UPSAMPLER_FILES[opts.upsampler]
            path = Path(opts.upsampler_path) if opts.upsampler_path else clip_file.parent / name
            if not path.is_file():
                raise WeightsError(
                    f"weights not found: put {name} at {path} (or set upsampler_path, or upsampler='bilinear')"
                )
            upsampler = UPSAMPLERS[opts.upsampler](clip.visual.output_dim)
            load_upsampler(upsampler, path)
        target = local_weights.pick_device(device)
        stored = local_weights.float_dtypes(state)
        clip = local_weights.place(clip, target, opts.precision, stored=stored, source=str(clip_file))
        if upsampler is not None:
            upsampler = local_weights.place(upsampler, target, opts.precision)
        return cls(clip, open_clip.get_tokenizer(opts.model_name), upsampler, opts, target)

    @property
    def dtype(self) -> torch.dtype:
        return self.clip.visual.proj.dtype

    @torch.no_grad()
    def text_features(self, queries: list[str]) -> torch.Tensor:
        """(len(queries), E): template-averaged, normalised text embeddings (cached per query)."""
        missing = [q for q in queries if q not in self._text_cache]
        for query in missing:
            tokens = self.tokenizer([template(query) for template in OPENAI_IMAGENET_TEMPLATES]).to(self.device)
            parts = [
                self.clip.encode_text(tokens[i : i + self.options.text_batch])
                for i in range(0, len(tokens), self.options.text_batch)
            ]
            feats = F.normalize(torch.cat(parts).float(), dim=-1).mean(0)
            self._text_cache[query] = F.normalize(feats, dim=0)
        return torch.stack([self._text_cache[q] for q in queries])

    def _crop_logits(self, crop: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """(1, Q, h, w) cosine logits for one normalised crop (upstream `forward_feature`)."""
        h, w = crop.shape[-2:]
        padded, (left, _, top, _) = _pad_to_patch(crop, self.patch)
        cls, tokens = segearth_image_tokens(self.clip.visual, padded.to(self.dtype))
        gh, gw = padded.shape[-2] // self.patch, padded.shape[-1] // self.patch
        feats = tokens.transpose(1, 2).reshape(1, -1, gh, gw)
        if self.upsampler is not None:
            feats = self.upsampler(feats, padded.to(self.dtype))
        feats = F.normalize(feats.float(), dim=1)
        logits = torch.einsum("bchw,qc->bqhw", feats, text)
        logits = logits + self.options.cls_token_lambda * (F.normalize(cls.float(), dim=-1) @ text.T)[:, :, None, None]
        logits = F.interpolate(logits, size=padded.shape[-2:], mode="bilinear", align_corners=False)
        return logits[:, :, top : top + h, left : left + w]

    def _slide(self, pixels: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """Sliding-window logits averaged over overlaps (upstream `forward_slide`), (1, Q, H, W)."""
        o = self.options
        _, _, height, width = pixels.shape
        rows = max(height - o.slide_crop + o.slide_stride - 1, 0) // o.slide_stride + 1
        cols = max(width - o.slide_crop + o.slide_stride - 1, 0) // o.slide_stride + 1
        total = pixels.new_zeros((1, text.shape[0], height, width))
        count = pixels.new_zeros((1, 1, height, width))
        for r in range(rows):
            for c in range(cols):
                y2, x2 = min(r * o.slide_stride + o.slide_crop, height), min(c * o.slide_stride + o.slide_crop, width)
                y1, x1 = max(y2 - o.slide_crop, 0), max(x2 - o.slide_crop, 0)
                total[:, :, y1:y2, x1:x2] += self._crop_logits(pixels[:, :, y1:y2, x1:x2], text)
                count[:, :, y1:y2, x1:x2] += 1
        return total / count

    def _pixels(self, image: Image.Image) -> torch.Tensor:
        width, height = image.size
        scale = self.options.long_side / max(width, height)
        size = (max(1, int(width * scale + 0.5)), max(1, int(height * scale + 0.5)))
        if self.upsampler is not None and min(size) < 3 * self.patch:
            raise GeoPilotInputError(
                f"image {width}x{height} is too thin for SegEarth-OV: its short side becomes {min(size)} px at "
                f"long side {self.options.long_side}, below {3 * self.patch} px"
            )
        rgb = np.asarray(image.convert("RGB"), dtype=np.uint8)
        array = resize_bilinear_uint8(rgb, *size).astype(np.float32)  # mmseg Resize(keep_ratio=True) -> cv2
        array = (array - np.array(CLIP_MEAN, dtype=np.float32)) / np.array(CLIP_STD, dtype=np.float32)
        return torch.from_numpy(array).permute(2, 0, 1)[None].to(self.device)

    @torch.no_grad()
    def label_map(
        self, image: Image.Image, classes: list[str], prob_threshold: float | None = None
    ) -> tuple[np.ndarray, list[int], int, bool]:
        """(H, W) class indices into [background?] + classes, plus the query->class index, background index, flag."""
        o = self.options
        threshold = o.prob_threshold if prob_threshold is None else prob_threshold
        queries, index, background, requested_bg = _queries(classes, o.background)
        text = self.text_features(queries)
        logits = self._slide(self._pixels(image), text)
        width, height = image.size
        full = width * height <= o.max_output_pixels
        if full:
            logits = F.interpolate(logits, size=(height, width), mode="bilinear", align_corners=False)
        probs = (logits[0] * o.logit_scale).softmax(0)
        query_class = torch.tensor(index, device=probs.device)
        class_probs = torch.stack([probs[query_class == k].max(0).values for k in range(max(index) + 1)])
        best, labels = class_probs.max(0)
        labels[best < threshold] = background
        labels = labels.cpu().numpy().astype(np.int32)
        if not full:
            labels = np.asarray(Image.fromarray(labels).resize((width, height), Image.Resampling.NEAREST))
        return labels, index, background, requested_bg

    def segment(
        self, image: Image.Image, classes: list[str], prob_threshold: float | None = None
    ) -> list[SegmentClass]:
        """One SegmentClass per class present. `prob_threshold` overrides the option for this call (the adapter
        passes the threshold upstream tuned for the class file its prompts come from, `geopilot.vocabulary`)."""
        names = list(dict.fromkeys(c.strip() for c in classes))
        if not names or any(not [s for s in n.split(",") if s.strip()] for n in names):
            raise GeoPilotInputError("SegEarth-OV needs at least one non-empty class name")
        labels, _, _, requested_bg = self.label_map(image, names, prob_threshold)
        offset = 0 if requested_bg else 1  # class k of `names` is label k + offset
        out = []
        for k, name in enumerate(names):
            mask = labels == k + offset
            if mask.any():
                out.append(segment_class(name, mask))
        return out


def load_upsampler(upsampler: nn.Module, path) -> None:
    """A SimFeatUp Lightning checkpoint: `state_dict` keys under `upsampler.`, loaded strictly."""
    state = local_weights.read_state_dict(path)
    stray = sorted(k for k in state if not k.startswith("upsampler."))
    if stray:
        raise WeightsError(f"{path}: keys outside `upsampler.` ({len(stray)}): {', '.join(stray[:12])}")
    local_weights.load_strict(upsampler, {k.removeprefix("upsampler."): v for k, v in state.items()}, source=str(path))
