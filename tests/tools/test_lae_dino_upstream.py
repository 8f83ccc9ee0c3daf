"""LAE-DINO against upstream's own modules, on the same random weights, in fp32 (the backend's default precision).

mmdet / mmcv cannot be imported here (mmcv's ops need compiling), so the upstream detector is mirrored below FROM ITS
SOURCE, with upstream's module names: the state dict of the mirror is an upstream-named LAE-DINO checkpoint. It is
mapped through OUR key map (`geopilot.tools.lae_dino_keymap`) into OUR model (`geopilot.tools.lae_dino`), and both run
on the same image and categories. Sources (file:line of the snapshot read):
- LAE-DINO = jaychempan/LAE-DINO `mmdetection_lae/` (code from the public fork Ousso11/LAE-DINO @ae65c8c, the
  jaychempan snapshot has no code): `mmdet/models/detectors/lae_dino.py` (LAEDINO), `mmdet/models/layers/transformer/
  grounding_dino_layers.py` (incl. VisGT's `MetaGroundingDinoTransformerEncoder`), `deformable_detr_layers.py`,
  `detr_layers.py`, `dino_layers.py`, `utils.py`, `mmdet/models/utils/vlfuse_helper.py`, `mmdet/models/backbones/
  swin.py`, `necks/channel_mapper.py`, `language_models/bert.py`, `layers/positional_encoding.py`, `detectors/
  deformable_detr.py`, `detectors/dino.py`, `detectors/glip.py`, `dense_heads/grounding_dino_head.py` (LAE-DINO's
  `lae_dino_head.py` is that file plus a training-only loss), `dense_heads/atss_vlfusion_head.py`, and the config
  `configs/lae_dino/lae_dino_swin-t_pretrain_LAE-1M.py` + `configs/_base_/datasets/lae_small.py` (test pipeline).
- mmcv = open-mmlab/mmcv @a8073c74: `mmcv/ops/multi_scale_deform_attn.py` (the CPU path, which is what mmcv runs off
  CUDA), `mmcv/cnn/bricks/transformer.py` (MultiheadAttention, FFN), `mmcv/image/geometric.py` (imrescale).
The Swin backbone is mirrored too (upstream's is mmdet's own, not transformers'), so the comparison runs from the
normalised pixels to the post-processed detections. BERT is transformers' `BertModel` on both sides (mmdet wraps the
same class), so only mmdet's wrapper around it is mirrored.

Sizes: the dims are tiny; where upstream hard-codes a size that is a function of d_model = 256 (the text position
embedding's 256 features, the query sine embedding's 128, the positional encoding's 128), the mirror takes that
function of the tiny d_model. Swin's window is 4 and the last stage 3 x 4, so a stage no larger than the window is
covered (transformers' `SwinBackbone` keeps the full window and shift there, `always_partition=True`, as mmdet does).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from transformers import BertConfig, BertModel, GroundingDinoConfig, SwinConfig
from transformers.models.grounding_dino.modeling_grounding_dino import GroundingDinoDecoder

from geopilot.tools.adapters import LaeDinoOptions
from geopilot.tools.canonical import unit_box
from geopilot.tools.cv2_resize import resize_bilinear_uint8
from geopilot.tools.lae_dino import LaeDino, LaeDinoForObjectDetection, load_lae_dino_state, tiny_tokenizer

D_MODEL = 32
HEADS = 4  # encoder/decoder deformable and decoder MHA heads; the fusion and text layers use HEADS // 2, as upstream
EMBED, DEPTHS, SWIN_HEADS, WINDOW = 16, (2, 2, 2, 2), (1, 2, 2, 4), 4
ENC_LAYERS, DEC_LAYERS, QUERIES, MAX_TEXT = 2, 2, 20, 32
FFN_DIM, TEXT_FFN = 64, 32  # upstream: encoder ffn 2048, text ffn 1024, fusion embed_dim 1024 (= ffn // 2)
MAX_PER_IMG = 50  # upstream test_cfg.max_per_img = 300 (900 queries); 20 queries x 3 categories = 60 here
CATEGORIES = ["plane", "storage tank", "ship"]
TOL = 5e-4  # fp32 on values up to ~3; measured <= 9e-5 (float rounding: in float64 the same comparison gives <= 1e-6)


# ---------------------------------------------------------------- mmcv
def multi_scale_deformable_attn_pytorch(value, value_spatial_shapes, sampling_locations, attention_weights):
    """mmcv/ops/multi_scale_deform_attn.py L110-169."""
    bs, _, num_heads, embed_dims = value.shape
    _, num_queries, num_heads, num_levels, num_points, _ = sampling_locations.shape
    value_list = value.split([h * w for h, w in value_spatial_shapes], dim=1)
    sampling_grids = 2 * sampling_locations - 1
    sampling_value_list = []
    for level, (h, w) in enumerate(value_spatial_shapes):
        value_l_ = value_list[level].flatten(2).transpose(1, 2).reshape(bs * num_heads, embed_dims, h, w)
        sampling_grid_l_ = sampling_grids[:, :, :, level].transpose(1, 2).flatten(0, 1)
        sampling_value_list.append(
            F.grid_sample(value_l_, sampling_grid_l_, mode="bilinear", padding_mode="zeros", align_corners=False)
        )
    attention_weights = attention_weights.transpose(1, 2).reshape(
        bs * num_heads, 1, num_queries, num_levels * num_points
    )
    output = (
        (torch.stack(sampling_value_list, dim=-2).flatten(-2) * attention_weights)
        .sum(-1)
        .view(bs, num_heads * embed_dims, num_queries)
    )
    return output.transpose(1, 2).contiguous()


class MultiScaleDeformableAttention(nn.Module):
    """mmcv/ops/multi_scale_deform_attn.py L173-384 (batch_first=True, as every mmdet DETR sets it)."""

    def __init__(self, embed_dims, num_heads, num_levels=4, num_points=4):
        super().__init__()
        self.num_heads, self.num_levels, self.num_points = num_heads, num_levels, num_points
        self.sampling_offsets = nn.Linear(embed_dims, num_heads * num_levels * num_points * 2)
        self.attention_weights = nn.Linear(embed_dims, num_heads * num_levels * num_points)
        self.value_proj = nn.Linear(embed_dims, embed_dims)
        self.output_proj = nn.Linear(embed_dims, embed_dims)

    def forward(self, query, value=None, identity=None, query_pos=None, key_padding_mask=None, reference_points=None,
                spatial_shapes=None, **_):  # fmt: skip
        value = query if value is None else value
        identity = query if identity is None else identity
        if query_pos is not None:
            query = query + query_pos
        bs, num_query, _ = query.shape
        bs, num_value, _ = value.shape
        value = self.value_proj(value)
        if key_padding_mask is not None:
            value = value.masked_fill(key_padding_mask[..., None], 0.0)
        value = value.view(bs, num_value, self.num_heads, -1)
        shape = (bs, num_query, self.num_heads, self.num_levels, self.num_points)
        sampling_offsets = self.sampling_offsets(query).view(*shape, 2)
        attention_weights = self.attention_weights(query).view(bs, num_query, self.num_heads, -1).softmax(-1)
        attention_weights = attention_weights.view(*shape)
        if reference_points.shape[-1] == 2:
            offset_normalizer = torch.stack([spatial_shapes[..., 1], spatial_shapes[..., 0]], -1)
            sampling_locations = (
                reference_points[:, :, None, :, None, :]
                + sampling_offsets / offset_normalizer[None, None, None, :, None]
            )
        else:
            sampling_locations = (
                reference_points[:, :, None, :, None, :2]
                + sampling_offsets / self.num_points * reference_points[:, :, None, :, None, 2:] * 0.5
            )
        output = multi_scale_deformable_attn_pytorch(value, spatial_shapes, sampling_locations, attention_weights)
        return self.output_proj(output) + identity


class MultiheadAttention(nn.Module):
    """mmcv/cnn/bricks/transformer.py L408-552: `nn.MultiheadAttention` as `.attn`, positions added, residual."""

    def __init__(self, embed_dims, num_heads):
        super().__init__()
        self.attn = nn.MultiheadAttention(embed_dims, num_heads)

    def forward(self, query, key=None, value=None, query_pos=None, key_pos=None, attn_mask=None,
                key_padding_mask=None, **_):  # fmt: skip
        key = query if key is None else key
        value = key if value is None else value
        identity = query
        if key_pos is None and query_pos is not None and query_pos.shape == key.shape:
            key_pos = query_pos
        if query_pos is not None:
            query = query + query_pos
        if key_pos is not None:
            key = key + key_pos
        out = self.attn(
            query=query.transpose(0, 1),
            key=key.transpose(0, 1),
            value=value.transpose(0, 1),
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
        )[0]
        return identity + out.transpose(0, 1)


class FFN(nn.Module):
    """mmcv/cnn/bricks/transformer.py L556-635: layers = [[Linear, act, Dropout], Linear, Dropout], plus identity."""

    def __init__(self, embed_dims, feedforward_channels, act=nn.ReLU):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Sequential(nn.Linear(embed_dims, feedforward_channels), act(), nn.Dropout(0.0)),
            nn.Linear(feedforward_channels, embed_dims),
            nn.Dropout(0.0),
        )

    def forward(self, x, identity=None):
        return (x if identity is None else identity) + self.layers(x)


# ---------------------------------------------------------------- mmdet Swin (mmdet/models/backbones/swin.py)
class WindowMSA(nn.Module):
    """swin.py L23-126."""

    def __init__(self, embed_dims, num_heads, window_size):
        super().__init__()
        self.window_size, self.num_heads = (window_size, window_size), num_heads
        self.scale = (embed_dims // num_heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window_size - 1) ** 2, num_heads))
        wh, ww = self.window_size
        seq = (torch.arange(0, (2 * ww - 1) * wh, 2 * ww - 1)[:, None] + torch.arange(0, ww)[None, :]).reshape(1, -1)
        self.register_buffer("relative_position_index", (seq + seq.T).flip(1).contiguous())
        self.qkv = nn.Linear(embed_dims, embed_dims * 3)
        self.proj = nn.Linear(embed_dims, embed_dims)

    def forward(self, x, mask=None):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0] * self.scale, qkv[1], qkv[2]
        attn = q @ k.transpose(-2, -1)
        area = self.window_size[0] * self.window_size[1]
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(area, area, -1)
        attn = attn + bias.permute(2, 0, 1).contiguous().unsqueeze(0)
        if mask is not None:
            nw = mask.shape[0]
            attn = attn.view(b // nw, nw, self.num_heads, n, n) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.num_heads, n, n)
        return self.proj((attn.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c))


class ShiftWindowMSA(nn.Module):
    """swin.py L129-286."""

    def __init__(self, embed_dims, num_heads, window_size, shift_size):
        super().__init__()
        self.window_size, self.shift_size = window_size, shift_size
        self.w_msa = WindowMSA(embed_dims, num_heads, window_size)

    def forward(self, query, hw_shape):
        b, _, c = query.shape
        h, w = hw_shape
        ws = self.window_size
        query = query.view(b, h, w, c)
        pad_r, pad_b = (ws - w % ws) % ws, (ws - h % ws) % ws
        query = F.pad(query, (0, 0, 0, pad_r, 0, pad_b))
        h_pad, w_pad = query.shape[1], query.shape[2]
        if self.shift_size > 0:
            shifted = torch.roll(query, shifts=(-self.shift_size, -self.shift_size), dims=(1, 2))
            img_mask = torch.zeros((1, h_pad, w_pad, 1))
            slices = (slice(0, -ws), slice(-ws, -self.shift_size), slice(-self.shift_size, None))
            cnt = 0
            for hs in slices:
                for wsl in slices:
                    img_mask[:, hs, wsl, :] = cnt
                    cnt += 1
            mask_windows = self.window_partition(img_mask).view(-1, ws * ws)
            attn_mask = mask_windows.unsqueeze(1) - mask_windows.unsqueeze(2)
            attn_mask = attn_mask.masked_fill(attn_mask != 0, -100.0).masked_fill(attn_mask == 0, 0.0)
        else:
            shifted, attn_mask = query, None
        windows = self.w_msa(self.window_partition(shifted).view(-1, ws * ws, c), mask=attn_mask)
        shifted_x = self.window_reverse(windows.view(-1, ws, ws, c), h_pad, w_pad)
        x = torch.roll(shifted_x, shifts=(self.shift_size,) * 2, dims=(1, 2)) if self.shift_size > 0 else shifted_x
        return x[:, :h, :w, :].contiguous().view(b, h * w, c)

    def window_reverse(self, windows, h, w):
        ws = self.window_size
        b = int(windows.shape[0] / (h * w / ws / ws))
        return windows.view(b, h // ws, w // ws, ws, ws, -1).permute(0, 1, 3, 2, 4, 5).contiguous().view(b, h, w, -1)

    def window_partition(self, x):
        b, h, w, c = x.shape
        ws = self.window_size
        x = x.view(b, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5).contiguous()
        return x.view(-1, ws, ws, c)


class SwinBlock(nn.Module):
    """swin.py L289-379."""

    def __init__(self, embed_dims, num_heads, window_size, shift):
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dims)
        self.attn = ShiftWindowMSA(embed_dims, num_heads, window_size, window_size // 2 if shift else 0)
        self.norm2 = nn.LayerNorm(embed_dims)
        self.ffn = FFN(embed_dims, 4 * embed_dims, act=nn.GELU)

    def forward(self, x, hw_shape):
        x = x + self.attn(self.norm1(x), hw_shape)
        return self.ffn(self.norm2(x), identity=x)


def adaptive_pad(x, kernel, stride):
    """utils.py L116-185 AdaptivePadding(padding='corner'): pad bottom/right up to a whole number of strides."""
    h, w = x.shape[-2:]
    pad_h = max((math.ceil(h / stride) - 1) * stride + kernel - h, 0)
    pad_w = max((math.ceil(w / stride) - 1) * stride + kernel - w, 0)
    return F.pad(x, [0, pad_w, 0, pad_h]) if pad_h or pad_w else x


class PatchEmbed(nn.Module):
    """utils.py L188-309."""

    def __init__(self, embed_dims, patch):
        super().__init__()
        self.patch = patch
        self.projection = nn.Conv2d(3, embed_dims, patch, patch)
        self.norm = nn.LayerNorm(embed_dims)

    def forward(self, x):
        x = self.projection(adaptive_pad(x, self.patch, self.patch))
        return self.norm(x.flatten(2).transpose(1, 2)), (x.shape[2], x.shape[3])


class PatchMerging(nn.Module):
    """utils.py L312-438: nn.Unfold(2, stride 2) sampling, LN, bias-free reduction."""

    def __init__(self, in_channels):
        super().__init__()
        self.sampler = nn.Unfold(kernel_size=2, stride=2)
        self.norm = nn.LayerNorm(4 * in_channels)
        self.reduction = nn.Linear(4 * in_channels, 2 * in_channels, bias=False)

    def forward(self, x, input_size):
        b, _, c = x.shape
        h, w = input_size
        x = adaptive_pad(x.view(b, h, w, c).permute([0, 3, 1, 2]), 2, 2)
        h, w = x.shape[-2:]
        x = self.sampler(x).transpose(1, 2)
        return self.reduction(self.norm(x)), ((h - 2) // 2 + 1, (w - 2) // 2 + 1)


class SwinBlockSequence(nn.Module):
    """swin.py L382-464."""

    def __init__(self, embed_dims, num_heads, depth, window_size, downsample):
        super().__init__()
        self.blocks = nn.ModuleList([SwinBlock(embed_dims, num_heads, window_size, i % 2 == 1) for i in range(depth)])
        self.downsample = downsample

    def forward(self, x, hw_shape):
        for block in self.blocks:
            x = block(x, hw_shape)
        if self.downsample:
            x_down, down_hw = self.downsample(x, hw_shape)
            return x_down, down_hw, x, hw_shape
        return x, hw_shape, x, hw_shape


class SwinTransformer(nn.Module):
    """swin.py L468-764 (out_indices (1, 2, 3), patch_norm, no absolute position embedding; eval: no drop path)."""

    def __init__(self, out_indices=(1, 2, 3)):
        super().__init__()
        self.out_indices = out_indices
        self.patch_embed = PatchEmbed(EMBED, 4)
        self.stages = nn.ModuleList()
        channels = EMBED
        for i, (depth, heads) in enumerate(zip(DEPTHS, SWIN_HEADS, strict=True)):
            down = PatchMerging(channels) if i < len(DEPTHS) - 1 else None
            self.stages.append(SwinBlockSequence(channels, heads, depth, WINDOW, down))
            channels = channels * 2 if down else channels
        self.num_features = [EMBED * 2**i for i in range(len(DEPTHS))]
        for i in out_indices:
            self.add_module(f"norm{i}", nn.LayerNorm(self.num_features[i]))

    def forward(self, x):
        x, hw_shape = self.patch_embed(x)
        outs = []
        for i, stage in enumerate(self.stages):
            x, hw_shape, out, out_hw = stage(x, hw_shape)
            if i in self.out_indices:
                out = getattr(self, f"norm{i}")(out)
                outs.append(out.view(-1, *out_hw, self.num_features[i]).permute(0, 3, 1, 2).contiguous())
        return outs


class ConvGN(nn.Module):
    """mmcv ConvModule(conv, norm_cfg=GN(32), act_cfg=None): submodules `conv` and `gn`."""

    def __init__(self, cin, cout, kernel, stride=1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2)
        self.gn = nn.GroupNorm(32, cout)

    def forward(self, x):
        return self.gn(self.conv(x))


class ChannelMapper(nn.Module):
    """necks/channel_mapper.py L53-112 (kernel 1, GN, no activation, num_outs 4: one extra 3x3/2 conv)."""

    def __init__(self, in_channels):
        super().__init__()
        self.convs = nn.ModuleList([ConvGN(c, D_MODEL, 1) for c in in_channels])
        self.extra_convs = nn.ModuleList([ConvGN(in_channels[-1], D_MODEL, 3, 2)])

    def forward(self, inputs):
        outs = [conv(x) for conv, x in zip(self.convs, inputs, strict=True)]
        return (*outs, self.extra_convs[0](inputs[-1]))


# ---------------------------------------------------------------- mmdet position encodings and helpers
def sine_positional_encoding(feat, num_feats, temperature=20, eps=1e-6, offset=0.0):
    """positional_encoding.py L60-115, mask=None (one unpadded image), normalize=True, offset=0.0."""
    b, _, h, w = feat.shape
    x_embed = torch.arange(1, w + 1, dtype=torch.float32).view(1, 1, -1).repeat(b, h, 1)
    y_embed = torch.arange(1, h + 1, dtype=torch.float32).view(1, -1, 1).repeat(b, 1, w)
    scale = 2 * math.pi
    y_embed = (y_embed + offset) / (y_embed[:, -1:, :] + eps) * scale
    x_embed = (x_embed + offset) / (x_embed[:, :, -1:] + eps) * scale
    dim_t = torch.arange(num_feats, dtype=torch.float32)
    dim_t = temperature ** (2 * (dim_t // 2) / num_feats)
    pos_x, pos_y = x_embed[:, :, :, None] / dim_t, y_embed[:, :, :, None] / dim_t
    pos_x = torch.stack((pos_x[:, :, :, 0::2].sin(), pos_x[:, :, :, 1::2].cos()), dim=4).view(b, h, w, -1)
    pos_y = torch.stack((pos_y[:, :, :, 0::2].sin(), pos_y[:, :, :, 1::2].cos()), dim=4).view(b, h, w, -1)
    return torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)


def coordinate_to_encoding(coord, num_feats, temperature=10000):
    """transformer/utils.py L49-97 (4 coordinates: y, x, w, h)."""
    scale = 2 * math.pi
    dim_t = torch.arange(num_feats, dtype=torch.float32)
    dim_t = temperature ** (2 * (dim_t // 2) / num_feats)

    def embed(values):
        pos = values[..., None] / dim_t
        return torch.stack((pos[..., 0::2].sin(), pos[..., 1::2].cos()), dim=-1).flatten(2)

    x, y, w, h = (embed(coord[..., i] * scale) for i in range(4))
    return torch.cat((y, x, w, h), dim=-1)


def inverse_sigmoid(x, eps=1e-5):
    """transformer/utils.py L100-113."""
    x = x.clamp(min=0, max=1)
    return torch.log(x.clamp(min=eps) / (1 - x).clamp(min=eps))


def get_text_sine_pos_embed(pos_tensor, num_pos_feats, temperature=10000):
    """transformer/utils.py L879-915, exchange_xy=False."""
    dim_t = torch.arange(num_pos_feats, dtype=torch.float32)
    dim_t = temperature ** (2 * torch.div(dim_t, 2, rounding_mode="floor") / num_pos_feats)
    res = []
    for x in pos_tensor.split([1] * pos_tensor.shape[-1], dim=-1):
        s = x * 2 * math.pi / dim_t
        res.append(torch.stack((s[..., 0::2].sin(), s[..., 1::2].cos()), dim=3).flatten(2))
    return torch.cat(res, dim=-1)


class MLP(nn.Module):
    """transformer/utils.py L738-768."""

    def __init__(self, input_dim, hidden_dim, output_dim, num_layers):
        super().__init__()
        h = [hidden_dim] * (num_layers - 1)
        self.num_layers = num_layers
        self.layers = nn.ModuleList(nn.Linear(n, k) for n, k in zip([input_dim, *h], [*h, output_dim], strict=True))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = F.relu(layer(x)) if i < self.num_layers - 1 else layer(x)
        return x


# ---------------------------------------------------------------- mmdet transformer layers
class DeformableDetrTransformerEncoderLayer(nn.Module):
    """deformable_detr_layers.py L237-249 with DetrTransformerEncoderLayer.forward (detr_layers.py L213-238)."""

    def __init__(self):
        super().__init__()
        self.self_attn = MultiScaleDeformableAttention(D_MODEL, HEADS)
        self.ffn = FFN(D_MODEL, FFN_DIM)
        self.norms = nn.ModuleList([nn.LayerNorm(D_MODEL) for _ in range(2)])

    def forward(self, query, query_pos, key_padding_mask, **kwargs):
        query = self.self_attn(query=query, value=query, query_pos=query_pos, key_padding_mask=key_padding_mask,
                               **kwargs)  # fmt: skip
        return self.norms[1](self.ffn(self.norms[0](query)))


class DetrTransformerEncoderLayer(nn.Module):
    """detr_layers.py L162-238: the text layer (MHA with HEADS // 2 heads, FFN TEXT_FFN)."""

    def __init__(self):
        super().__init__()
        self.self_attn = MultiheadAttention(D_MODEL, HEADS // 2)
        self.ffn = FFN(D_MODEL, TEXT_FFN)
        self.norms = nn.ModuleList([nn.LayerNorm(D_MODEL) for _ in range(2)])

    def forward(self, query, query_pos, attn_mask, key_padding_mask=None):
        query = self.self_attn(query=query, query_pos=query_pos, key_pos=query_pos, attn_mask=attn_mask,
                               key_padding_mask=key_padding_mask)  # fmt: skip
        return self.norms[1](self.ffn(self.norms[0](query)))


class BiMultiHeadAttention(nn.Module):
    """vlfuse_helper.py L71-248 (eval: no dropout)."""

    def __init__(self, v_dim, l_dim, embed_dim, num_heads):
        super().__init__()
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.scale = self.head_dim**-0.5
        self.v_proj, self.l_proj = nn.Linear(v_dim, embed_dim), nn.Linear(l_dim, embed_dim)
        self.values_v_proj, self.values_l_proj = nn.Linear(v_dim, embed_dim), nn.Linear(l_dim, embed_dim)
        self.out_v_proj, self.out_l_proj = nn.Linear(embed_dim, v_dim), nn.Linear(embed_dim, l_dim)

    def _shape(self, tensor, seq_len, bsz):
        return tensor.view(bsz, seq_len, self.num_heads, self.head_dim).transpose(1, 2).contiguous()

    def forward(self, vision, lang, attention_mask_v=None, attention_mask_l=None):
        bsz, tgt_len, _ = vision.size()
        proj_shape = (bsz * self.num_heads, -1, self.head_dim)
        query_states = self._shape(self.v_proj(vision) * self.scale, tgt_len, bsz).view(*proj_shape)
        key_states = self._shape(self.l_proj(lang), -1, bsz).view(*proj_shape)
        value_v_states = self._shape(self.values_v_proj(vision), -1, bsz).view(*proj_shape)
        value_l_states = self._shape(self.values_l_proj(lang), -1, bsz).view(*proj_shape)
        src_len = key_states.size(1)
        attn_weights = torch.bmm(query_states, key_states.transpose(1, 2)).clamp(min=-50000, max=50000)
        attn_weights_t = attn_weights.transpose(1, 2)
        attn_weights_l = attn_weights_t - torch.max(attn_weights_t, dim=-1, keepdim=True)[0]
        attn_weights_l = attn_weights_l.clamp(min=-50000, max=50000)
        if attention_mask_v is not None:
            mask_v = attention_mask_v[:, None, None, :].repeat(1, self.num_heads, 1, 1).flatten(0, 1)
            attn_weights_l.masked_fill_(mask_v, float("-inf"))
        attn_weights_l = attn_weights_l.softmax(dim=-1)
        if attention_mask_l is not None:  # L196-209 (upstream fills a bool mask: every entry adds 1; no-op here)
            mask = attention_mask_l.unsqueeze(1).unsqueeze(1).expand(bsz, 1, tgt_len, src_len)
            mask = mask.masked_fill(mask == 0, -9e15)
            attn_weights = (attn_weights.view(bsz, self.num_heads, tgt_len, src_len) + mask).view(
                bsz * self.num_heads, tgt_len, src_len
            )
        attn_output_v = torch.bmm(attn_weights.softmax(dim=-1), value_l_states)
        attn_output_l = torch.bmm(attn_weights_l, value_v_states)
        attn_output_v = attn_output_v.view(bsz, self.num_heads, tgt_len, self.head_dim).transpose(1, 2)
        attn_output_l = attn_output_l.view(bsz, self.num_heads, src_len, self.head_dim).transpose(1, 2)
        return (
            self.out_v_proj(attn_output_v.reshape(bsz, tgt_len, self.embed_dim)),
            self.out_l_proj(attn_output_l.reshape(bsz, src_len, self.embed_dim)),
        )


class SingleScaleBiAttentionBlock(nn.Module):
    """vlfuse_helper.py L251-400 (BiAttentionBlock.__init__ + single_attention_call; drop_path inactive in eval)."""

    def __init__(self):
        super().__init__()
        self.layer_norm_v, self.layer_norm_l = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.attn = BiMultiHeadAttention(D_MODEL, D_MODEL, FFN_DIM // 2, HEADS // 2)
        self.gamma_v = nn.Parameter(1e-4 * torch.ones(D_MODEL))
        self.gamma_l = nn.Parameter(1e-4 * torch.ones(D_MODEL))

    def forward(self, visual_feature, lang_feature, attention_mask_v=None, attention_mask_l=None):
        visual, lang = self.layer_norm_v(visual_feature), self.layer_norm_l(lang_feature)
        delta_v, delta_l = self.attn(visual, lang, attention_mask_v=attention_mask_v, attention_mask_l=attention_mask_l)
        return visual + self.gamma_v * delta_v, lang + self.gamma_l * delta_l


def get_encoder_reference_points(spatial_shapes, valid_ratios):
    """deformable_detr_layers.py L82-118."""
    points = []
    for lvl, (h, w) in enumerate(spatial_shapes):
        ref_y, ref_x = torch.meshgrid(
            torch.linspace(0.5, h - 0.5, h, dtype=torch.float32),
            torch.linspace(0.5, w - 0.5, w, dtype=torch.float32),
            indexing="ij",
        )
        ref_y = ref_y.reshape(-1)[None] / (valid_ratios[:, None, lvl, 1] * h)
        ref_x = ref_x.reshape(-1)[None] / (valid_ratios[:, None, lvl, 0] * w)
        points.append(torch.stack((ref_x, ref_y), -1))
    return torch.cat(points, 1)[:, :, None] * valid_ratios[:, None]


class GroundingDinoTransformerEncoder(nn.Module):
    """grounding_dino_layers.py L135-253."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([DeformableDetrTransformerEncoderLayer() for _ in range(ENC_LAYERS)])
        self.text_layers = nn.ModuleList([DetrTransformerEncoderLayer() for _ in range(ENC_LAYERS)])
        self.fusion_layers = nn.ModuleList([SingleScaleBiAttentionBlock() for _ in range(ENC_LAYERS)])

    def forward(self, query, query_pos, key_padding_mask, spatial_shapes, level_start_index, valid_ratios,
                memory_text, text_attention_mask, text_self_attention_masks, position_ids):  # fmt: skip
        output = query
        reference_points = get_encoder_reference_points(spatial_shapes, valid_ratios)
        pos_text = get_text_sine_pos_embed(position_ids[..., None], num_pos_feats=D_MODEL)  # upstream: 256 = d_model
        for layer_id, layer in enumerate(self.layers):
            output, memory_text = self.fusion_layers[layer_id](
                output, memory_text, attention_mask_v=key_padding_mask, attention_mask_l=text_attention_mask
            )
            memory_text = self.text_layers[layer_id](
                memory_text, pos_text, attn_mask=~text_self_attention_masks.repeat(HEADS // 2, 1, 1)
            )
            output = layer(output, query_pos, key_padding_mask, reference_points=reference_points,
                           spatial_shapes=spatial_shapes, level_start_index=level_start_index)  # fmt: skip
        return output, memory_text


class MetaGroundingDinoTransformerEncoder(nn.Module):
    """LAE-DINO's VisGT, grounding_dino_layers.py L264-322: deformable layers with query_pos=None, then the mean."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([DeformableDetrTransformerEncoderLayer() for _ in range(ENC_LAYERS)])

    def forward(self, query, key_padding_mask, spatial_shapes, level_start_index, valid_ratios):
        output = query
        reference_points = get_encoder_reference_points(spatial_shapes, valid_ratios)
        for layer in self.layers:
            output = layer(output, None, key_padding_mask, reference_points=reference_points,
                           spatial_shapes=spatial_shapes, level_start_index=level_start_index)  # fmt: skip
        memory_text_by_vis = output.mean(dim=1, keepdim=True)
        return memory_text_by_vis, memory_text_by_vis.abs().sum(dim=-1) > 0


class GroundingDinoTransformerDecoderLayer(nn.Module):
    """grounding_dino_layers.py L25-132."""

    def __init__(self):
        super().__init__()
        self.self_attn = MultiheadAttention(D_MODEL, HEADS)
        self.cross_attn_text = MultiheadAttention(D_MODEL, HEADS)
        self.cross_attn = MultiScaleDeformableAttention(D_MODEL, HEADS)
        self.ffn = FFN(D_MODEL, FFN_DIM)
        self.norms = nn.ModuleList([nn.LayerNorm(D_MODEL) for _ in range(4)])

    def forward(self, query, query_pos, value, key_padding_mask, self_attn_mask, memory_text, text_attention_mask,
                **kwargs):  # fmt: skip
        query = self.norms[0](self.self_attn(query, query_pos=query_pos, key_pos=query_pos, attn_mask=self_attn_mask))
        query = self.norms[1](
            self.cross_attn_text(
                query, key=memory_text, value=memory_text, query_pos=query_pos, key_padding_mask=text_attention_mask
            )  # fmt: skip
        )
        query = self.norms[2](
            self.cross_attn(query, value=value, query_pos=query_pos, key_padding_mask=key_padding_mask, **kwargs)
        )
        return self.norms[3](self.ffn(query))


class GroundingDinoTransformerDecoder(nn.Module):
    """grounding_dino_layers.py L324-338 with DinoTransformerDecoder.forward (dino_layers.py L26-117)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([GroundingDinoTransformerDecoderLayer() for _ in range(DEC_LAYERS)])
        self.ref_point_head = MLP(D_MODEL * 2, D_MODEL, D_MODEL, 2)
        self.norm = nn.LayerNorm(D_MODEL)

    def forward(self, query, value, key_padding_mask, self_attn_mask, reference_points, spatial_shapes,
                level_start_index, valid_ratios, reg_branches, **kwargs):  # fmt: skip
        intermediate, intermediate_reference_points = [], [reference_points]
        for lid, layer in enumerate(self.layers):
            reference_points_input = reference_points[:, :, None] * torch.cat([valid_ratios, valid_ratios], -1)[:, None]
            query_sine_embed = coordinate_to_encoding(reference_points_input[:, :, 0, :], num_feats=D_MODEL // 2)
            query_pos = self.ref_point_head(query_sine_embed)
            query = layer(query, query_pos=query_pos, value=value, key_padding_mask=key_padding_mask,
                          self_attn_mask=self_attn_mask, spatial_shapes=spatial_shapes,
                          level_start_index=level_start_index, reference_points=reference_points_input,
                          **kwargs)  # fmt: skip
            tmp = reg_branches[lid](query)
            new_reference_points = (tmp + inverse_sigmoid(reference_points, eps=1e-3)).sigmoid()  # L102-103
            reference_points = new_reference_points.detach()
            intermediate.append(self.norm(query))
            intermediate_reference_points.append(new_reference_points)
        return torch.stack(intermediate), torch.stack(intermediate_reference_points)


# ---------------------------------------------------------------- mmdet head
class ContrastiveEmbed(nn.Module):
    """grounding_dino_head.py L23-88 (log_scale=0.0 -> learnable, bias=False)."""

    def __init__(self, max_text_len):
        super().__init__()
        self.max_text_len = max_text_len
        self.log_scale = nn.Parameter(torch.Tensor([0.0]))

    def forward(self, visual_feat, text_feat, text_token_mask):
        res = (visual_feat @ text_feat.transpose(-1, -2)) * self.log_scale.exp()
        res.masked_fill_(~text_token_mask[:, None, :], float("-inf"))
        new_res = torch.full((*res.shape[:-1], self.max_text_len), float("-inf"))
        new_res[..., : res.shape[-1]] = res
        return new_res


class GroundingDINOHead(nn.Module):
    """grounding_dino_head.py L91-449: per-layer (not shared) branches, `num_pred_layer` = decoder layers + 1."""

    def __init__(self):
        super().__init__()
        reg = nn.Sequential(nn.Linear(D_MODEL, D_MODEL), nn.ReLU(), nn.Linear(D_MODEL, D_MODEL), nn.ReLU(),
                            nn.Linear(D_MODEL, 4))  # fmt: skip
        self.cls_branches = nn.ModuleList([ContrastiveEmbed(MAX_TEXT) for _ in range(DEC_LAYERS + 1)])
        self.reg_branches = nn.ModuleList([copy.deepcopy(reg) for _ in range(DEC_LAYERS + 1)])

    def forward(self, hidden_states, references, memory_text, text_token_mask):
        """L213-280."""
        classes, coords = [], []
        for layer_id in range(hidden_states.shape[0]):
            reference = inverse_sigmoid(references[layer_id])
            hidden_state = hidden_states[layer_id]
            classes.append(self.cls_branches[layer_id](hidden_state, memory_text, text_token_mask))
            coords.append((self.reg_branches[layer_id](hidden_state) + reference).sigmoid())
        return torch.stack(classes), torch.stack(coords)

    @staticmethod
    def predict_by_feat_single(cls_score, bbox_pred, token_positive_maps, img_shape, scale_factor):
        """L384-449 with convert_grounding_to_cls_scores (atss_vlfusion_head.py L31-52); rescale=True."""
        logits = cls_score.sigmoid()[None]
        scores = torch.zeros(1, logits.shape[1], len(token_positive_maps))
        for label_j, tokens in token_positive_maps.items():
            scores[:, :, label_j - 1] = logits[:, :, torch.LongTensor(tokens)].mean(-1)
        cls_score = scores[0]
        scores, indexes = cls_score.view(-1).topk(MAX_PER_IMG)
        num_classes = cls_score.shape[-1]
        det_labels, bbox_index = indexes % num_classes, indexes // num_classes
        cx, cy, w, h = bbox_pred[bbox_index].unbind(-1)
        det_bboxes = torch.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], -1)  # bbox_cxcywh_to_xyxy
        det_bboxes[:, 0::2] = det_bboxes[:, 0::2] * img_shape[1]
        det_bboxes[:, 1::2] = det_bboxes[:, 1::2] * img_shape[0]
        det_bboxes[:, 0::2].clamp_(min=0, max=img_shape[1])
        det_bboxes[:, 1::2].clamp_(min=0, max=img_shape[0])
        det_bboxes /= det_bboxes.new_tensor(scale_factor).repeat((1, 2))
        return det_bboxes, scores, det_labels


# ---------------------------------------------------------------- mmdet text side (language_models/bert.py, glip.py)
def generate_masks_with_special_tokens_and_transfer_map(input_ids, special_tokens_list):
    """bert.py L19-71."""
    bs, num_token = input_ids.shape
    special_tokens_mask = torch.zeros((bs, num_token)).bool()
    for special_token in special_tokens_list:
        special_tokens_mask |= input_ids == special_token
    idxs = torch.nonzero(special_tokens_mask)
    attention_mask = torch.eye(num_token).bool().unsqueeze(0).repeat(bs, 1, 1)
    position_ids = torch.zeros((bs, num_token))
    previous_col = 0
    for i in range(idxs.shape[0]):
        row, col = idxs[i]
        if (col == 0) or (col == num_token - 1):
            attention_mask[row, col, col] = True
            position_ids[row, col] = 0
        else:
            attention_mask[row, previous_col + 1 : col + 1, previous_col + 1 : col + 1] = True
            position_ids[row, previous_col + 1 : col + 1] = torch.arange(0, col - previous_col)
        previous_col = col
    return attention_mask, position_ids.to(torch.long)


class BertEncoder(nn.Module):
    """bert.py L173-231 (num_layers_of_embedded=1): transformers' BertModel as `.model`."""

    def __init__(self, config):
        super().__init__()
        self.model = BertModel(config, add_pooling_layer=False)

    def forward(self, x):
        mask = x["attention_mask"]
        # upstream's transformers 4.42 expands the 3-D mask to mask[:, None] itself; transformers 5 wants it 4-D
        outputs = self.model(input_ids=x["input_ids"], attention_mask=mask[:, None], position_ids=x["position_ids"],
                             token_type_ids=x["token_type_ids"], output_hidden_states=True)  # fmt: skip
        features = torch.stack(outputs.hidden_states[1:][-1:], 1).mean(1)
        return {"embedded": features, "masks": mask, "hidden": outputs.hidden_states[-1]}


class LanguageModel(nn.Module):
    """bert.py L74-170 (`BertModel`, pad_to_max=False, use_sub_sentence_represent, special ['[CLS]','[SEP]','.','?'])."""

    def __init__(self, tokenizer, config):
        super().__init__()
        self.tokenizer = tokenizer
        self.language_backbone = nn.Sequential()
        self.language_backbone.add_module("body", BertEncoder(config))
        self.special_tokens = tokenizer.convert_tokens_to_ids(["[CLS]", "[SEP]", ".", "?"])

    def forward(self, captions):
        # upstream `batch_encode_plus(...)`; the same call under transformers 5's name
        tokenized = self.tokenizer(list(captions), max_length=MAX_TEXT, padding="longest",
                                   return_special_tokens_mask=True, return_tensors="pt", truncation=True)  # fmt: skip
        attention_mask, position_ids = generate_masks_with_special_tokens_and_transfer_map(
            tokenized.input_ids, self.special_tokens
        )
        features = self.language_backbone.body({"input_ids": tokenized.input_ids, "attention_mask": attention_mask,
                                                "position_ids": position_ids,
                                                "token_type_ids": tokenized["token_type_ids"]})  # fmt: skip
        features["position_ids"] = position_ids
        features["text_token_mask"] = tokenized.attention_mask.bool()
        return features


def to_plain_text_prompts(original_caption):
    """lae_dino.py L145-154 (after clean_label_name, L49-53)."""
    caption_string, tokens_positive = "", []
    for word in original_caption:
        tokens_positive.append([[len(caption_string), len(caption_string) + len(word)]])
        caption_string += word + ". "
    return caption_string, tokens_positive


def create_positive_map(tokenized, tokens_positive, max_num_entities):
    """glip.py L100-150 (char_to_token with the +1/+2 and -2/-3 fallbacks)."""
    positive_map = torch.zeros((len(tokens_positive), max_num_entities), dtype=torch.float)
    for j, tok_list in enumerate(tokens_positive):
        for beg, end in tok_list:
            beg_pos, end_pos = tokenized.char_to_token(beg), tokenized.char_to_token(end - 1)
            if beg_pos is None:
                beg_pos = tokenized.char_to_token(beg + 1)
                beg_pos = tokenized.char_to_token(beg + 2) if beg_pos is None else beg_pos
            if end_pos is None:
                end_pos = tokenized.char_to_token(end - 2)
                end_pos = tokenized.char_to_token(end - 3) if end_pos is None else end_pos
            if beg_pos is None or end_pos is None:
                continue
            positive_map[j, beg_pos : end_pos + 1].fill_(1)
    return positive_map / (positive_map.sum(-1)[:, None] + 1e-6)


# ---------------------------------------------------------------- the detector (detectors/lae_dino.py LAEDINO)
class LAEDINO(nn.Module):
    """LAEDINO._init_layers (L87-111) + DINO/DeformableDETR submodules, upstream names; predict (L627-753)."""

    def __init__(self, tokenizer, bert_config):
        super().__init__()
        self.backbone = SwinTransformer()
        self.neck = ChannelMapper([EMBED * 2, EMBED * 4, EMBED * 8])
        self.pre_encoder = MetaGroundingDinoTransformerEncoder()
        self.encoder = GroundingDinoTransformerEncoder()
        self.decoder = GroundingDinoTransformerDecoder()
        self.query_embedding = nn.Embedding(QUERIES, D_MODEL)
        self.level_embed = nn.Parameter(torch.zeros(4, D_MODEL))
        self.memory_trans_fc = nn.Linear(D_MODEL, D_MODEL)
        self.memory_trans_norm = nn.LayerNorm(D_MODEL)
        self.language_model = LanguageModel(tokenizer, bert_config)
        self.text_feat_map = nn.Linear(bert_config.hidden_size, D_MODEL)
        self.bbox_head = GroundingDINOHead()
        self.dn_query_generator = nn.Module()
        self.dn_query_generator.label_embedding = nn.Embedding(7, D_MODEL)  # training only (num_classes x dim)

    def pre_transformer(self, mlvl_feats):
        """deformable_detr.py L119-240, one unpadded image: masks None, valid ratios 1."""
        feats, pos = [], []
        for lvl, feat in enumerate(mlvl_feats):
            b, c, _, _ = feat.shape
            pos_embed = sine_positional_encoding(feat, D_MODEL // 2).view(b, c, -1).permute(0, 2, 1)
            feats.append(feat.view(b, c, -1).permute(0, 2, 1))
            pos.append(pos_embed + self.level_embed[lvl].view(1, 1, -1))
        spatial_shapes = torch.tensor([f.shape[-2:] for f in mlvl_feats])
        level_start_index = torch.cat((spatial_shapes.new_zeros((1,)), spatial_shapes.prod(1).cumsum(0)[:-1]))
        valid_ratios = mlvl_feats[0].new_ones(mlvl_feats[0].shape[0], len(mlvl_feats), 2)
        return torch.cat(feats, 1), torch.cat(pos, 1), spatial_shapes, level_start_index, valid_ratios

    def gen_encoder_output_proposals(self, memory, spatial_shapes):
        """deformable_detr.py L462-537, memory_mask None."""
        bs, proposals = memory.size(0), []
        for lvl, hw in enumerate(spatial_shapes):
            h, w = hw
            scale = hw.unsqueeze(0).flip(dims=[0, 1]).view(1, 1, 1, 2)
            grid_y, grid_x = torch.meshgrid(
                torch.linspace(0, h - 1, h, dtype=torch.float32),
                torch.linspace(0, w - 1, w, dtype=torch.float32),
                indexing="ij",
            )
            grid = torch.cat([grid_x.unsqueeze(-1), grid_y.unsqueeze(-1)], -1)
            grid = (grid.unsqueeze(0).expand(bs, -1, -1, -1) + 0.5) / scale
            wh = torch.ones_like(grid) * 0.05 * (2.0**lvl)
            proposals.append(torch.cat((grid, wh), -1).view(bs, -1, 4))
        output_proposals = torch.cat(proposals, 1)
        valid = ((output_proposals > 0.01) & (output_proposals < 0.99)).sum(-1, keepdim=True) == 4
        output_proposals = torch.log(output_proposals / (1 - output_proposals)).masked_fill(~valid, float("inf"))
        output_memory = memory.masked_fill(~valid, float(0))
        return self.memory_trans_norm(self.memory_trans_fc(output_memory)), output_proposals

    def forward_transformer(self, img_feats, text_dict):
        """lae_dino.py L325-373 (forward_pre_encoder L376-392, forward_encoder L394-416, pre_decoder L418-482)."""
        feat, feat_pos, spatial_shapes, level_start_index, valid_ratios = self.pre_transformer(img_feats)
        prior, _ = self.pre_encoder(feat, None, spatial_shapes, level_start_index, valid_ratios)
        text_dict["embedded"] = prior + text_dict["embedded"]
        text_token_mask = text_dict["text_token_mask"]
        memory, memory_text = self.encoder(
            feat, feat_pos, None, spatial_shapes, level_start_index, valid_ratios,
            memory_text=text_dict["embedded"], text_attention_mask=~text_token_mask,
            text_self_attention_masks=text_dict["masks"], position_ids=text_dict["position_ids"],
        )  # fmt: skip
        output_memory, output_proposals = self.gen_encoder_output_proposals(memory, spatial_shapes)
        enc_outputs_class = self.bbox_head.cls_branches[DEC_LAYERS](output_memory, memory_text, text_token_mask)
        enc_outputs_coord_unact = self.bbox_head.reg_branches[DEC_LAYERS](output_memory) + output_proposals
        topk_indices = torch.topk(enc_outputs_class.max(-1)[0], k=QUERIES, dim=1)[1]
        topk_coords_unact = torch.gather(enc_outputs_coord_unact, 1, topk_indices.unsqueeze(-1).repeat(1, 1, 4))
        query = self.query_embedding.weight[:, None, :].repeat(1, memory.shape[0], 1).transpose(0, 1)
        # dino.py L216-287 forward_decoder
        inter_states, references = self.decoder(
            query=query, value=memory, key_padding_mask=None, self_attn_mask=None,
            reference_points=topk_coords_unact.detach().sigmoid(), spatial_shapes=spatial_shapes,
            level_start_index=level_start_index, valid_ratios=valid_ratios,
            reg_branches=self.bbox_head.reg_branches, memory_text=memory_text, text_attention_mask=~text_token_mask,
        )  # fmt: skip
        inter_states[0] += self.dn_query_generator.label_embedding.weight[0, 0] * 0.0
        cls, coords = self.bbox_head(inter_states, list(references), memory_text, text_token_mask)
        return {"prior": prior, "memory": memory, "memory_text": memory_text, "hidden_states": inter_states,
                "references": references, "cls": cls, "coords": coords}  # fmt: skip

    def predict(self, pixels, categories, img_shape, scale_factor):
        """lae_dino.py L627-753, custom_entities=True, no chunking (the LAE test config sets no chunked_size)."""
        caption, tokens_positive = to_plain_text_prompts(categories)
        tokenized = self.language_model.tokenizer([caption], padding="longest", return_tensors="pt")
        positive_map = create_positive_map(tokenized, tokens_positive, MAX_TEXT)
        token_positive_map = {i + 1: torch.nonzero(positive_map[i], as_tuple=True)[0].tolist() for i in range(3)}
        text_dict = self.language_model([caption])
        text_dict["embedded"] = self.text_feat_map(text_dict["embedded"])
        img_feats = self.neck(self.backbone(pixels))
        out = self.forward_transformer(img_feats, text_dict)
        bboxes, scores, labels = GroundingDINOHead.predict_by_feat_single(
            out["cls"][-1][0], out["coords"][-1][0], token_positive_map, img_shape, scale_factor
        )
        return out | {"bboxes": bboxes, "scores": scores, "labels": labels, "caption": caption}


# ---------------------------------------------------------------- the pair
def our_config(vocab_size: int) -> GroundingDinoConfig:
    return GroundingDinoConfig(
        backbone_config=SwinConfig(
            image_size=96, patch_size=4, embed_dim=EMBED, depths=list(DEPTHS), num_heads=list(SWIN_HEADS),
            window_size=WINDOW, out_features=["stage2", "stage3", "stage4"],
        ),  # fmt: skip
        text_config=bert_config(vocab_size),
        d_model=D_MODEL, encoder_layers=ENC_LAYERS, decoder_layers=DEC_LAYERS, encoder_ffn_dim=FFN_DIM,
        decoder_ffn_dim=FFN_DIM, encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, num_queries=QUERIES,
        max_text_len=MAX_TEXT, decoder_bbox_embed_share=False, two_stage_bbox_embed_share=False,
    )  # fmt: skip


def bert_config(vocab_size: int) -> BertConfig:
    return BertConfig(vocab_size=vocab_size, hidden_size=24, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=48, max_position_embeddings=64)  # fmt: skip


def randomise(model: nn.Module, seed: int) -> None:
    """Every parameter random (norm scales near 1), so no branch is idle; contrastive scales small, so the logits
    stay in sigmoid's useful range."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            if name.endswith("log_scale"):
                p.copy_(-2.0 + 0.2 * noise)
            elif "reg_branches" in name:  # moderate box deltas: boxes of a few to tens of pixels
                p.copy_(0.1 * noise)
            elif p.ndim == 1 and ("norm" in name or ".gn." in name or "LayerNorm" in name) and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(0.3 * noise)


def sample_image(seed: int = 0) -> Image.Image:
    """A smooth pattern plus noise, 132 x 100 px (resized to 127 x 96: odd sizes, so every padding path runs)."""
    rng = np.random.RandomState(seed)
    yy, xx = np.mgrid[0:100, 0:132]
    base = np.stack([np.sin(xx / 9.0), np.cos(yy / 7.0), np.sin((xx + yy) / 13.0)], -1) * 80 + 128
    return Image.fromarray(np.clip(base + rng.randn(100, 132, 3) * 20, 0, 255).astype("uint8"))


def upstream_pixels(image: Image.Image) -> tuple[torch.Tensor, tuple[int, int], tuple[float, float]]:
    """lae_small.py test pipeline: LoadImageFromFile (cv2, BGR) -> FixScaleResize((96, 128) here; upstream (800, 1333),
    keep_ratio, backend cv2: mmcv imrescale, geometric.py L240-286) -> DetDataPreprocessor(bgr_to_rgb, mean/std).
    `resize_bilinear_uint8` is cv2.resize(INTER_LINEAR), checked identical to OpenCV in test_cv2_resize.py."""
    bgr = np.asarray(image.convert("RGB"))[:, :, ::-1]
    h, w = bgr.shape[:2]
    scale = min(128 / max(h, w), 96 / min(h, w))
    new_w, new_h = int(w * scale + 0.5), int(h * scale + 0.5)
    resized = resize_bilinear_uint8(np.ascontiguousarray(bgr), new_w, new_h)
    rgb = torch.from_numpy(resized[:, :, ::-1].copy()).permute(2, 0, 1).float()
    mean, std = torch.tensor([123.675, 116.28, 103.53]), torch.tensor([58.395, 57.12, 57.375])
    return ((rgb - mean[:, None, None]) / std[:, None, None])[None], (new_h, new_w), (new_w / w, new_h / h)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors: thread hand-offs cost more than the maths on a shared CPU (this file: ~3x faster)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pair():
    """The upstream mirror on random weights and OUR model loaded from its upstream-named state dict."""
    tokenizer = tiny_tokenizer()
    vocab = len(tokenizer.get_vocab())
    torch.manual_seed(0)
    upstream = LAEDINO(tokenizer, bert_config(vocab)).eval()
    randomise(upstream, seed=1)
    ours = LaeDinoForObjectDetection(our_config(vocab)).eval()
    load_lae_dino_state(ours, upstream.state_dict(), source="upstream mirror")
    options = LaeDinoOptions(short_side=96, max_long_side=128, box_threshold=0.0, text_threshold=0.0,
                             max_per_image=MAX_PER_IMG, max_detections=MAX_PER_IMG, chunk_size=len(CATEGORIES))  # fmt: skip
    backend = LaeDino(ours, tokenizer, options, torch.device("cpu"))
    image = sample_image()
    pixels, img_shape, scale_factor = upstream_pixels(image)
    with torch.no_grad():
        up = upstream.predict(pixels, CATEGORIES, img_shape, scale_factor)
    return upstream, backend, image, pixels, up


def _our_forward(backend: LaeDino, pixels: torch.Tensor, caption: str):
    """Our model's outputs, plus the VisGT prior (captured from the encoder) and per-layer logits and boxes."""
    model, captured = backend.model, {}
    encoder = model.model.encoder
    prior_fn = encoder.visual_text_prior
    encoder.visual_text_prior = lambda *a, **k: captured.setdefault("prior", prior_fn(*a, **k))
    try:
        text = backend.tokenizer([caption], return_tensors="pt")
        with torch.no_grad():
            out = model(pixel_values=pixels, input_ids=text.input_ids, token_type_ids=text.token_type_ids,
                        attention_mask=text.attention_mask, output_hidden_states=True)  # fmt: skip
            feats = model.model.backbone.conv_encoder.model(pixels).feature_maps
            refs = torch.cat([out.init_reference_points[:, None], out.intermediate_reference_points], 1)
            cls, coords = [], []
            for i in range(DEC_LAYERS):
                h = out.intermediate_hidden_states[:, i]
                cls.append(model.class_embed[i](h, out.encoder_last_hidden_state_text, text.attention_mask.bool()))
                coords.append((model.bbox_embed[i](h) + torch.special.logit(refs[:, i], eps=1e-5)).sigmoid())
    finally:
        del encoder.visual_text_prior
    return out, feats, captured["prior"], refs, torch.stack(cls), torch.stack(coords)


def _max(a: torch.Tensor, b: torch.Tensor) -> float:
    finite = torch.isfinite(b)
    assert torch.equal(torch.isfinite(a), finite)
    return float((a[finite] - b[finite]).abs().max())


def test_preprocessing_matches_upstream_pipeline(pair):
    """Our network input equals upstream's test pipeline (cv2 bilinear resize of the 8-bit image, then mean/std)."""
    _, backend, image, pixels, _ = pair
    ours = backend._pixels(image)
    assert ours.shape == pixels.shape == (1, 3, 96, 127)
    assert torch.allclose(ours, pixels, atol=1e-6, rtol=0)


def test_swin_features_match_mmdet_swin(pair):
    """transformers' Swin on the mapped weights = mmdet's SwinTransformer (patch-merging order, padding, shifts)."""
    upstream, backend, _, pixels, _ = pair
    with torch.no_grad():
        theirs = upstream.backbone(pixels)
    _, feats, *_ = _our_forward(backend, pixels, "plane .")
    assert [tuple(f.shape) for f in feats] == [tuple(f.shape) for f in theirs] == [
        (1, 32, 12, 16), (1, 64, 6, 8), (1, 128, 3, 4)
    ]  # fmt: skip
    for a, b in zip(feats, theirs, strict=True):
        assert _max(a, b) < 1e-4  # measured 2e-6


def test_encoder_decoder_and_head_match_upstream(pair):
    """VisGT prior, encoder memory (image and text), decoder states and references, per-layer logits and boxes."""
    _, backend, _, pixels, up = pair
    out, _, prior, refs, cls, coords = _our_forward(backend, pixels, up["caption"])
    assert _max(prior, up["prior"]) < TOL
    assert _max(out.encoder_last_hidden_state_vision, up["memory"]) < TOL
    assert _max(out.encoder_last_hidden_state_text, up["memory_text"]) < TOL
    assert _max(out.intermediate_hidden_states.transpose(0, 1), up["hidden_states"]) < TOL
    assert _max(refs.transpose(0, 1), up["references"]) < TOL
    assert _max(cls, up["cls"]) < TOL
    assert _max(coords, up["coords"]) < TOL
    assert _max(out.logits, up["cls"][-1]) < TOL and _max(out.pred_boxes, up["coords"][-1]) < TOL


def test_post_processed_detections_match_upstream(pair):
    """`LaeDino.detect` (custom_entities prompt, mean token score, top-k over query x category) = upstream predict."""
    _, backend, image, _, up = pair
    found = backend.detect(image, CATEGORIES)
    assert len(found) == MAX_PER_IMG
    width, height = image.size
    theirs = [
        (float(s), CATEGORIES[int(label)], unit_box(*(box / torch.tensor([width, height, width, height])).tolist()))
        for s, label, box in zip(up["scores"], up["labels"], up["bboxes"], strict=True)
    ]
    for mine, (score, label, box) in zip(found, theirs, strict=True):
        assert mine.label == label
        assert abs(mine.score - score) < TOL  # measured 5e-6
        # upstream's pixel box as a canonical box (3 decimals, sides >= 0.001); one rounding step of slack
        assert np.allclose(mine.box, box, atol=1e-3 + 1e-9)


def test_box_refinement_clamps_as_mmdet(pair):
    """Decoder alone, references within 1e-3 of 0 and 1 (boxes at the border, saturated proposals): mmdet refines with
    inverse_sigmoid(eps=1e-3) (dino_layers.py L102-103), transformers with logit(eps=1e-5); ours follows mmdet."""
    upstream, backend, *_ = pair
    generator = torch.Generator().manual_seed(5)
    shapes = torch.tensor([[12, 16], [6, 8], [3, 4], [2, 2]])
    tokens, text_len = int(shapes.prod(1).sum()), 9
    memory = torch.randn(1, tokens, D_MODEL, generator=generator)
    memory_text = torch.randn(1, text_len, D_MODEL, generator=generator)
    query = torch.randn(1, QUERIES, D_MODEL, generator=generator)
    reference = torch.rand(1, QUERIES, 4, generator=generator) * 0.8 + 0.1
    reference[0, ::2, 0], reference[0, 1::2, 1], reference[0, ::3, 2] = 1 - 2e-4, 3e-4, 5e-5
    start = torch.cat((shapes.new_zeros(1), shapes.prod(1).cumsum(0)[:-1]))
    ratios = torch.ones(1, 4, 2)
    text_mask = torch.ones(1, text_len, dtype=torch.bool)
    with torch.no_grad():
        states, refs = upstream.decoder(
            query=query, value=memory, key_padding_mask=None, self_attn_mask=None, reference_points=reference,
            spatial_shapes=shapes, level_start_index=start, valid_ratios=ratios,
            reg_branches=upstream.bbox_head.reg_branches, memory_text=memory_text, text_attention_mask=~text_mask,
        )  # fmt: skip
        inputs = dict(
            inputs_embeds=query, vision_encoder_hidden_states=memory,
            vision_encoder_attention_mask=torch.ones(1, tokens, dtype=torch.bool),
            text_encoder_hidden_states=memory_text, text_encoder_attention_mask=~text_mask,
            reference_points=reference, spatial_shapes=shapes, spatial_shapes_list=[tuple(s) for s in shapes.tolist()],
            level_start_index=start, valid_ratios=ratios,
        )  # fmt: skip
        ours = backend.model.model.decoder(**inputs, return_dict=True)
    assert _max(ours.intermediate_hidden_states.transpose(0, 1), states) < TOL  # measured 1.3e-5
    assert _max(ours.intermediate_reference_points.transpose(0, 1), refs[1:]) < TOL  # measured 2e-7
    # transformers' own decoder on the same weights (what the backend ran before): off after the first refinement
    decoder = backend.model.model.decoder
    stock = GroundingDinoDecoder(decoder.config).eval()
    stock.bbox_embed = decoder.bbox_embed
    stock.load_state_dict(decoder.state_dict())
    with torch.no_grad():
        before = stock(**inputs, return_dict=True)
    assert _max(before.intermediate_hidden_states.transpose(0, 1), states) > 1e-2  # measured 0.04
    assert _max(before.intermediate_reference_points.transpose(0, 1), refs[1:]) > TOL  # measured 1e-3
