"""EPOC contour refinement for RemoteSAM's detection and counting, as upstream's pipeline runs it.

Upstream (github.com/1e12Leon/RemoteSAM): `RemoteSAM(model, device, use_EPOC=True)` (README; `tasks/DET.sh` and
`tasks/CNT.sh` pass `--EPOC`) loads the DirectSAM contour model `chendelong/DirectSAM-EntitySeg-1024px-0501`, a
transformers `SegformerForSemanticSegmentation` (MiT-b5 sizes, one output channel, stored float16) with its
`SegformerImageProcessor` (`tasks/code/model.py` L78-82). `detection` (L172-203) then:
1. contour probability: `utils.EPOC` (`utils.py` L430-468, `pyramid_layers=0`): the processor's pixels -> logits in
   float32 -> bilinear resize to the image size (align_corners=False) -> sigmoid;
2. `refined = mask * (1 - (contour > EPOC_threshold))` (0.25 in `tasks/code/eval/DET.py` L22, 0.15 in `CNT.py` L19);
3. `M2B_wEPOC` (`utils.py` L233-272): 8-connected components of the refined mask; within each component of the
   unrefined mask, those larger than 0.2 x the largest one are kept; confidence = mean probability, as without EPOC.
Here the weights come from a local folder only (the model repository's files: `config.json`, `model.safetensors`,
`preprocessor_config.json`), through transformers' loader (it renames the checkpoint's legacy Segformer keys), which
must report no missing, unexpected or mis-shaped key; the model runs in float32 as upstream's (`from_pretrained`
default), weights stored in float16 are converted with a note.
The processor is transformers' PIL one (`SegformerImageProcessorPil`), the slow processor upstream's
transformers had: the fast torchvision one resizes differently.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from geopilot.errors import WeightsError
from geopilot.tools import weights as local_weights

EPOC_DIR = "DirectSAM-EntitySeg-1024px-0501"  # upstream's checkpoint name, a folder next to RemoteSAM's checkpoint
EPOC_FILES = ("config.json", "model.safetensors", "preprocessor_config.json")
DET_THRESHOLD = 0.25  # upstream tasks/code/eval/DET.py L22 (CNT.py L19 uses 0.15)
AREA_THRESHOLD = 0.2  # upstream utils.M2B default


class EpocContours:
    """DirectSAM: `probability(image) -> (H, W)` float32 contour probabilities."""

    def __init__(self, model, processor, device: torch.device):
        self.model, self.processor, self.device = model, processor, device

    @classmethod
    def from_folder(cls, folder: str | Path, device: torch.device) -> EpocContours:
        from transformers import SegformerConfig, SegformerForSemanticSegmentation, SegformerImageProcessorPil

        folder = Path(folder)
        missing = [name for name in EPOC_FILES if not (folder / name).is_file()]
        if missing:
            raise WeightsError(f"EPOC contour model at {folder} lacks {', '.join(missing)}")
        try:
            config = SegformerConfig.from_dict(json.loads((folder / "config.json").read_text()))
        except (ValueError, TypeError) as err:
            raise WeightsError(f"{folder / 'config.json'}: not a Segformer config ({err})") from None
        if config.num_labels != 1:
            raise WeightsError(
                f"{folder / 'config.json'}: DirectSAM has one output channel, this has {config.num_labels}"
            )
        weights = folder / "model.safetensors"
        try:
            model, info = SegformerForSemanticSegmentation.from_pretrained(
                str(folder), local_files_only=True, use_safetensors=True, dtype=torch.float32, output_loading_info=True
            )
        except (OSError, ValueError, RuntimeError) as err:
            raise WeightsError(f"{weights}: not loadable as DirectSAM ({str(err).strip().splitlines()[0]})") from None
        problems = [
            f"{what} ({len(keys)}): {', '.join(sorted(map(str, keys))[:6])}" for what, keys in info.items() if keys
        ]
        if problems:
            raise WeightsError(f"{weights} does not match DirectSAM's Segformer: " + "; ".join(problems))
        model = local_weights.place(model, device, "fp32", stored=_stored_dtypes(weights), source=str(weights))
        processor = SegformerImageProcessorPil.from_pretrained(str(folder), local_files_only=True)
        return cls(model, processor, device)

    @torch.inference_mode()
    def probability(self, image: Image.Image) -> np.ndarray:
        """Upstream `utils.EPOC(...).run`: processor -> logits (float32) -> bilinear to the image size -> sigmoid."""
        rgb = image.convert("RGB") if image.mode != "RGB" else image
        pixels = self.processor(rgb, return_tensors="pt").pixel_values.to(self.device, torch.float32)
        logits = self.model(pixel_values=pixels).logits.float()
        width, height = image.size
        upsampled = F.interpolate(logits, size=(height, width), mode="bilinear", align_corners=False)
        return torch.sigmoid(upsampled)[0, 0].cpu().numpy()


def _stored_dtypes(path: Path) -> set[str]:
    """The float dtypes a safetensors file stores, read from its header (no tensor is loaded)."""
    from safetensors import safe_open

    names = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}
    with safe_open(str(path), framework="pt") as handle:
        return {names[d] for d in (handle.get_slice(k).get_dtype() for k in handle.keys()) if d in names}


def refine(mask: np.ndarray, contours: np.ndarray, threshold: float) -> np.ndarray:
    """Upstream `detection`: the mask with every pixel on a contour (probability > threshold) removed."""
    return mask.astype(bool) & ~(contours > threshold)
