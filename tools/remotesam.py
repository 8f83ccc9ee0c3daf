"""RemoteSAM: referring segmentation of remote-sensing images, and the tasks upstream derives from its mask.

The network is `geopilot.tools.remotesam_model.RemoteSamNet` (a clean-room reimplementation of
github.com/1e12Leon/RemoteSAM, which has no licence); weights come from local files only:
`<weights>/checkpoint.pth` (upstream's `{'model': state_dict}`, names translated by
`geopilot.tools.remotesam_keymap`, loaded with strict=True) and `<weights>/bert-base-uncased/vocab.txt`.

One forward = one sentence, as upstream (`tasks/code/model.py`): the image is resized to 896x896 (PIL bilinear),
ImageNet-normalised; the sentence is BERT-tokenised with [CLS]/[SEP], cut to 20 tokens, padded with id 0. The
2-class logits give `mask = argmax` and `prob = softmax[1]`, both resized (nearest) to the image size. Then:
- segment_referring: the mask of the expression (box, area, mean probability as the score);
- ground: upstream `visual_grounding`: the union box of the mask's connected components;
- segment_instances: upstream `detection` per category, prompted "{category} in the image": 8-connected components
  of the mask, confidence = mean probability inside the component (kept if >= 0.01), boxes lying inside another box
  removed, NMS at IoU 0.5; counting is the number of instances. Categories are first turned into the canonical
  class names of `geopilot.vocabulary`. With upstream's EPOC (`use_EPOC=True`, `geopilot.tools.remotesam_epoc`):
  DirectSAM's contours (probability > `epoc_threshold`) are cut out of the mask first and the components come from
  the refined mask (`M2B_wEPOC`), so touching objects separate; without the contour model's local weights the
  instances come from the unrefined mask and the tool's output says so (`instance_note`);
- segment_semantic: upstream `semantic_seg`: one mask per class, prompted "{class} in the image".
Scenes larger than `tile_size` are split into overlapping tiles for the category prompts (probabilities averaged
where tiles overlap); a referring expression describes the whole scene, so those tools see it whole and refuse
scenes whose long side exceeds `max_side`. Parity: with the same random weights as upstream's `LAVTOne` (Swin-B
widths, depths 2-2-2-2, 1-layer BERT, 896 px) the logits agreed to 3.3e-7 (checked once outside the repo).

    model = RemoteSam.from_weights("/weights/remotesam", device="cuda")
    model.segment_instances(pil_image, ["ship"])   # -> list[Detection]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from geopilot.errors import GeoPilotInputError, WeightsError
from geopilot.tool_output import Detection, SegmentClass
from geopilot.tools.canonical import encode_mask, pixel_box
from geopilot.tools.precision import check_precision
from geopilot.tools.remotesam_epoc import AREA_THRESHOLD, DET_THRESHOLD, EPOC_DIR, EpocContours, refine
from geopilot.tools.remotesam_keymap import upstream_key_to_ours
from geopilot.tools.remotesam_model import TEXT_TOKENS, RemoteSamConfig, RemoteSamNet, tiny_config
from geopilot.tools.tiling import tile_windows
from geopilot.tools.weights import (
    float_dtypes,
    load_strict,
    pick_device,
    place,
    read_state_dict,
    remap_keys,
    resolve_weights,
)

BACKEND = "remotesam"
CHECKPOINT = "checkpoint.pth"  # the name upstream's README loads; any file can be given as `weights:`
TOKENIZER_DIR = "bert-base-uncased"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CLASS_PROMPT = "{} in the image"  # upstream semantic_seg / detection
ARCHITECTURES = {  # name -> config from the tokenizer's vocabulary size
    "swin-b": lambda vocab_size: RemoteSamConfig(text={"vocab_size": vocab_size}),  # the published model
    "tiny": tiny_config,
}


@dataclass(frozen=True)
class Component:
    """One connected component of a mask: pixel box [x1, y1, x2, y2) and mean probability inside it."""

    box: tuple[int, int, int, int]
    score: float
    crop: np.ndarray  # bool, the component inside its box
    shape: tuple[int, int]  # (H, W) of the whole mask

    @property
    def mask(self) -> np.ndarray:
        full = np.zeros(self.shape, dtype=bool)
        x1, y1, x2, y2 = self.box
        full[y1:y2, x1:x2] = self.crop
        return full


EIGHT_CONNECTED = np.ones((3, 3), dtype=bool)


def _component(labels: np.ndarray, index: int, window, prob: np.ndarray) -> Component:
    rows, cols = window
    crop = labels[window] == index
    return Component(
        (cols.start, rows.start, cols.stop, rows.stop), float(prob[window][crop].mean()), crop, labels.shape
    )


def connected_components(mask: np.ndarray, prob: np.ndarray, conf_threshold: float = 0.01) -> list[Component]:
    """Upstream `M2B_woEPOC`: 8-connected components of `mask`, each with its mean probability (>= threshold)."""
    from scipy import ndimage

    labels, _ = ndimage.label(mask.astype(bool), structure=EIGHT_CONNECTED)
    found = []
    for index, window in enumerate(ndimage.find_objects(labels), start=1):
        if window is not None:
            found.append(_component(labels, index, window, prob))
    return [c for c in found if c.score >= conf_threshold]


def refined_components(
    mask: np.ndarray,
    refined: np.ndarray,
    prob: np.ndarray,
    conf_threshold: float = 0.01,
    area_threshold: float = AREA_THRESHOLD,
) -> list[Component]:
    """Upstream `M2B_wEPOC` (utils.py L233-272): the 8-connected components of the contour-refined mask; of those
    inside one component of the unrefined mask, the ones larger than `area_threshold` x the largest are kept, in
    upstream's order (unrefined component, then refined label); confidence = mean probability (>= threshold)."""
    from scipy import ndimage

    whole, _ = ndimage.label(mask.astype(bool), structure=EIGHT_CONNECTED)
    parts, count = ndimage.label(refined.astype(bool) & (whole > 0), structure=EIGHT_CONNECTED)
    if count == 0:
        return []
    areas = np.bincount(parts.ravel(), minlength=count + 1)
    windows = ndimage.find_objects(parts)
    owner = [0] + [int(whole[w][parts[w] == j][0]) for j, w in enumerate(windows, start=1)]  # refined within mask
    largest: dict[int, int] = {}
    for j in range(1, count + 1):
        largest[owner[j]] = max(largest.get(owner[j], 0), int(areas[j]))
    kept = sorted((owner[j], j) for j in range(1, count + 1) if areas[j] > largest[owner[j]] * area_threshold)
    found = [_component(parts, j, windows[j - 1], prob) for _, j in kept]
    return [c for c in found if c.score >= conf_threshold]


def _inside(inner: tuple[int, ...], outer: tuple[int, ...]) -> bool:
    """Upstream `box1_in_box2` for [x1, y1, x2, y2) boxes: both are filled with their end pixels included
    (`cv2.fillPoly` on the corners) on a canvas as large as the larger ends, which cuts the last row and column, so
    an inner box may reach one pixel past the outer box's end when it is the one that sets the canvas size."""
    return outer[0] <= inner[0] and outer[1] <= inner[1] and inner[2] <= outer[2] + 1 and inner[3] <= outer[3] + 1


def remove_inner(components: list[Component]) -> list[Component]:
    """Upstream `M2B(remove_inner=True)`: drop a box that lies inside another one (`_inside`). Upstream drops *both*
    of two boxes inside each other (equal, or one pixel apart at the end); here the higher-scoring one (or the
    first) is kept, so an object is never lost."""
    kept = []
    for i, c in enumerate(components):
        rank = (-c.score, i)
        swallowed = any(
            _inside(c.box, o.box) and (not _inside(o.box, c.box) or (-o.score, j) < rank)
            for j, o in enumerate(components)
            if j != i
        )
        if not swallowed:
            kept.append(c)
    return kept


def nms(components: list[Component], iou_threshold: float = 0.5) -> list[Component]:
    """Greedy NMS (torchvision's), best score first."""
    if not components:
        return []
    from torchvision.ops import nms as torchvision_nms

    boxes = torch.tensor([c.box for c in components], dtype=torch.float32)
    scores = torch.tensor([c.score for c in components], dtype=torch.float32)
    return [components[i] for i in torchvision_nms(boxes, scores, iou_threshold).tolist()]


def union_box(components: list[Component]) -> tuple[int, int, int, int] | None:
    """Upstream `visual_grounding`: the box around every component, or None when there is none."""
    if not components:
        return None
    boxes = np.array([c.box for c in components])
    return (int(boxes[:, 0].min()), int(boxes[:, 1].min()), int(boxes[:, 2].max()), int(boxes[:, 3].max()))


def instances(
    mask: np.ndarray,
    prob: np.ndarray,
    conf_threshold: float = 0.01,
    iou_threshold: float = 0.5,
    refined: np.ndarray | None = None,
) -> list[Component]:
    """Upstream `detection` for one class: components (of the EPOC-refined mask when given) -> inner boxes
    removed -> NMS."""
    found = (
        connected_components(mask, prob, conf_threshold)
        if refined is None
        else refined_components(mask, refined, prob, conf_threshold)
    )
    return nms(remove_inner(found), iou_threshold)


def _canonical(category: str) -> str:
    from geopilot.vocabulary import canonical_class

    return canonical_class(category)


def class_prompt(canonical: str) -> str:
    """Upstream's `f"{classname} in the image"` with upstream's raw dataset name for the class ("storagetank"), the
    canonical name for classes upstream does not know (geopilot/vocabulary.yaml `prompt_names.remotesam`)."""
    from geopilot.vocabulary import prompt_name

    return CLASS_PROMPT.format(prompt_name(canonical, BACKEND))


class RemoteSam:
    """`ground`, `segment_referring`, `segment_instances` and `segment_semantic` on PIL images."""

    def __init__(
        self,
        net: RemoteSamNet,
        tokenizer,
        device: torch.device,
        *,
        conf_threshold: float = 0.01,
        nms_iou: float = 0.5,
        max_instances: int = 100,
        tile_size: int = 2048,
        tile_overlap: int = 256,
        max_side: int = 8192,
        contours: EpocContours | None = None,
        epoc_threshold: float = DET_THRESHOLD,
        unrefined_reason: str = "no EPOC contour model was given",
    ):
        if not 0 <= tile_overlap < tile_size:
            raise ValueError(f"tile_overlap must be in [0, tile_size), got {tile_overlap} and {tile_size}")
        self.net, self.tokenizer, self.device = net, tokenizer, device
        self.size = net.config.image_size
        self.conf_threshold, self.nms_iou, self.max_instances = conf_threshold, nms_iou, max_instances
        self.tile_size, self.tile_overlap, self.max_side = tile_size, tile_overlap, max_side
        self.contours, self.epoc_threshold, self.unrefined_reason = contours, epoc_threshold, unrefined_reason

    @property
    def instance_note(self) -> str | None:
        """None when instances come from EPOC-refined masks (as upstream's detection and counting); else why not."""
        if self.contours is not None:
            return None
        return (
            f"instances and counts come from unrefined masks ({self.unrefined_reason}): touching objects can merge "
            "into one, so counts can come out low"
        )

    # -- construction -------------------------------------------------------------------------------------------
    @classmethod
    def tiny(cls, seed: int = 0, **options) -> RemoteSam:
        """Random weights, 64 px, in-memory tokenizer: for tests and dry runs (outputs are meaningless)."""
        from geopilot.tools.lae_dino import tiny_tokenizer

        torch.manual_seed(seed)
        tokenizer = tiny_tokenizer()
        net = RemoteSamNet(tiny_config(len(tokenizer.get_vocab()))).eval()
        return cls(net, tokenizer, torch.device("cpu"), **options)

    @classmethod
    def from_weights(
        cls,
        weights_path: str | Path | None,
        device: str = "cpu",
        *,
        tokenizer_path: str | None = None,
        precision: str = "fp32",
        architecture: str = "swin-b",
        use_epoc: bool = True,
        epoc_path: str | None = None,
        **options,
    ) -> RemoteSam:
        """Published RemoteSAM weights from a local file (or a folder holding `checkpoint.pth`), strictly.

        EPOC (upstream's default for detection and counting): the DirectSAM folder `epoc_path`, by default
        `<checkpoint folder>/DirectSAM-EntitySeg-1024px-0501`; absent, instances come from unrefined masks and
        `instance_note` says so. `architecture="tiny"` builds `tiny_config` instead of the published Swin-B."""
        if architecture not in ARCHITECTURES:
            raise WeightsError(f"unknown RemoteSAM architecture {architecture!r}; known: {list(ARCHITECTURES)}")
        from transformers import BertTokenizer

        checkpoint = resolve_weights(BACKEND, weights_path, CHECKPOINT)
        if checkpoint.is_dir():
            raise WeightsError(f"weights not found: put {CHECKPOINT} in {checkpoint}")
        tokenizer_dir = Path(tokenizer_path) if tokenizer_path else checkpoint.parent / TOKENIZER_DIR
        if not any((tokenizer_dir / name).is_file() for name in ("vocab.txt", "tokenizer.json")):
            raise WeightsError(f"weights not found: put the BERT vocabulary at {tokenizer_dir / 'vocab.txt'}")
        tokenizer = BertTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
        state = remap_keys(read_state_dict(checkpoint), upstream_key_to_ours)
        net = RemoteSamNet(ARCHITECTURES[architecture](len(tokenizer.get_vocab())))
        load_strict(net, state, source=str(checkpoint))
        target = pick_device(device)
        precision = check_precision(BACKEND, precision)
        placed = place(net, target, precision, stored=float_dtypes(state), source=str(checkpoint))
        epoc_folder = Path(epoc_path) if epoc_path else checkpoint.parent / EPOC_DIR
        contours, reason = None, "EPOC is off (use_epoc: false)"
        if use_epoc and epoc_folder.is_dir():
            contours = EpocContours.from_folder(epoc_folder, target)
        elif use_epoc:
            reason = f"no EPOC contour model: put {EPOC_DIR} at {epoc_folder}"
        return cls(placed, tokenizer, target, contours=contours, unrefined_reason=reason, **options)

    # -- the network ----------------------------------------------------------------------------------------------
    def tokens(self, sentence: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Upstream `embed_sentences`: [CLS] ... [SEP] cut to 20 ids, padded with 0; mask 1 on real tokens."""
        if not sentence or not sentence.strip():
            raise GeoPilotInputError("RemoteSAM needs a non-empty expression")
        ids = self.tokenizer.encode(sentence.strip(), add_special_tokens=True)[:TEXT_TOKENS]
        padded = torch.zeros(1, TEXT_TOKENS, dtype=torch.long)
        padded[0, : len(ids)] = torch.tensor(ids)
        mask = torch.zeros(1, TEXT_TOKENS, dtype=torch.long)
        mask[0, : len(ids)] = 1
        return padded.to(self.device), mask.to(self.device)

    def pixels(self, image: Image.Image) -> torch.Tensor:
        rgb = image.convert("RGB") if image.mode != "RGB" else image  # 1-channel / RGBA -> 3 channels
        array = np.asarray(rgb.resize((self.size, self.size), Image.Resampling.BILINEAR), dtype=np.float32) / 255.0
        x = (torch.from_numpy(array) - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)
        dtype = next(self.net.parameters()).dtype
        return x.permute(2, 0, 1)[None].to(self.device, dtype)

    @torch.inference_mode()
    def probability(self, image: Image.Image, sentence: str) -> np.ndarray:
        """P(referred) per pixel of `image` (H, W), float32, as upstream: softmax at 896 px, nearest-resized."""
        ids, mask = self.tokens(sentence)
        logits = self.net(self.pixels(image), ids, mask).float()
        prob = logits.softmax(1)[:, 1:]
        width, height = image.size
        return F.interpolate(prob, size=(height, width), mode="nearest")[0, 0].cpu().numpy()

    def predict(self, image: Image.Image, sentence: str, tiled: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(mask bool (H, W), prob float32 (H, W)). argmax of two classes == prob > 0.5 (a tie goes to background).

        `tiled`: scenes larger than `tile_size` run tile by tile, averaging probabilities where tiles overlap."""
        width, height = image.size
        if not tiled or max(width, height) <= self.tile_size:
            if max(width, height) > self.max_side:
                raise GeoPilotInputError(
                    f"image of {width}x{height} is too large for RemoteSAM's whole-scene referring tools (it is "
                    f"resized to {self.size} px, so small objects vanish): crop it to at most {self.max_side} px "
                    "per side, or raise `max_side` in the tool's options"
                )
            prob = self.probability(image, sentence)
            return prob > 0.5, prob
        total = np.zeros((height, width), dtype=np.float32)
        count = np.zeros((height, width), dtype=np.uint16)
        for x0, y0, x1, y1 in tile_windows(width, height, self.tile_size, self.tile_overlap):
            total[y0:y1, x0:x1] += self.probability(image.crop((x0, y0, x1, y1)), sentence)
            count[y0:y1, x0:x1] += 1
        prob = total / count
        return prob > 0.5, prob

    def contour_map(self, image: Image.Image) -> np.ndarray:
        """EPOC contour probabilities (H, W), over the same tiles as `predict(tiled=True)` on large scenes."""
        width, height = image.size
        if max(width, height) <= self.tile_size:
            return self.contours.probability(image)
        total = np.zeros((height, width), dtype=np.float32)
        count = np.zeros((height, width), dtype=np.uint16)
        for x0, y0, x1, y1 in tile_windows(width, height, self.tile_size, self.tile_overlap):
            total[y0:y1, x0:x1] += self.contours.probability(image.crop((x0, y0, x1, y1)))
            count[y0:y1, x0:x1] += 1
        return total / count

    # -- tasks --------------------------------------------------------------------------------------------------
    def segment_referring(self, image: Image.Image, expression: str) -> list[Detection]:
        mask, prob = self.predict(image, expression)
        if not mask.any():
            return []
        box = union_box(connected_components(mask, prob, conf_threshold=0.0))
        width, height = image.size
        rle = encode_mask(mask)
        return [
            Detection(
                label=expression.strip(),
                box=pixel_box(box, width, height),
                score=min(1.0, float(prob[mask].mean())),
                mask=rle,
                area=float(mask.mean()),
            )
        ]

    def ground(self, image: Image.Image, expression: str) -> list[Detection]:
        mask, prob = self.predict(image, expression)
        components = remove_inner(connected_components(mask, prob, self.conf_threshold))
        box = union_box(components)
        if box is None:
            return []
        width, height = image.size
        score = min(1.0, float(sum(c.score * c.crop.sum() for c in components) / sum(c.crop.sum() for c in components)))
        return [Detection(label=expression.strip(), box=pixel_box(box, width, height), score=score)]

    def segment_instances(
        self, image: Image.Image, categories: list[str], score_threshold: float | None = None
    ) -> list[Detection]:
        threshold = self.conf_threshold if score_threshold is None else score_threshold
        width, height = image.size
        contours = self.contour_map(image) if self.contours is not None else None  # once per image, as upstream
        found: list[Detection] = []
        for label in dict.fromkeys(_canonical(c) for c in categories):
            mask, prob = self.predict(image, class_prompt(label), tiled=True)
            refined = None if contours is None else refine(mask, contours, self.epoc_threshold)
            for c in instances(mask, prob, threshold, self.nms_iou, refined):
                found.append(
                    Detection(
                        label=label,
                        box=pixel_box(c.box, width, height),
                        score=min(1.0, c.score),
                        mask=encode_mask(c.mask),
                        area=float(c.mask.mean()),
                    )
                )
        found.sort(key=lambda d: -(d.score or 0.0))
        return found[: self.max_instances]

    def segment_semantic(self, image: Image.Image, classes: list[str]) -> list[SegmentClass]:
        out = []
        for label in dict.fromkeys(_canonical(c) for c in classes):
            mask, _ = self.predict(image, class_prompt(label), tiled=True)
            if mask.any():
                out.append(SegmentClass(label=label, area=float(mask.mean()), mask=encode_mask(mask)))
        return out
