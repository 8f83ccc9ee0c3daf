"""BIT change detection: a reimplementation of the Bitemporal Image Transformer that loads the LEVIR-CD checkpoint
strictly (Chen, Qi, Shi, "Remote Sensing Image Change Detection with Transformers", TGRS 2021).

Upstream: github.com/justchenhao/BIT_CD at adcd7ae (MIT), `models/networks.py` `BASE_Transformer`,
`models/help_funcs.py`, `models/resnet.py`. The released `BIT_LEVIR/best_ckpt.pt` is the
`base_transformer_pos_s4_dd8_dedim8` network (upstream's `eval.sh` and `demo.py` load it with that name); the
`base_transformer_pos_s4_dd8` network differs only in the decoder's head width (64 instead of 8), which
`from_weights` reads off the checkpoint. The network, per image of the pair:
- ResNet-18 trunk to layer3 (layer3 asks for a dilation that upstream's `BasicBlock` drops, so it is a plain
  stride-1 stage: features at 1/8), nearest x2 upsampling, a 3x3 conv to 32 channels (features at 1/4);
- 4 semantic tokens: a 1x1 conv gives 4 spatial attention maps, softmax over the pixels, weighted sums of features;
- the 8 tokens of both images + a learned position embedding -> 1 transformer encoder layer (pre-norm, 8 heads of
  64, GELU MLP 32 -> 64); each image's pixels then cross-attend to its own 4 tokens in 8 decoder layers;
- |decoded(before) - decoded(after)|, bilinear x4 to full size, conv-BN-ReLU-conv -> 2 logits; argmax = changed.
Upstream quirk kept: attention scales by dim ** -0.5 (dim = 32), not by the head width.
Preprocessing as upstream's LEVIR-CD evaluation (`datasets/data_utils.py`): RGB / 255, normalised with mean 0.5 and
std 0.5, in 256 x 256 crops (LEVIR-CD's 1024 px tiles are cut into 16 crops without overlap, as the paper does);
see `BitCd.detect` for other sizes.

    detector = BitCd.from_weights("/path/bit_cd/BIT_LEVIR/best_ckpt.pt")   # geopilot.tools.weight_files
    changed = detector.detect(before, after)   # PIL images of one size -> (H, W) bool, True = changed
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from geopilot.cancellation import check_cancelled
from geopilot.errors import WeightsError
from geopilot.tools.keymap import KeyRenames
from geopilot.tools.precision import check_precision
from geopilot.tools.weights import float_dtypes, load_strict, pick_device, place, remap_keys

BACKEND = "bit_cd"
CROP = 256  # upstream's img_size
WIDTH = 32  # feature and token width
TOKENS = 4
HEADS = 8
ENCODER_HEAD_WIDTH = 64
DECODER_DEPTH = 8
RELEASED_DECODER_HEAD_WIDTH = 8  # BIT_LEVIR: "dedim8"
CHANGE_CLASS = "building"  # LEVIR-CD labels building change (new and demolished buildings)
BATCH = 16  # crops per forward pass (one LEVIR-CD tile)


class BasicBlock(nn.Module):
    """ResNet's basic block (torchvision's parameter names)."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(out + identity)


def _stage(inplanes: int, planes: int, stride: int) -> nn.Sequential:
    return nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes))


class Trunk(nn.Module):
    """ResNet-18 up to layer3, layer3 at stride 1: (B, 3, H, W) -> (B, 256, H/8, W/8)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.layer1 = _stage(64, 64, 1)
        self.layer2 = _stage(64, 128, 2)
        self.layer3 = _stage(128, 256, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        return self.layer3(self.layer2(self.layer1(x)))


class MultiHeadAttention(nn.Module):
    """Queries from `x`, keys and values from `memory` (self-attention when they are the same tensor)."""

    def __init__(self, head_width: int, fused_qkv: bool):
        super().__init__()
        inner = HEADS * head_width
        self.fused_qkv = fused_qkv
        if fused_qkv:
            self.qkv = nn.Linear(WIDTH, 3 * inner, bias=False)
        else:
            self.q, self.k, self.v = (nn.Linear(WIDTH, inner, bias=False) for _ in range(3))
        self.out = nn.Linear(inner, WIDTH)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        if self.fused_qkv:
            q, k, v = self.qkv(x).chunk(3, dim=-1)
        else:
            q, k, v = self.q(x), self.k(memory), self.v(memory)
        batch, length, _ = q.shape
        q, k, v = (t.unflatten(-1, (HEADS, -1)).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, scale=WIDTH**-0.5)  # upstream's scale: dim, not head
        return self.out(attended.transpose(1, 2).reshape(batch, length, -1))


class TransformerLayer(nn.Module):
    """Pre-norm attention + GELU MLP, both residual. The decoder's memory goes through the same norm as its queries."""

    def __init__(self, head_width: int, cross: bool):
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH)
        self.attention = MultiHeadAttention(head_width, fused_qkv=not cross)
        self.norm2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None) -> torch.Tensor:
        normed = self.norm1(x)
        x = x + self.attention(normed, normed if memory is None else self.norm1(memory))
        return x + self.mlp(self.norm2(x))


class BitNet(nn.Module):
    """(before, after) normalised (B, 3, H, W), H and W multiples of 8 -> change logits (B, 2, H, W)."""

    def __init__(self, decoder_head_width: int = RELEASED_DECODER_HEAD_WIDTH):
        super().__init__()
        self.trunk = Trunk()
        self.project = nn.Conv2d(256, WIDTH, 3, padding=1)
        self.tokenizer = nn.Conv2d(WIDTH, TOKENS, 1, bias=False)
        self.token_positions = nn.Parameter(torch.zeros(1, 2 * TOKENS, WIDTH))
        self.encoder = TransformerLayer(ENCODER_HEAD_WIDTH, cross=False)
        self.decoder = nn.ModuleList(TransformerLayer(decoder_head_width, cross=True) for _ in range(DECODER_DEPTH))
        self.head = nn.Sequential(
            nn.Conv2d(WIDTH, WIDTH, 3, padding=1, bias=False),
            nn.BatchNorm2d(WIDTH),
            nn.ReLU(),
            nn.Conv2d(WIDTH, 2, 3, padding=1),
        )

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(F.interpolate(self.trunk(x), scale_factor=2, mode="nearest"))

    def semantic_tokens(self, features: torch.Tensor) -> torch.Tensor:
        attention = self.tokenizer(features).flatten(2).softmax(dim=-1)  # (B, L, HW): where each token looks
        return attention @ features.flatten(2).transpose(1, 2)  # (B, L, C)

    def decode(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        height = features.shape[2]
        pixels = features.flatten(2).transpose(1, 2)  # (B, HW, C)
        for layer in self.decoder:
            pixels = layer(pixels, tokens)
        return pixels.transpose(1, 2).unflatten(2, (height, -1))

    def forward(self, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        f1, f2 = self.features(before), self.features(after)
        tokens = torch.cat([self.semantic_tokens(f1), self.semantic_tokens(f2)], dim=1) + self.token_positions
        t1, t2 = self.encoder(tokens).chunk(2, dim=1)
        difference = (self.decode(f1, t1) - self.decode(f2, t2)).abs()
        return self.head(F.interpolate(difference, scale_factor=4, mode="bilinear", align_corners=False))


def _attention(upstream: str, ours: str) -> list[tuple[str, str]]:
    """upstream `<prefix>.layers.N.0.fn.{norm,fn.to_*}` / `.1.fn.{norm,fn.net}` -> our TransformerLayer names."""
    return [
        (upstream + r"0\.fn\.norm\.", ours + "norm1."),
        (upstream + r"0\.fn\.fn\.to_(qkv|q|k|v)\.", ours + r"attention.\1."),
        (upstream + r"0\.fn\.fn\.to_out\.0\.", ours + "attention.out."),
        (upstream + r"1\.fn\.norm\.", ours + "norm2."),
        (upstream + r"1\.fn\.fn\.net\.0\.", ours + "mlp.0."),
        (upstream + r"1\.fn\.fn\.net\.3\.", ours + "mlp.2."),
    ]


# Upstream key -> our key (`geopilot.tools.keymap`). ResNet's layer4 and fc are in the checkpoint but unused by the
# 4-stage network (`resnet_stages_num=4`), so they are dropped on purpose.
_RENAMES = KeyRenames(
    [
        (r"resnet\.(layer4|fc)\.", None),
        (r"resnet\.", "trunk."),
        (r"conv_pred\.", "project."),
        (r"conv_a\.", "tokenizer."),
        (r"pos_embedding$", "token_positions"),
        *_attention(r"transformer\.layers\.0\.", "encoder."),
        *[
            rule
            for i in range(DECODER_DEPTH)
            for rule in _attention(rf"transformer_decoder\.layers\.{i}\.", f"decoder.{i}.")
        ],
        (r"classifier\.", "head."),
    ]
)


def upstream_key_to_ours(key: str) -> str | None:
    return _RENAMES(key)


def read_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """`model_G_state_dict` of upstream's training checkpoint. Its bookkeeping holds numpy float64 scalars
    (`best_val_acc`), so `weights_only` loading allows exactly numpy's scalar reconstruction, nothing else."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"weights not found: {path} is not a file")
    allowed = [np.dtype, type(np.dtype(np.float64))]
    allowed += [
        (np._core.multiarray.scalar, name) for name in ("numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar")
    ]
    try:
        with torch.serialization.safe_globals(allowed):
            data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch raises UnpicklingError, RuntimeError, EOFError, ... on bad files
        reason = str(err).strip().splitlines()[0] if str(err).strip() else "empty or truncated"
        raise WeightsError(f"{path}: not a readable BIT checkpoint ({type(err).__name__}: {reason})") from None
    state = data.get("model_G_state_dict", data) if isinstance(data, dict) else None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsError(f"{path}: expected upstream's checkpoint with a `model_G_state_dict` of tensors")
    return dict(state)


def decoder_head_width(state: dict[str, torch.Tensor]) -> int:
    """8 for the released BIT_LEVIR (dedim8), 64 for `base_transformer_pos_s4_dd8`: read off the query weight."""
    query = state.get("transformer_decoder.layers.0.0.fn.fn.to_q.weight")
    if query is None or query.shape[0] % HEADS:
        raise WeightsError("not a BIT checkpoint: transformer_decoder.layers.0.0.fn.fn.to_q.weight is missing")
    return query.shape[0] // HEADS


def windows(length: int) -> list[int]:
    """Crop starts along one side (length >= CROP): a grid of CROP, the last one moved back to end at the border."""
    starts = list(range(0, length - CROP + 1, CROP))
    return starts if starts[-1] + CROP == length else [*starts, length - CROP]


def normalise(image: Image.Image) -> np.ndarray:
    """(3, H, W) float32: RGB / 255, then (x - 0.5) / 0.5, as upstream's `to_tensor` + `normalize`."""
    rgb = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    return ((rgb - 0.5) / 0.5).transpose(2, 0, 1)


class BitCd:
    """Binary change masks of co-registered image pairs with one BitNet."""

    def __init__(self, model: BitNet, device: torch.device):
        self.model, self.device = model, device
        self.dtype = next(model.parameters()).dtype
        self.change_class = CHANGE_CLASS

    @classmethod
    def from_weights(cls, weights_path: str | Path, device: str = "cpu", precision: str = "fp32") -> BitCd:
        precision = check_precision(BACKEND, precision)
        upstream = read_checkpoint(weights_path)
        state = remap_keys(upstream, upstream_key_to_ours)
        model = BitNet(decoder_head_width(upstream))
        load_strict(model, state, source=str(weights_path))
        chosen = pick_device(device)
        return cls(place(model, chosen, precision, stored=float_dtypes(state), source=str(weights_path)), chosen)

    @classmethod
    def tiny(cls, seed: int = 0) -> BitCd:
        """Random weights, the released architecture (3,037,026 parameters: already small)."""
        torch.manual_seed(seed)
        model = BitNet()
        nn.init.normal_(model.token_positions)
        return cls(model.eval(), torch.device("cpu"))

    @torch.inference_mode()
    def logits(self, before: np.ndarray, after: np.ndarray) -> np.ndarray:
        """(N, 3, h, w) normalised crops of each image -> (N, 2, h, w) float32 logits."""
        a, b = (torch.from_numpy(np.ascontiguousarray(x)).to(self.device, self.dtype) for x in (before, after))
        return self.model(a, b).float().cpu().numpy()

    def detect(self, before: Image.Image, after: Image.Image) -> np.ndarray:
        """(H, W) bool change mask of a same-size pair. Both sides >= 256: 256 x 256 crops on a grid (LEVIR-CD's
        1024 tiles: 16 crops, no overlap), the last row/column moved back to the border (its pixels win the overlap).
        A side under 256: the pair is resized to 256 x 256 (bicubic) as upstream's loader does with any other size,
        and the mask resized back (nearest)."""
        if before.size != after.size:
            sizes = " and ".join(f"{w}x{h}" for w, h in (before.size, after.size))
            raise ValueError(f"the images differ in size: {sizes}")
        width, height = before.size
        if width < CROP or height < CROP:
            pair = [normalise(im.convert("RGB").resize((CROP, CROP), Image.BICUBIC))[None] for im in (before, after)]
            changed = self.logits(*pair)[0].argmax(0).astype(np.uint8)
            return np.asarray(Image.fromarray(changed).resize((width, height), Image.NEAREST)).astype(bool)
        a, b = normalise(before), normalise(after)
        boxes = [(y, x) for y in windows(height) for x in windows(width)]
        changed = np.zeros((height, width), dtype=bool)
        for start in range(0, len(boxes), BATCH):
            check_cancelled()  # a timed-out call stops between batches (geopilot.cancellation)
            batch = boxes[start : start + BATCH]
            crops = [np.stack([im[:, y : y + CROP, x : x + CROP] for y, x in batch]) for im in (a, b)]
            for (y, x), crop in zip(batch, self.logits(*crops).argmax(1), strict=True):
                changed[y : y + CROP, x : x + CROP] = crop.astype(bool)
        return changed
