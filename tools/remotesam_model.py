"""The RemoteSAM network (LAVT-One / RMSIN family): BERT + multi-modal Swin + cross-scale module + rotated-conv decoder.

A clean-room reimplementation from the architecture of github.com/1e12Leon/RemoteSAM (no licence, so nothing is
copied; module names are ours and `geopilot.tools.remotesam_keymap` translates the published checkpoint's names):

- text: `transformers.BertModel` (no pooler); the expression is <= 20 WordPiece tokens, padded with id 0;
- backbone: Swin (patch 4, window 12 for the published Swin-B: 128 wide, depths 2-2-18-2, heads 4-8-16-32). After
  the blocks of each stage: a pixel-word attention module (PWAM: 1x1 Conv1d projections, scaled dot-product of
  instance-normed pixel queries against masked word keys/values, element-wise product with projected pixels); a
  spatial re-weighting branch (channel mean -> two RepVGG-style 1-channel stages -> sigmoid); both added to the
  stage's tokens through tanh gates. The stage's *output* is the (normed) PWAM result, the next stage gets the
  gated sum after patch merging, as in LAVT;
- cross-scale interaction (CIM): the four outputs are average-pooled to the coarsest grid, concatenated, reduced
  to a quarter of the width, passed through one block of two cross-scale attentions (tokens of the grid and of two
  depth-wise strided copies of it, LeViT-style attention with a BN'd qkv projection and a depth-wise conv on the
  values) and feed-forwards, then split back per scale and fused into each scale by a gate (local * h-sigmoid(global)
  + global). The token counts of the attention are fixed by the input size (896 px -> 28x28 grid, 784 + 196 + 100);
- decoder: top-down fusion of the four scales (conv3x3-BN-ReLU, then an adaptive rotated 3x3 conv (one kernel whose
  taps are re-interpolated for an angle and scaled by a gate, both predicted per image) -BN-ReLU), a 1x1 conv to two
  classes, bilinear upsampling (align_corners=True) to the input size.
Upstream's tensor reshapes inside the CIM attention (raw `reshape`s that interleave heads and tokens) are kept,
because the published weights were trained with them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

TEXT_TOKENS = 20  # upstream `embed_sentences(max_tokens=20)`
CIM_KEY_DIM, CIM_HEADS, CIM_ATTN_RATIO = 32, 8, 2  # fixed in upstream's cross-scale attention
ROUTING_MAX_ANGLE = 40.0 / 180.0 * math.pi  # the rotated conv's angle range: softsign(.) * 40 degrees


@dataclass(frozen=True)
class RemoteSamConfig:
    image_size: int = 896
    embed_dim: int = 128
    depths: tuple[int, ...] = (2, 2, 18, 2)
    num_heads: tuple[int, ...] = (4, 8, 16, 32)
    window_size: int = 12
    mlp_ratio: float = 4.0
    fusion_heads: tuple[int, ...] = (1, 1, 1, 1)  # PWAM heads per stage (upstream `--mha`, default 1-1-1-1)
    text: dict = field(default_factory=dict)  # BertConfig kwargs; {} = bert-base-uncased

    @property
    def widths(self) -> list[int]:
        return [self.embed_dim * 2**i for i in range(len(self.depths))]

    @property
    def grid(self) -> int:
        """Side of the coarsest feature map (the CIM attention's token grid)."""
        side = self.image_size
        side = math.ceil(side / 4)
        for _ in range(len(self.depths) - 1):
            side = (side + 1) // 2
        return side


def tiny_config(vocab_size: int) -> RemoteSamConfig:
    """A 64 px model with a 32-wide Swin and a one-layer BERT: seconds on CPU, for tests."""
    return RemoteSamConfig(
        image_size=64,
        embed_dim=32,
        depths=(2, 2, 2, 2),
        num_heads=(1, 2, 4, 8),
        window_size=2,
        text={
            "vocab_size": vocab_size,
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 64,
        },
    )


# ---------------------------------------------------------------------------------------------------------------
# Swin blocks


def _windows(x: torch.Tensor, size: int) -> torch.Tensor:
    """(B, H, W, C) -> (B * nW, size * size, C), windows in row-major order."""
    b, h, w, c = x.shape
    x = x.view(b, h // size, size, w // size, size, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, size * size, c)


def _unwindow(windows: torch.Tensor, size: int, h: int, w: int) -> torch.Tensor:
    c = windows.shape[-1]
    b = windows.shape[0] // ((h // size) * (w // size))
    x = windows.view(b, h // size, w // size, size, size, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h, w, c)


class WindowAttention(nn.Module):
    """Multi-head self-attention inside a window, with a learned relative-position bias."""

    def __init__(self, dim: int, window: int, heads: int):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, heads))
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)
        ys, xs = torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")
        coords = torch.stack([ys.flatten(), xs.flatten()])  # 2, N
        rel = coords[:, :, None] - coords[:, None, :] + (window - 1)  # 2, N, N, both in [0, 2w-2]
        self.register_buffer("relative_position_index", rel[0] * (2 * window - 1) + rel[1], persistent=True)
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        bw, n, c = x.shape
        q, k, v = self.qkv(x).view(bw, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(n, n, -1)
        attn = attn + bias.permute(2, 0, 1).unsqueeze(0)
        if mask is not None:
            nw = mask.shape[0]
            attn = attn.view(bw // nw, nw, self.heads, n, n) + mask[None, :, None]
            attn = attn.view(bw, self.heads, n, n)
        out = (attn.softmax(-1) @ v).transpose(1, 2).reshape(bw, n, c)
        return self.proj(out)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class SwinBlock(nn.Module):
    def __init__(self, dim: int, heads: int, window: int, shift: int, mlp_ratio: float):
        super().__init__()
        self.window, self.shift = window, shift
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, window, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor, h: int, w: int, shift_mask: torch.Tensor) -> torch.Tensor:
        b, _, c = x.shape
        s = self.window
        y = self.norm1(x).view(b, h, w, c)
        pad_b, pad_r = (-h) % s, (-w) % s
        y = F.pad(y, (0, 0, 0, pad_r, 0, pad_b))
        hp, wp = h + pad_b, w + pad_r
        if self.shift:
            y = torch.roll(y, (-self.shift, -self.shift), dims=(1, 2))
        y = self.attn(_windows(y, s), shift_mask if self.shift else None)
        y = _unwindow(y, s, hp, wp)
        if self.shift:
            y = torch.roll(y, (self.shift, self.shift), dims=(1, 2))
        x = x + y[:, :h, :w].reshape(b, h * w, c)
        return x + self.mlp(self.norm2(x))


def shifted_window_mask(h: int, w: int, window: int, shift: int, device: torch.device) -> torch.Tensor:
    """(nW, N, N) additive mask: -100 between tokens that came from different regions before the cyclic shift."""
    hp, wp = math.ceil(h / window) * window, math.ceil(w / window) * window
    region = torch.zeros(1, hp, wp, 1, device=device)
    bounds = (slice(0, -window), slice(-window, -shift), slice(-shift, None))
    label = 0
    for rows in bounds:
        for cols in bounds:
            region[:, rows, cols] = label
            label += 1
    ids = _windows(region, window).squeeze(-1)  # nW, N
    diff = ids[:, None, :] - ids[:, :, None]
    return diff.masked_fill(diff != 0, -100.0).masked_fill(diff == 0, 0.0)


class PatchMerging(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        b, _, c = x.shape
        x = x.view(b, h, w, c)
        x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
        # channel order of the 2x2 neighbourhood: (0,0), (1,0), (0,1), (1,1) as (row, col)
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], dim=-1)
        return self.reduction(self.norm(x.view(b, -1, 4 * c)))


# ---------------------------------------------------------------------------------------------------------------
# Language fusion and the spatial re-weighting branch


class PixelWordAttention(nn.Module):
    """Each pixel attends over the words: queries from pixels (instance-normed), keys and values from words."""

    def __init__(self, dim: int, text_dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.query = nn.Conv1d(dim, dim, 1)
        self.key = nn.Conv1d(text_dim, dim, 1)
        self.value = nn.Conv1d(text_dim, dim, 1)
        self.out = nn.Conv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor, words: torch.Tensor, word_mask: torch.Tensor) -> torch.Tensor:
        """x (B, HW, C), words (B, D, N), word_mask (B, N) of 0/1 -> (B, HW, C)."""
        b, hw, c = x.shape
        n, heads = words.shape[-1], self.heads
        query = F.instance_norm(self.query(x.transpose(1, 2)))  # B, C, HW
        mask = word_mask[:, None, :].to(x.dtype)  # B, 1, N
        key = self.key(words) * mask
        value = self.value(words) * mask
        query = query.transpose(1, 2).reshape(b, hw, heads, c // heads).transpose(1, 2)  # B, h, HW, c/h
        key = key.reshape(b, heads, c // heads, n)
        value = value.reshape(b, heads, c // heads, n)
        sim = (query @ key) * c**-0.5 + (1e4 * mask[:, None] - 1e4)  # padding words get -1e4
        out = sim.softmax(-1) @ value.transpose(-2, -1)  # B, h, HW, c/h
        out = out.transpose(1, 2).reshape(b, hw, c).transpose(1, 2)
        return F.instance_norm(self.out(out)).transpose(1, 2)


class PWAM(nn.Module):
    def __init__(self, dim: int, text_dim: int, heads: int):
        super().__init__()
        self.visual_proj = nn.Conv1d(dim, dim, 1)
        self.attention = PixelWordAttention(dim, text_dim, heads)
        self.fused_proj = nn.Conv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor, words: torch.Tensor, word_mask: torch.Tensor) -> torch.Tensor:
        visual = F.gelu(self.visual_proj(x.transpose(1, 2)))  # B, C, HW
        language = self.attention(x, words, word_mask).transpose(1, 2)
        return F.gelu(self.fused_proj(visual * language)).transpose(1, 2)


def _conv_bn(kernel: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(1, 1, kernel, padding=kernel // 2, bias=False), nn.BatchNorm2d(1))


class RepStage(nn.Module):
    """One RepVGG-style stage on a 1-channel map: (1x1 conv-BN -> 3x3 conv-BN) + 1x1 conv-BN + BN(identity)."""

    def __init__(self):
        super().__init__()
        self.pointwise_then_3x3 = nn.Sequential(*_conv_bn(1), *_conv_bn(3))
        self.pointwise = _conv_bn(1)
        self.identity = nn.BatchNorm2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise_then_3x3(x) + self.pointwise(x) + self.identity(x)


class ReceptiveWeighting(nn.Module):
    """Re-weights every pixel of the stage's tokens by sigmoid(rep2(relu(rep1(mean over channels))))."""

    def __init__(self):
        super().__init__()
        self.rep1, self.rep2 = RepStage(), RepStage()

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        b, _, c = x.shape
        grid = x.transpose(1, 2).reshape(b, c, h, w)
        weight = torch.sigmoid(self.rep2(F.relu(self.rep1(grid.mean(1, keepdim=True)))))
        return (grid * weight).reshape(b, c, h * w).transpose(1, 2)


def _gate(dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim, dim, bias=False), nn.ReLU(), nn.Linear(dim, dim, bias=False), nn.Tanh())


class MultiModalStage(nn.Module):
    def __init__(
        self,
        dim: int,
        depth: int,
        heads: int,
        window: int,
        mlp_ratio: float,
        text_dim: int,
        fusion_heads: int,
        downsample: bool,
    ):
        super().__init__()
        self.window = window
        self.blocks = nn.ModuleList(
            SwinBlock(dim, heads, window, 0 if i % 2 == 0 else window // 2, mlp_ratio) for i in range(depth)
        )
        self.pwam = PWAM(dim, text_dim, fusion_heads)
        self.language_gate = _gate(dim)
        self.receptive = ReceptiveWeighting()
        self.visual_gate = _gate(dim)
        self.downsample = PatchMerging(dim) if downsample else None

    def forward(self, x, h, w, words, word_mask):
        """-> (stage output (B, hw, C), next stage's input tokens, its h, its w)."""
        mask = shifted_window_mask(h, w, self.window, self.window // 2, x.device).to(x.dtype)
        for block in self.blocks:
            x = block(x, h, w, mask)
        visual = self.receptive(x, h, w)
        fused = self.pwam(x, words, word_mask)
        x = x + self.language_gate(fused) * fused + self.visual_gate(visual) * visual
        if self.downsample is None:
            return fused, x, h, w
        return fused, self.downsample(x, h, w), (h + 1) // 2, (w + 1) // 2


# ---------------------------------------------------------------------------------------------------------------
# Cross-scale interaction


class LinearBN(nn.Module):
    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.linear = nn.Linear(dim_in, dim_out, bias=False)
        self.bn = nn.BatchNorm1d(dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        return self.bn(y.flatten(0, 1)).reshape_as(y)


class CrossScaleTokenAttention(nn.Module):
    """LeViT-style attention over the grid's tokens plus its two pooled copies; returns the grid's tokens."""

    def __init__(self, dim: int, grid_tokens: int, all_tokens: int):
        super().__init__()
        self.grid_tokens = grid_tokens
        self.value_dim = CIM_ATTN_RATIO * CIM_KEY_DIM
        inner = self.value_dim * CIM_HEADS
        self.qkv = LinearBN(dim, inner + 2 * CIM_KEY_DIM * CIM_HEADS)
        self.value_conv = nn.Conv2d(inner, inner, 3, padding=1, groups=inner)
        self.token_proj = nn.Linear(all_tokens, grid_tokens)
        self.out = nn.Linear(inner, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, CIM_HEADS, -1).split([CIM_KEY_DIM, CIM_KEY_DIM, self.value_dim], dim=3)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # B, heads, N, d
        inner, side = self.value_dim * CIM_HEADS, math.isqrt(self.grid_tokens)
        # upstream reshapes (heads, tokens, d) to (heads*d, side, side) without a permute; kept for the weights
        grid_values = v[:, :, : self.grid_tokens].reshape(b, inner, side, -1)
        conv = self.value_conv(F.hardswish(grid_values)).flatten(2)  # B, inner, grid_tokens
        attn = ((q @ k.transpose(-2, -1)) * CIM_KEY_DIM**-0.5).softmax(-1)
        mixed = (attn @ v).transpose(1, 2).reshape(b, -1, n)  # likewise a raw reshape of (N, heads, d)
        return self.out((self.token_proj(mixed) + conv).transpose(1, 2))


class CrossScaleAttention(nn.Module):
    def __init__(self, dim: int, grid: int):
        super().__init__()
        self.grid = grid
        self.norm_in = nn.BatchNorm2d(dim)
        self.pool2 = nn.Sequential(nn.Conv2d(dim, dim, 3, stride=2, padding=1, groups=dim), nn.BatchNorm2d(dim))
        self.pool3 = nn.Sequential(nn.Conv2d(dim, dim, 5, stride=3, padding=2, groups=dim), nn.BatchNorm2d(dim))
        side2, side3 = (grid - 1) // 2 + 1, (grid - 1) // 3 + 1
        self.attention = CrossScaleTokenAttention(dim, grid * grid, grid * grid + side2 * side2 + side3 * side3)
        self.norm_out = nn.BatchNorm2d(dim)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c = x.shape[:2]
        x0 = self.norm_in(x)
        tokens = torch.cat([t.flatten(2) for t in (x0, self.pool2(x0), self.pool3(x0))], dim=2).transpose(1, 2)
        y = self.attention(tokens).transpose(1, 2).reshape(b, c, self.grid, self.grid)
        return self.proj(F.hardswish(self.norm_out(y)))


class FeedForward(nn.Module):
    """BN -> 1x1 (x ratio) -> BN -> 3x3 grouped (groups = input width) -> ReLU6 -> 1x1."""

    def __init__(self, dim: int, ratio: int = 2):
        super().__init__()
        hidden = dim * ratio
        self.norm1 = nn.BatchNorm2d(dim)
        self.expand = nn.Conv2d(dim, hidden, 1)
        self.norm2 = nn.BatchNorm2d(hidden)
        self.mix = nn.Conv2d(hidden, hidden, 3, padding=1, groups=dim)
        self.reduce = nn.Conv2d(hidden, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reduce(F.relu6(self.mix(self.norm2(self.expand(self.norm1(x))))))


class PerScaleFeedForward(nn.Module):
    """A separate feed-forward on each scale's slice of the reduced channels."""

    def __init__(self, slices: list[int]):
        super().__init__()
        self.slices = slices
        self.ffns = nn.ModuleList(FeedForward(s) for s in slices)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p + ffn(p) for p, ffn in zip(x.split(self.slices, dim=1), self.ffns, strict=True)], dim=1)


class CrossScaleBlock(nn.Module):
    def __init__(self, dim: int, slices: list[int], grid: int):
        super().__init__()
        self.attn1 = CrossScaleAttention(dim, grid)
        self.scale_ffn = PerScaleFeedForward(slices)
        self.attn2 = CrossScaleAttention(dim, grid)
        self.ffn = FeedForward(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn1(x)
        x = x + self.scale_ffn(x)
        x = x + self.attn2(x)
        return x + self.ffn(x)


class ScaleGate(nn.Module):
    """out = BN(1x1(local)) * h_sigmoid(BN(1x1(global)))^ + BN(1x1(global))^, ^ = bilinear to the local size."""

    def __init__(self, dim: int):
        super().__init__()
        self.local_proj, self.local_norm = nn.Conv2d(dim, dim, 1), nn.BatchNorm2d(dim)
        self.global_proj, self.global_norm = nn.Conv2d(dim, dim, 1), nn.BatchNorm2d(dim)
        self.gate_proj, self.gate_norm = nn.Conv2d(dim, dim, 1), nn.BatchNorm2d(dim)

    def forward(self, local: torch.Tensor, global_: torch.Tensor) -> torch.Tensor:
        size = local.shape[-2:]
        up = lambda t: F.interpolate(t, size=size, mode="bilinear", align_corners=False)  # noqa: E731
        gate = up(F.hardsigmoid(self.gate_norm(self.gate_proj(global_))))
        return self.local_norm(self.local_proj(local)) * gate + up(self.global_norm(self.global_proj(global_)))


class CrossScaleInteraction(nn.Module):
    def __init__(self, widths: list[int], grid: int):
        super().__init__()
        total = sum(widths)
        self.widths = widths
        self.reduce = nn.Conv2d(total, total // 4, 1)
        self.block = CrossScaleBlock(total // 4, [w // 4 for w in widths], grid)
        self.norm = nn.BatchNorm2d(total // 4)
        self.expand = nn.Conv2d(total // 4, total, 1)
        self.gates = nn.ModuleList(ScaleGate(w) for w in widths)

    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        size = features[-1].shape[-2:]
        pooled = torch.cat([F.adaptive_avg_pool2d(f, size) for f in features], dim=1)
        mixed = self.expand(self.norm(self.block(self.reduce(pooled))))
        return [gate(f, m) for gate, f, m in zip(self.gates, features, mixed.split(self.widths, dim=1), strict=True)]


# ---------------------------------------------------------------------------------------------------------------
# Decoder with adaptive rotated convolution

# A 3x3 kernel rotated by theta, as a linear map on its 9 taps (row-major): out[r] = sum_c M[r, c] * w[c].
# Entries as (r, c, term); terms over x = cos(theta), y = sin(theta): the ARC paper's interpolation of the taps
# along the kernel's border, one table for theta >= 0 and one for theta < 0. The centre tap stays.
_ROTATION_POSITIVE = (
    (0, 0, "a"),
    (0, 1, "1-a"),
    (1, 1, "x-b"),
    (1, 2, "b"),
    (1, 4, "1-c+b"),
    (1, 5, "y-b"),
    (2, 2, "a"),
    (2, 5, "1-a"),
    (3, 0, "b"),
    (3, 1, "y-b"),
    (3, 3, "x-b"),
    (3, 4, "1-c+b"),
    (5, 4, "1-c+b"),
    (5, 5, "x-b"),
    (5, 7, "y-b"),
    (5, 8, "b"),
    (6, 3, "1-a"),
    (6, 6, "a"),
    (7, 3, "y-b"),
    (7, 4, "1-c+b"),
    (7, 6, "b"),
    (7, 7, "x-b"),
    (8, 7, "1-a"),
    (8, 8, "a"),
)
_ROTATION_NEGATIVE = (
    (0, 0, "c"),
    (0, 3, "1-c"),
    (1, 0, "-b"),
    (1, 1, "x+b"),
    (1, 3, "b-y"),
    (1, 4, "1-a-b"),
    (2, 1, "1-c"),
    (2, 2, "c"),
    (3, 3, "x+b"),
    (3, 4, "1-a-b"),
    (3, 6, "-b"),
    (3, 7, "b-y"),
    (5, 1, "b-y"),
    (5, 2, "-b"),
    (5, 4, "1-a-b"),
    (5, 5, "x+b"),
    (6, 6, "c"),
    (6, 7, "1-c"),
    (7, 4, "1-a-b"),
    (7, 5, "b-y"),
    (7, 7, "x+b"),
    (7, 8, "-b"),
    (8, 5, "1-c"),
    (8, 8, "c"),
)


def rotation_matrices(theta: torch.Tensor) -> torch.Tensor:
    """(...,) angles -> (..., 9, 9) tap-interpolation matrices of a rotated 3x3 kernel."""
    x, y = torch.cos(theta), torch.sin(theta)
    a, b, c = x - y, x * y, x + y
    one = torch.ones_like(theta)
    terms = {
        "a": a,
        "1-a": one - a,
        "b": b,
        "-b": -b,
        "c": c,
        "1-c": one - c,
        "x-b": x - b,
        "y-b": y - b,
        "1-c+b": one - c + b,
        "x+b": x + b,
        "b-y": b - y,
        "1-a-b": one - a - b,
    }

    def build(table) -> torch.Tensor:
        m = theta.new_zeros((*theta.shape, 9, 9))
        m[..., 4, 4] = 1.0
        for r, col, term in table:
            m[..., r, col] = terms[term]
        return m

    positive = (theta >= 0).to(theta.dtype)[..., None, None]
    return positive * build(_ROTATION_POSITIVE) + (1 - positive) * build(_ROTATION_NEGATIVE)


class RoutingFunction(nn.Module):
    """Per image: a gate in (0, 1) and an angle in (-40, 40) degrees for each of the conv's kernels."""

    def __init__(self, dim: int, kernels: int = 1):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, bias=False)
        self.norm = nn.LayerNorm(dim)
        self.fc_gate = nn.Linear(dim, kernels)
        self.fc_angle = nn.Linear(dim, kernels, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.norm(self.dwconv(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        pooled = F.relu(y).mean(dim=(2, 3))
        return torch.sigmoid(self.fc_gate(pooled)), F.softsign(self.fc_angle(pooled)) * ROUTING_MAX_ANGLE


class AdaptiveRotatedConv(nn.Module):
    """A 3x3 conv (padding 1, no bias) whose kernels are rotated and gated per image, then summed."""

    def __init__(self, dim: int, kernels: int = 1):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(kernels, dim, dim, 3, 3))
        nn.init.kaiming_normal_(self.weight, mode="fan_out", nonlinearity="relu")
        self.routing = RoutingFunction(dim, kernels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gates, angles = self.routing(x)  # B, n
        rot = rotation_matrices(angles) * gates[..., None, None]  # B, n, 9, 9
        n, c_out, c_in = self.weight.shape[:3]
        taps = self.weight.reshape(n, c_out, c_in, 9)
        weight = torch.einsum("bnrc,noic->boir", rot, taps)  # B, Cout, Cin, 9
        b, _, h, w = x.shape
        out = F.conv2d(x.reshape(1, b * c_in, h, w), weight.reshape(b * c_out, c_in, 3, 3), padding=1, groups=b)
        return out.reshape(b, c_out, h, w)


class DecoderStage(nn.Module):
    def __init__(self, dim_in: int, dim: int):
        super().__init__()
        self.conv = nn.Conv2d(dim_in, dim, 3, padding=1, bias=False)
        self.norm1 = nn.BatchNorm2d(dim)
        self.rotated = AdaptiveRotatedConv(dim)
        self.norm2 = nn.BatchNorm2d(dim)

    def forward(self, top: torch.Tensor, lateral: torch.Tensor) -> torch.Tensor:
        if top.shape[-2] < lateral.shape[-2] or top.shape[-1] < lateral.shape[-1]:
            top = F.interpolate(top, scale_factor=2, mode="bilinear", align_corners=True)
        x = F.relu(self.norm1(self.conv(torch.cat([top, lateral], dim=1))))
        return F.relu(self.norm2(self.rotated(x)))


class Decoder(nn.Module):
    def __init__(self, widths: list[int]):
        super().__init__()
        c1, c2, c3, c4 = widths
        hidden = c4 // 2
        self.stages = nn.ModuleList(
            [DecoderStage(c4 + c3, hidden), DecoderStage(hidden + c2, hidden), DecoderStage(hidden + c1, hidden)]
        )
        self.classifier = nn.Conv2d(hidden, 2, 1)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = features[3]
        for stage, lateral in zip(self.stages, (features[2], features[1], features[0]), strict=True):
            x = stage(x, lateral)
        return self.classifier(x)


# ---------------------------------------------------------------------------------------------------------------


class MultiModalSwin(nn.Module):
    def __init__(self, config: RemoteSamConfig, text_dim: int):
        super().__init__()
        widths = config.widths
        self.patch_embed = nn.Conv2d(3, config.embed_dim, 4, stride=4)
        self.patch_norm = nn.LayerNorm(config.embed_dim)
        last = len(config.depths) - 1
        self.stages = nn.ModuleList(
            MultiModalStage(
                widths[i],
                config.depths[i],
                config.num_heads[i],
                config.window_size,
                config.mlp_ratio,
                text_dim,
                config.fusion_heads[i],
                downsample=i < last,
            )
            for i in range(len(config.depths))
        )
        self.out_norms = nn.ModuleList(nn.LayerNorm(w) for w in widths)

    def forward(self, pixels: torch.Tensor, words: torch.Tensor, word_mask: torch.Tensor) -> list[torch.Tensor]:
        x = F.pad(pixels, (0, (-pixels.shape[-1]) % 4, 0, (-pixels.shape[-2]) % 4))
        x = self.patch_embed(x)
        h, w = x.shape[-2:]
        x = self.patch_norm(x.flatten(2).transpose(1, 2))
        outs = []
        for stage, norm in zip(self.stages, self.out_norms, strict=True):
            fused, x, next_h, next_w = stage(x, h, w, words, word_mask)
            outs.append(norm(fused).transpose(1, 2).reshape(x.shape[0], -1, h, w))
            h, w = next_h, next_w
        return outs


class RemoteSamNet(nn.Module):
    """(pixels (B, 3, S, S) ImageNet-normalised, token ids (B, N), attention mask (B, N)) -> logits (B, 2, S, S)."""

    def __init__(self, config: RemoteSamConfig):
        super().__init__()
        from transformers import BertConfig, BertModel

        if len(set(map(len, (config.depths, config.num_heads, config.fusion_heads)))) != 1 or len(config.depths) != 4:
            raise ValueError("RemoteSAM needs four stages: depths, num_heads and fusion_heads of length 4")
        self.config = config
        self.text_encoder = BertModel(BertConfig(**config.text), add_pooling_layer=False)
        text_dim = self.text_encoder.config.hidden_size
        self.backbone = MultiModalSwin(config, text_dim)
        self.neck = CrossScaleInteraction(config.widths, config.grid)
        self.decoder = Decoder(config.widths)

    def forward(self, pixels: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        words = self.text_encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        features = self.backbone(pixels, words.transpose(1, 2), attention_mask)
        logits = self.decoder(self.neck(features))
        return F.interpolate(logits, size=pixels.shape[-2:], mode="bilinear", align_corners=True)
