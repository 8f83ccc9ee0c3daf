"""SegEarth-OV against upstream's pipeline in fp32 on the same random weights (issue 23 item 6).

Upstream: github.com/likyoo/SegEarth-OV at 3e22a96 (no licence: reimplemented here from the source, lines cited).
Its modules need mmseg/mmengine and FeatUp's CUDA kernel, so they are mirrored step for step:
- `open_clip/transformer.py` L502-569 `VisionTransformer.forward(model_type='SegEarth', ignore_residual=True,
  output_cls_token=True)`: blocks but the last, then only `custom_attn(last.attn, last.ln_1(x))` (L616-678, the
  'SegEarth' branch: softmax(qq)+softmax(kk)+softmax(vv) @ v, out_proj), ln_post, cls/tokens, @ proj; positional
  embedding interpolated with scale factors (grid + 0.1) / side (L571-590). The vendored transformer runs LND; open_clip
  3.x blocks are batch-first, so the blocks get NLD and custom_attn its LND input, as upstream's;
- `simfeatup_dev/upsamplers.py` L202-275 `JBULearnedRange`, L300-322 `JBUOne`, with the repo's own
  `adaptive_conv_py_simple` (L14-25) for FeatUp's CUDA `AdaptiveConv`;
- `segearth_segmentor.py` L129-146 (text features), L162-219 `forward_feature`, L221-276 `forward_slide`, L300-325
  `postprocess_result`, L327-339 `compute_padsize`; the test pipeline `configs/cfg_openearthmap.py` (Resize to 448,
  keep_ratio) is mmcv's cv2 resize (`geopilot.tools.cv2_resize`, tested against OpenCV in test_cv2_resize.py).
Weights: the CLIP is open_clip's, whose state-dict names upstream's vendored copy shares (identity key map); the JBU
module is built upstream-side and its state dict loaded into ours strictly (same names as its checkpoints').
Text: the tiny CLIP's context is 32 tokens, so both sides use its 32-token tokenizer instead of `tokenize` (77).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES
from PIL import Image
from torch import nn

from geopilot.tools.cv2_resize import resize_bilinear_uint8
from geopilot.tools.segearth_ov import CLIP_MEAN, CLIP_STD, JBUOne, SegEarthOV

LOGIT_TOLERANCE = 1e-5  # fp32, same operations in another order (einsum vs bmm): measured below 1e-6


class UpstreamJBULearnedRange(nn.Module):  # upsamplers.py L202-275
    def __init__(self, guidance_dim=3, key_dim=32, radius=5):
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

    def get_range_kernel(self, x):  # L230-238
        b, _, h, w = x.shape
        proj = self.range_proj(x)
        padded = F.pad(proj, [self.radius] * 4, mode="reflect")
        queries = nn.Unfold(self.diameter)(padded).reshape(b, self.key_dim, self.diameter**2, h, w)
        queries = queries.permute(0, 1, 3, 4, 2)
        temp = self.range_temp.exp().clamp_min(1e-4).clamp_max(1e4)
        return F.softmax(temp * torch.einsum("bchwp,bchw->bphw", queries, proj), dim=1)

    def get_spatial_kernel(self, device):  # L240-251
        steps = torch.linspace(-1, 1, self.diameter, device=device)
        x, y = torch.meshgrid(steps, steps, indexing="ij")
        patch = torch.cat([x[None], y[None]], dim=0)
        return torch.exp(-patch.square().sum(0) / (2 * self.sigma_spatial**2)).reshape(1, self.diameter**2, 1, 1)

    def forward(self, source, guidance):  # L253-275
        b, _, h, w = guidance.shape
        kernel = self.get_range_kernel(guidance) * self.get_spatial_kernel(source.device)
        kernel /= kernel.sum(1, keepdim=True).clamp(1e-7)
        kernel += 0.1 * self.fixup_proj(torch.cat([kernel, guidance], dim=1))
        kernel = kernel.permute(0, 2, 3, 1).reshape(b, h, w, self.diameter, self.diameter)
        high = nn.Upsample((h, w), mode="bicubic", align_corners=False)(source)
        padded = F.pad(high, [self.radius] * 4, mode="reflect")
        filters = kernel.reshape(b, h, w, self.diameter**2)  # adaptive_conv_py_simple, L14-25
        patches = nn.Unfold(self.diameter)(padded).view(b, padded.shape[1], self.diameter**2, h, w)
        return torch.einsum("bhwf,bcfhw->bchw", filters, patches)


class UpstreamJBUOne(nn.Module):  # upsamplers.py L300-322
    def __init__(self, feat_dim):
        super().__init__()
        self.up = UpstreamJBULearnedRange(radius=5)
        self.fixup_proj = nn.Sequential(nn.Dropout2d(0.2), nn.Conv2d(feat_dim, feat_dim, 1))

    def forward(self, source, guidance):
        for _ in range(4):
            _, _, h, w = source.shape
            source = self.up(source, F.adaptive_avg_pool2d(guidance, (h * 2, w * 2)))
        return self.fixup_proj(source) * 0.1 + source


def upstream_custom_attn(attn, x):  # transformer.py L616-678, model_type 'SegEarth'; x is (tokens, batch, dim)
    num_heads = attn.num_heads
    tokens, bsz, dim = x.size()
    scale = (dim // num_heads) ** -0.5
    q, k, v = F.linear(x, attn.in_proj_weight, attn.in_proj_bias).chunk(3, dim=-1)
    q, k, v = (t.contiguous().view(-1, bsz * num_heads, dim // num_heads).transpose(0, 1) for t in (q, k, v))
    weights = sum(F.softmax(torch.bmm(t, t.transpose(1, 2)) * scale, dim=-1) for t in (q, k, v))
    out = torch.bmm(weights, v).transpose(0, 1).contiguous().view(-1, bsz, dim)
    return attn.out_proj(out)


def upstream_visual(visual, x):  # transformer.py L502-569 (+ interpolate_pos_encoding L571-590)
    _, _, w, h = x.shape
    x = visual.conv1(x)
    x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)
    x = torch.cat([visual.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1), x], dim=1)
    pos = visual.positional_embedding
    if x.shape[1] != pos.shape[0]:
        n, dim = pos.shape[0] - 1, x.shape[-1]
        w0, h0 = w // visual.patch_size[0] + 0.1, h // visual.patch_size[1] + 0.1
        side = int(math.sqrt(n))
        patch = F.interpolate(
            pos[1:].reshape(1, side, side, dim).permute(0, 3, 1, 2),
            scale_factor=(w0 / math.sqrt(n), h0 / math.sqrt(n)),
            mode="bicubic",
        )
        pos = torch.cat((pos[[0]][None], patch.permute(0, 2, 3, 1).view(1, -1, dim)), dim=1)
    x = visual.ln_pre(visual.patch_dropout(x + pos.to(x.dtype)))
    for block in visual.transformer.resblocks[:-1]:
        x = block(x)  # open_clip 3.x: batch-first blocks (upstream's vendored copy: LND, same math)
    last = visual.transformer.resblocks[-1]
    x = upstream_custom_attn(last.attn, last.ln_1(x).permute(1, 0, 2)).permute(1, 0, 2)
    x = visual.ln_post(x)
    return x[:, 0] @ visual.proj, x[:, 1:] @ visual.proj


class UpstreamSegEarth:
    """segearth_segmentor.py: the parts of `SegEarthSegmentation` the OpenEarthMap config runs, in fp32."""

    def __init__(self, clip, tokenizer, upsampler, query_words, query_idx, cls_token_lambda=-0.3, prob_thd=0.1):
        self.net, self.upsampler, self.patch = clip, upsampler, clip.visual.patch_size[0]
        self.cls_token_lambda, self.prob_thd, self.query_idx = cls_token_lambda, prob_thd, torch.tensor(query_idx)
        features = []
        with torch.no_grad():  # L129-146
            for word in query_words:
                feature = clip.encode_text(tokenizer([t(word) for t in OPENAI_IMAGENET_TEMPLATES]))
                feature /= feature.norm(dim=-1, keepdim=True)
                feature = feature.mean(dim=0)
                features.append((feature / feature.norm())[None])
        self.query_features = torch.cat(features)

    def forward_feature(self, img):  # L162-219
        cls, feats = upstream_visual(self.net.visual, img)
        cls = cls / cls.norm(dim=-1, keepdim=True)
        cls_logits = cls @ self.query_features.T
        fh, fw = img.shape[-2] // self.patch, img.shape[-1] // self.patch
        feats = feats.permute(0, 2, 1).reshape(1, -1, fh, fw)
        feats = self.upsampler(feats, img)
        feats = feats.reshape(1, feats.shape[1], -1).permute(0, 2, 1)
        feats = feats / feats.norm(dim=-1, keepdim=True)
        logits = feats @ self.query_features.T + cls_logits * self.cls_token_lambda
        logits = logits.permute(0, 2, 1).reshape(1, -1, img.shape[-2], img.shape[-1])
        return F.interpolate(logits, size=img.shape[-2:], mode="bilinear")

    def forward_slide(self, img, ori_shape, stride, crop):  # L221-276
        _, _, h_img, w_img = img.shape
        h_grids = max(h_img - crop + stride - 1, 0) // stride + 1
        w_grids = max(w_img - crop + stride - 1, 0) // stride + 1
        preds = img.new_zeros((1, len(self.query_idx), h_img, w_img))
        count = img.new_zeros((1, 1, h_img, w_img))
        for hi in range(h_grids):
            for wi in range(w_grids):
                y2, x2 = min(hi * stride + crop, h_img), min(wi * stride + crop, w_img)
                y1, x1 = max(y2 - crop, 0), max(x2 - crop, 0)
                crop_img = img[:, :, y1:y2, x1:x2]
                hh, ww = crop_img.shape[2:]
                lr, tb = (self.patch - ww % self.patch) % self.patch, (self.patch - hh % self.patch) % self.patch
                pad = (lr // 2, lr - lr // 2, tb // 2, tb - tb // 2)  # compute_padsize L327-339
                if any(pad):
                    crop_img = F.pad(crop_img, pad)
                logit = self.forward_feature(crop_img)
                if any(pad):
                    logit = logit[:, :, pad[2] : pad[2] + hh, pad[0] : pad[0] + ww]
                preds += F.pad(logit, (x1, w_img - x2, y1, h_img - y2))
                count[:, :, y1:y2, x1:x2] += 1
        return F.interpolate(preds / count, size=ori_shape, mode="bilinear")

    def postprocess(self, logits, logit_scale=50):  # L300-325
        logits = (logits[0] * logit_scale).softmax(0)
        num_cls, num_q = int(self.query_idx.max()) + 1, len(self.query_idx)
        if num_cls != num_q:
            one_hot = F.one_hot(self.query_idx).T.view(num_cls, num_q, 1, 1)
            logits = (logits[None] * one_hot).max(1)[0]
        pred = logits.argmax(0, keepdim=True)
        pred[logits.max(0, keepdim=True)[0] < self.prob_thd] = 0
        return pred[0]


def _image(seed: int, width: int, height: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([120 + 90 * np.sin(x / 9.0), 110 + 80 * np.cos(y / 7.0), 100 + 70 * np.sin((x + y) / 11.0)], -1)
    return Image.fromarray(np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8))


def _pair(seed: int):
    ours = SegEarthOV.tiny(seed=seed, upsampler="jbu_one", prob_threshold=0.1)
    torch.manual_seed(100 + seed)
    upstream_jbu = UpstreamJBUOne(32).eval()
    with torch.no_grad():  # spread the range/fixup weights so the upsampler's kernels are far from uniform
        for param in upstream_jbu.parameters():
            param.mul_(3.0)
    ours.upsampler.load_state_dict(upstream_jbu.state_dict(), strict=True)  # upstream names == ours
    return ours, upstream_jbu


@pytest.mark.parametrize(("seed", "width", "height"), [(0, 150, 100), pytest.param(1, 90, 120, marks=pytest.mark.slow)])
def test_same_random_weights_give_upstreams_logits_and_label_map_in_fp32(seed, width, height):
    classes = ["building,roof", "road", "water"]
    ours, upstream_jbu = _pair(seed)
    queries = ["background"] + [q for c in classes for q in c.split(",")]
    index = [0] + [i + 1 for i, c in enumerate(classes) for _ in c.split(",")]
    upstream = UpstreamSegEarth(ours.clip, ours.tokenizer, upstream_jbu, queries, index)
    image = _image(seed, width, height)
    o = ours.options
    scale = o.long_side / max(width, height)
    size = (int(width * scale + 0.5), int(height * scale + 0.5))  # mmcv rescale_size
    array = resize_bilinear_uint8(np.asarray(image), *size).astype(np.float32)
    pixels = torch.from_numpy((array - np.float32(CLIP_MEAN)) / np.float32(CLIP_STD)).permute(2, 0, 1)[None]
    with torch.no_grad():
        expected = upstream.forward_slide(pixels, (height, width), o.slide_stride, o.slide_crop)
        text = ours.text_features(queries)
        assert (text - upstream.query_features).abs().max().item() <= LOGIT_TOLERANCE
        got = F.interpolate(ours._slide(ours._pixels(image), text), size=(height, width), mode="bilinear")
    assert got.shape == expected.shape == (1, len(queries), height, width)
    assert (got - expected).abs().max().item() <= LOGIT_TOLERANCE
    assert expected.std().item() > 1e-3  # logits that vary, so the label map is not trivially constant
    labels, *_ = ours.label_map(image, classes)
    upstream_labels = upstream.postprocess(expected).numpy()
    assert np.array_equal(labels, upstream_labels)
    assert len(np.unique(labels)) >= 2


def test_the_comparison_sees_a_missing_bias_removal():
    """It can fail: without the cls-token bias removal (lambda 0 instead of -0.3) the logits move past it."""
    ours, upstream_jbu = _pair(0)
    upstream = UpstreamSegEarth(ours.clip, ours.tokenizer, upstream_jbu, ["background", "road"], [0, 1])
    crop = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        text = ours.text_features(["background", "road"])
        expected = upstream.forward_feature(crop)
        shifted = SegEarthOV(
            ours.clip,
            ours.tokenizer,
            ours.upsampler,
            ours.options.model_copy(update={"cls_token_lambda": 0.0}),
            ours.device,
        )
        moved = shifted._crop_logits(crop, text)
        same = ours._crop_logits(crop, text)
    assert (same - expected).abs().max().item() <= LOGIT_TOLERANCE
    assert (moved - expected).abs().max().item() > 100 * LOGIT_TOLERANCE


def test_resizing_is_mmcvs_8_bit_resize():
    ours = SegEarthOV.tiny(seed=0, upsampler="bilinear")
    image = _image(3, 150, 100)
    size = (96, 64)  # long side 96 (tiny options), 100 * 96 / 150 = 64
    expected = (
        resize_bilinear_uint8(np.asarray(image), *size).astype(np.float32) - np.float32(CLIP_MEAN)
    ) / np.float32(CLIP_STD)
    assert torch.equal(ours._pixels(image)[0].permute(1, 2, 0), torch.from_numpy(expected))


def test_jbu_one_alone_equals_upstreams():
    ours, upstream_jbu = _pair(2)
    features, guidance = torch.randn(1, 32, 4, 5), torch.randn(1, 3, 64, 80)
    with torch.no_grad():
        # values of order 1 through four 121-tap passes: float32 sums in another order differ by ~4e-5
        assert (ours.upsampler(features, guidance) - upstream_jbu(features, guidance)).abs().max().item() <= 1e-4
    assert isinstance(ours.upsampler, JBUOne)
