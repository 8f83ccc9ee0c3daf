"""DenoDet (SAR object detection): ResNet-50 + frequency-domain denoising FPN + GFL head, without OpenMMLab.

Upstream: GrokCV/GrokSAR `configs/DenoDet/DenoDet_1x_SARDet_100k.py` with `groksar/models/necks/FrequencySpatialFPN.py`
(the same neck as zcablii/SARDet_100K `MSFA/msfa/models/necks/DenoDet.py`), on mmdet 3.0 `GFL`:
- backbone: ResNet-50, pytorch style (torchvision's, same keys), C3-C5 used;
- neck: FPN, 256 channels, start_level 1, 5 outputs, no norm, two stride-2 extra convs on the P5 output. In the
  top-down pass the merged P4 and P3 laterals go through TransDeno: orthonormal 2-D DCT (D_h x D_w^T) ->
  DeGroFC (`SelectGroupFClayer`: a descriptor of length H*W, four grouped 1x1 Conv1d branches (groups 2/4/8/16,
  ReLU) blended by a `SelectBlock`, then four sigmoid branches blended again = a mask over frequencies) -> inverse
  DCT. The DCT size is fixed by the feature size, so the model takes exactly `input_size` px (512: 64 and 32).
  Upstream quirks kept: the descriptor is `x.reshape(b, h*w, c)` of a (b, c, h, w) tensor (a reshape, not a
  permute), then mean + max over the last axis; `SelectBlock` softmaxes all 8 interpolation weights together and
  weights the floor branch by the fractional part;
- head: `GFLHead`, 4 GN(32) conv pairs, 6 sigmoid classes (quality focal), 4 x 17-bin distributions (distribution
  focal, reg_max 16) with a learnable scale per level; one prior per location at (x*stride, y*stride).
Inference (`test_cfg`): input resized to input_size x input_size (keep_ratio False) on the 8-bit image exactly as
mmcv's cv2 bilinear resize does (`geopilot.tools.cv2_resize`: rounded to uint8 before normalisation), mean 36.50 /
std 52.12 on the three channels in the order cv2 reads them (BGR), per level the top `nms_pre` (location, class) pairs above
`score_thr`, integral box decoding clamped to the input, class-aware NMS (IoU 0.6), at most `max_per_img`. Large
scenes are tiled by the adapter (`tile_size: 512` in configs/tools.yaml). Labels are SARDet-100K's six classes as
canonical names from `geopilot.vocabulary`, numbered as mmdet numbered them in training: `SAR_Det.py` L36-40 maps
`coco.get_cat_ids(cat_names=METAINFO classes)` -> 0..5, and pycocotools returns those ids in the annotation JSON's
`categories` order, not METAINFO's. The JSON is not in any published repository (only the dataset downloads), so
METAINFO's order is the default and `annotation_file` (a SARDet-100K COCO JSON) replaces it with the JSON's.

    detector = DenoDet.from_weights("/w/denodet/denodet_sardet100k.pth")
    detections = detector.detect(pil_image, ["ship", "airplane"])   # normalised boxes
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torchvision.models.resnet import Bottleneck, ResNet
from torchvision.ops import batched_nms

from geopilot.errors import GeoPilotInputError, WeightsError
from geopilot.tool_output import Detection
from geopilot.tools import weights as local_weights
from geopilot.tools.adapters import DenoDetOptions
from geopilot.tools.canonical import pixel_box
from geopilot.tools.cv2_resize import resize_bilinear_uint8
from geopilot.tools.keymap import KeyRenames
from geopilot.tools.precision import PRECISIONS
from geopilot.vocabulary import canonical_class, dataset_classes

BACKEND = "denodet"
SAR_MEAN = (36.50463548417378, 36.50467669785022, 36.50465618752095)
SAR_STD = (52.12157845801164, 52.12163789765554, 52.12160835551052)
STRIDES = (8, 16, 32, 64, 128)
REG_MAX = 16


METAINFO_CLASSES = ("ship", "aircraft", "car", "tank", "bridge", "harbor")  # groksar/datasets/SAR_Det.py L17
# SARDet-100K's own `category_id`s, as published use of the dataset's Annotations/*.json shows them: the PRCV 2024
# SARDet-100K challenge's first-place code (dou3516/PRCV2024_SARDet100k_Top1_solution) writes each annotation's
# `category_id` unchanged as the YOLO class (converter.py `cls = ann["category_id"]`) and names those classes
# 0 ship ... 5 harbor (ultralytics/cfg/datasets/SARDet.yaml). Listed in id order, mmdet's labels are METAINFO's.
SARDET100K_CATEGORY_IDS = {0: "ship", 1: "aircraft", 2: "car", 3: "tank", 4: "bridge", 5: "harbor"}


def sardet_classes(annotation_file: str | Path | None = None) -> list[str]:
    """SARDet-100K's classes as canonical names, in the label order of a model trained on them: METAINFO's order
    (ship, aircraft, car, tank, bridge, harbor), or, given its COCO annotation JSON, mmdet's order for that file."""
    if annotation_file is None:
        return dataset_classes("SARDet-100K")
    return [canonical_class(name, "SARDet-100K") for name in mmdet_label_order(annotation_file, METAINFO_CLASSES)]


def mmdet_label_order(annotation_file: str | Path, classes: tuple[str, ...]) -> list[str]:
    """Label i of an mmdet CocoDataset-style model: the i-th entry of the JSON's `categories` whose name is one of
    `classes` (pycocotools `getCatIds(catNms=...)` keeps the file's order, SAR_Det.py L38-40 numbers them)."""
    import json

    path = Path(annotation_file)
    try:
        categories = json.loads(path.read_text(encoding="utf-8"))["categories"]
        names = [c["name"] for c in categories]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise WeightsError(f"annotation_file {path}: not a COCO annotation file with categories ({err})") from None
    order = [n for n in names if n in classes]
    if sorted(order) != sorted(classes):
        raise WeightsError(
            f"annotation_file {path}: its categories {names} do not name each of {', '.join(classes)} exactly once"
        )
    return order


@dataclass(frozen=True)
class DenoDetConfig:
    input_size: int = 512
    channels: int = 256  # FPN and head width
    blocks: tuple[int, int, int, int] = (3, 4, 6, 3)  # ResNet-50
    width_per_group: int = 64
    num_classes: int = 6

    def dct_sizes(self) -> tuple[int, int]:
        if self.input_size % 32:
            raise GeoPilotInputError(f"DenoDet input_size must be a multiple of 32, got {self.input_size}")
        return self.input_size // 8, self.input_size // 16  # P3, P4


def tiny_config(input_size: int = 128) -> DenoDetConfig:
    """Random-init, CPU-test sized: one block per stage, narrow bottlenecks, 64-channel neck and head (GN(32) needs
    two channels per group on the 1x1 P7 of a 128 px input)."""
    return DenoDetConfig(input_size=input_size, channels=64, blocks=(1, 1, 1, 1), width_per_group=8)


def dct_matrix(n: int) -> torch.Tensor:
    """Orthonormal DCT-II matrix D (n x n): D[k, i] = sqrt((1 if k == 0 else 2) / n) * cos(pi * (i + 0.5) * k / n)."""
    k = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(n, dtype=torch.float64)[None, :]
    d = torch.cos(math.pi * (i + 0.5) * k / n) / math.sqrt(n)
    d[1:] *= math.sqrt(2.0)
    return d.float()


class SelectBlock(nn.Module):
    """Upstream `SelectBlock` ("deformable group"): a learned fractional index per branch slot, read back by blending
    the two neighbouring branches."""

    def __init__(self, channels: int, branches: int = 4):
        super().__init__()
        self.offsets = nn.Conv1d(channels, branches, 1, bias=False)
        self.branches = branches

    def forward(self, origin: torch.Tensor, branches: torch.Tensor) -> torch.Tensor:
        """origin (b, L, 1), branches (b, n, L, 1) -> (b, L, 1)."""
        offsets = self.offsets(origin)  # (b, n, 1)
        offsets = offsets - offsets.min(1, keepdim=True).values + 1e-15
        offsets = offsets / offsets.max(1, keepdim=True).values * (branches.size(1) - 1)
        low, high = offsets.floor(), offsets.ceil()
        weights = torch.softmax(torch.cat([offsets - low, high - offsets], dim=1), dim=1)
        w_low, w_high = weights.split(self.branches, dim=1)
        b, _, length, _ = branches.shape

        def pick(index: torch.Tensor) -> torch.Tensor:  # (b, n, 1) branch indices -> (b, n, L, 1)
            return torch.gather(branches, 1, index.long().view(b, self.branches, 1, 1).expand(-1, -1, length, 1))

        blended = pick(low) * w_low[..., None] + pick(high) * w_high[..., None]
        return blended.sum(1)


class DeGroFC(nn.Module):
    """Upstream `SelectGroupFClayer`: a frequency mask from grouped fully-connected branches."""

    GROUPS = (2, 4, 8, 16)

    def __init__(self, length: int):
        super().__init__()
        self.excite = nn.ModuleList(nn.Conv1d(length, length, 1, groups=g) for g in self.GROUPS)
        self.select_excite = SelectBlock(length, len(self.GROUPS))
        self.gate = nn.ModuleList(nn.Conv1d(length, length, 1, groups=g) for g in self.GROUPS)
        self.select_gate = SelectBlock(length, len(self.GROUPS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        y = x.reshape(b, h * w, c)  # upstream: a reshape of the (b, c, h, w) memory, not a permute
        y = y.mean(2, keepdim=True) + y.max(2, keepdim=True).values
        hidden = self.select_excite(y, torch.stack([F.relu(fc(y)) for fc in self.excite], dim=1))
        mask = self.select_gate(hidden, torch.stack([torch.sigmoid(fc(hidden)) for fc in self.gate], dim=1))
        return mask.view(b, 1, h, w) * x


class TransDeno(nn.Module):
    """DCT -> DeGroFC -> inverse DCT on a (size x size) feature map."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size
        self.register_buffer("dct_h", dct_matrix(size))
        self.register_buffer("dct_w", dct_matrix(size))
        self.attention = DeGroFC(size * size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2:] != (self.size, self.size):
            raise GeoPilotInputError(f"TransDeno of size {self.size} got a {tuple(x.shape[-2:])} feature map")
        dtype, x = x.dtype, x.to(self.dct_h.dtype)  # float32 whatever the rest runs in (weights.place keeps it so)
        freq = self.dct_h @ x @ self.dct_w.T
        return (self.dct_h.T @ self.attention(freq) @ self.dct_w).to(dtype)


class FrequencySpatialFPN(nn.Module):
    def __init__(self, channels: int, p3_size: int, p4_size: int, in_channels=(512, 1024, 2048)):
        super().__init__()
        self.lateral_convs = nn.ModuleList(nn.Conv2d(c, channels, 1) for c in in_channels)
        self.fpn_convs = nn.ModuleList(nn.Conv2d(channels, channels, 3, padding=1) for _ in in_channels)
        self.extra_convs = nn.ModuleList(nn.Conv2d(channels, channels, 3, stride=2, padding=1) for _ in range(2))
        self.trans_deno = nn.ModuleList([TransDeno(p3_size), TransDeno(p4_size)])  # applied to merged P3, P4

    def forward(self, c3: torch.Tensor, c4: torch.Tensor, c5: torch.Tensor) -> list[torch.Tensor]:
        laterals = [conv(c) for conv, c in zip(self.lateral_convs, (c3, c4, c5), strict=True)]
        for i in (2, 1):
            merged = laterals[i - 1] + F.interpolate(laterals[i], size=laterals[i - 1].shape[2:], mode="nearest")
            laterals[i - 1] = self.trans_deno[i - 1](merged)
        outs = [conv(lat) for conv, lat in zip(self.fpn_convs, laterals, strict=True)]
        for conv in self.extra_convs:  # add_extra_convs='on_output', no ReLU before them
            outs.append(conv(outs[-1]))
        return outs


def _conv_gn_relu(channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.GroupNorm(32, channels), nn.ReLU(inplace=True)
    )


class GFLHead(nn.Module):
    def __init__(self, channels: int, num_classes: int, stacked_convs: int = 4):
        super().__init__()
        self.cls_convs = nn.Sequential(*(_conv_gn_relu(channels) for _ in range(stacked_convs)))
        self.reg_convs = nn.Sequential(*(_conv_gn_relu(channels) for _ in range(stacked_convs)))
        self.cls_out = nn.Conv2d(channels, num_classes, 3, padding=1)
        self.reg_out = nn.Conv2d(channels, 4 * (REG_MAX + 1), 3, padding=1)
        self.scales = nn.ParameterList(nn.Parameter(torch.tensor(1.0)) for _ in STRIDES)

    def forward(self, feats: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """-> per level: class logits (B, C, H, W), box-distribution logits (B, 68, H, W)."""
        cls, reg = [], []
        for feat, scale in zip(feats, self.scales, strict=True):
            cls.append(self.cls_out(self.cls_convs(feat)))
            reg.append((self.reg_out(self.reg_convs(feat)) * scale).float())
        return cls, reg


class ResNetBackbone(nn.Module):
    """torchvision's ResNet without avgpool/fc, returning C3, C4, C5 (keys = torchvision's = mmdet's)."""

    def __init__(self, blocks: tuple[int, int, int, int], width_per_group: int):
        super().__init__()
        net = ResNet(Bottleneck, list(blocks), width_per_group=width_per_group)
        self.conv1, self.bn1, self.relu, self.maxpool = net.conv1, net.bn1, net.relu, net.maxpool
        self.layer1, self.layer2, self.layer3, self.layer4 = net.layer1, net.layer2, net.layer3, net.layer4

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        c3 = self.layer2(self.layer1(x))
        c4 = self.layer3(c3)
        return c3, c4, self.layer4(c4)


class DenoDetNet(nn.Module):
    def __init__(self, config: DenoDetConfig):
        super().__init__()
        self.config = config
        self.backbone = ResNetBackbone(config.blocks, config.width_per_group)
        self.neck = FrequencySpatialFPN(config.channels, *config.dct_sizes())
        self.head = GFLHead(config.channels, config.num_classes)
        self.register_buffer("pixel_mean", torch.tensor(SAR_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(SAR_STD).view(1, 3, 1, 1), persistent=False)

    def forward(self, bgr: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(B, 3, S, S) 0-255 in cv2 channel order -> GFL head outputs per level."""
        return self.head(self.neck(*self.backbone((bgr - self.pixel_mean) / self.pixel_std)))


@dataclass(frozen=True)
class Decoded:
    boxes: torch.Tensor  # (N, 4) xyxy pixels of the network input
    scores: torch.Tensor  # (N,)
    labels: torch.Tensor  # (N,) class indices


def decode_gfl(
    cls_logits: list[torch.Tensor],
    reg_logits: list[torch.Tensor],
    input_size: tuple[int, int],
    score_thr: float = 0.05,
    nms_pre: int = 1000,
    nms_iou: float = 0.6,
    max_per_img: int = 100,
    strides: tuple[int, ...] = STRIDES,
) -> Decoded:
    """mmdet `GFLHead._predict_by_feat_single` for one image: per level (C, H, W) class logits and (68, H, W) box
    distributions -> boxes after class-aware NMS, best first. `input_size` = (height, width) boxes are clamped to."""
    height, width = input_size
    project = torch.arange(REG_MAX + 1, dtype=torch.float32)
    boxes, scores, labels = [], [], []
    for cls, reg, stride in zip(cls_logits, reg_logits, strides, strict=True):
        num_classes, h, w = cls.shape
        prob = cls.float().permute(1, 2, 0).reshape(-1, num_classes).sigmoid()
        dist = reg.float().permute(1, 2, 0).reshape(-1, 4, REG_MAX + 1).softmax(-1)
        distance = (dist @ project.to(dist.device)) * stride  # (H*W, 4): left, top, right, bottom
        # filter_scores_and_topk: (location, class) pairs above the threshold, the best nms_pre of them
        location, label = torch.nonzero(prob > score_thr, as_tuple=True)
        score = prob[location, label]
        score, order = score.sort(descending=True)
        keep = order[:nms_pre]
        location, label, score = location[keep], label[keep], score[:nms_pre]
        ys, xs = (location // w).float() * stride, (location % w).float() * stride  # priors at (x*s, y*s)
        d = distance[location]
        box = torch.stack([xs - d[:, 0], ys - d[:, 1], xs + d[:, 2], ys + d[:, 3]], dim=1)
        box[:, 0::2] = box[:, 0::2].clamp(0, width)
        box[:, 1::2] = box[:, 1::2].clamp(0, height)
        boxes.append(box)
        scores.append(score)
        labels.append(label)
    boxes, scores, labels = torch.cat(boxes), torch.cat(scores), torch.cat(labels)
    sized = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])  # min_bbox_size=0: drop zero-area boxes
    boxes, scores, labels = boxes[sized], scores[sized], labels[sized]
    keep = batched_nms(boxes, scores, labels, nms_iou)[:max_per_img]  # sorted by score
    return Decoded(boxes[keep], scores[keep], labels[keep])


# Upstream (mmdet GFL) key -> our key (`geopilot.tools.keymap`; backbone.* is torchvision's naming already). The
# inverse-DCT buffers are the transposes of the DCT ones and the integral projection is linspace(0, 16, 17); both are
# rebuilt here, so those keys are dropped.
upstream_key_to_ours = KeyRenames(
    [
        (r"neck\.DCTDenoAttention\d\.2\.idct_[xy]\.weight$", None),
        (r"bbox_head\.integral\.project$", None),
        (r"neck\.lateral_convs\.(\d)\.conv\.", r"neck.lateral_convs.\1."),
        (r"neck\.fpn_convs\.([012])\.conv\.", r"neck.fpn_convs.\1."),
        (r"neck\.fpn_convs\.3\.conv\.", "neck.extra_convs.0."),
        (r"neck\.fpn_convs\.4\.conv\.", "neck.extra_convs.1."),
        (r"neck\.DCTDenoAttention(\d)\.0\.dct_y\.weight$", r"neck.trans_deno.\1.dct_h"),
        (r"neck\.DCTDenoAttention(\d)\.0\.dct_x\.weight$", r"neck.trans_deno.\1.dct_w"),
        (
            r"neck\.DCTDenoAttention(\d)\.1\.fc([1-4])\.0\.",
            lambda m: f"neck.trans_deno.{m[1]}.attention.excite.{int(m[2]) - 1}.",
        ),
        (
            r"neck\.DCTDenoAttention(\d)\.1\.fc([5-8])\.0\.",
            lambda m: f"neck.trans_deno.{m[1]}.attention.gate.{int(m[2]) - 5}.",
        ),
        (
            r"neck\.DCTDenoAttention(\d)\.1\.select1\.weight$",
            r"neck.trans_deno.\1.attention.select_excite.offsets.weight",
        ),
        (
            r"neck\.DCTDenoAttention(\d)\.1\.select2\.weight$",
            r"neck.trans_deno.\1.attention.select_gate.offsets.weight",
        ),
        (r"bbox_head\.(cls|reg)_convs\.(\d)\.conv\.", r"head.\1_convs.\2.0."),
        (r"bbox_head\.(cls|reg)_convs\.(\d)\.gn\.", r"head.\1_convs.\2.1."),
        (r"bbox_head\.gfl_cls\.", "head.cls_out."),
        (r"bbox_head\.gfl_reg\.", "head.reg_out."),
        (r"bbox_head\.scales\.(\d)\.scale$", r"head.scales.\1"),
    ]
)


def is_upstream_state_dict(state: dict[str, torch.Tensor]) -> bool:
    return any(k.startswith(("bbox_head.", "neck.DCTDenoAttention")) for k in state)


def load_denodet_state(model: DenoDetNet, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    if is_upstream_state_dict(state):
        state = local_weights.remap_keys(state, upstream_key_to_ours)
    local_weights.load_strict(model, state, source=source)


def _find_checkpoint(path: Path) -> Path:
    if not path.is_dir():
        return path
    found = sorted([*path.glob("*.pth"), *path.glob("*.safetensors")])
    if len(found) != 1:
        what = "no" if not found else f"{len(found)}"
        raise WeightsError(f"weights not found: {path} holds {what} .pth/.safetensors files; put exactly one there")
    return found[0]


class DenoDet:
    """`detect(image, categories) -> list[Detection]`, categories a subset of SARDet-100K's six classes."""

    def __init__(self, model: DenoDetNet, options: DenoDetOptions, device: torch.device):
        if model.config.input_size != options.input_size:
            raise GeoPilotInputError(
                f"DenoDet options ask for {options.input_size} px input, the model is built for "
                f"{model.config.input_size} px"
            )
        self.model, self.options, self.device = model, options, device
        self.dtype = next(model.parameters()).dtype
        self.classes = sardet_classes(options.annotation_file)

    @classmethod
    def tiny(cls, seed: int = 0, input_size: int = 128, **options) -> DenoDet:
        torch.manual_seed(seed)
        model = DenoDetNet(tiny_config(input_size)).eval()
        return cls(model, DenoDetOptions(input_size=input_size, architecture="tiny", **options), torch.device("cpu"))

    @classmethod
    def from_weights(cls, weights_path: str | Path | None, device: str = "cpu", **options) -> DenoDet:
        opts = DenoDetOptions(**options)
        checkpoint = _find_checkpoint(local_weights.resolve_weights(BACKEND, weights_path))
        config = (
            DenoDetConfig(input_size=opts.input_size)
            if opts.architecture == "resnet50"
            else tiny_config(opts.input_size)
        )
        target = local_weights.pick_device(device)
        parts = PRECISIONS[BACKEND].fp32_parts
        model = local_weights.load_checkpoint(
            DenoDetNet(config), checkpoint, load_denodet_state, target, opts.precision, parts
        )
        return cls(model, opts, target)

    def _label_indices(self, categories: list[str]) -> list[int]:
        wanted = []
        for name in categories:
            canonical = canonical_class(name.strip(), "SARDet-100K") if name.strip() else ""
            if canonical not in self.classes:
                raise GeoPilotInputError(f"DenoDet detects only {', '.join(self.classes)} (SARDet-100K); got {name!r}")
            wanted.append(self.classes.index(canonical))
        return sorted(set(wanted))

    @torch.inference_mode()
    def detect(self, image: Image.Image, categories: list[str] | None = None) -> list[Detection]:
        """Boxes normalised to `image`; the image is resized to input_size x input_size (keep_ratio False)."""
        wanted = self._label_indices(list(categories) if categories else self.classes)
        o = self.options
        rgb = np.asarray(image.convert("RGB"), dtype=np.uint8)  # a 1-band SAR image is replicated to 3
        bgr = resize_bilinear_uint8(np.ascontiguousarray(rgb[:, :, ::-1]), o.input_size, o.input_size)  # mmcv's
        pixels = torch.from_numpy(bgr).permute(2, 0, 1)[None].float()
        cls, reg = self.model(pixels.to(self.device, self.dtype))
        found = decode_gfl(
            [c[0] for c in cls],
            [r[0] for r in reg],
            (o.input_size, o.input_size),
            o.score_thr,
            o.nms_pre,
            o.nms_iou,
            o.max_per_img,
        )
        out = []
        for box, score, label in zip(found.boxes.tolist(), found.scores.tolist(), found.labels.tolist(), strict=True):
            if label in wanted:
                out.append(
                    Detection(
                        label=self.classes[label],
                        box=pixel_box(box, o.input_size, o.input_size),
                        score=min(max(score, 0.0), 1.0),
                    )
                )
        return out
