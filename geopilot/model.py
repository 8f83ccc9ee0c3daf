"""The model config, building, saving and loading; what differs per base lives in `geopilot.families` (docs/models.md).

`ModelConfig.family` picks the base: `llava` (default, the paper's LLaVA-1.5 as
`transformers.LlavaForConditionalGeneration` in the llava-hf layout) or `qwen2_5_vl` (Qwen2.5-VL at native
resolution). Ways to build it (`ModelConfig.init`):
  llava_hf     llava: a llava-hf LLaVA-1.5-7B directory (the paper's initialisation)
  clip_vicuna  llava: a CLIP-ViT-L/14-336 directory + a Vicuna-7B-v1.5 directory + a fresh 2-layer GELU projector
  pretrained   qwen2_5_vl: a Qwen2.5-VL directory as transformers writes it (`path`)
  tiny         a small random model of the family, for tests and CPU runs
  tiny_vision  llava: a small random vision tower (`tiny`'s vision sizes) + a fresh projector in front of a causal
               LM directory (`llm_path`; the CPU demo's SmolLM2-135M-Instruct)
LLaVA always: vision feature layer -2, feature select "default" (CLS dropped), pad-to-square with the CLIP mean colour.
Saved models load in plain transformers and vLLM; `load_model` picks the family from config.json's `model_type`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from geopilot.config import StrictConfig
from geopilot.device import resolve_device
from geopilot.errors import WeightsError, first_line
from geopilot.families import FAMILIES, family_of_dir, family_of_model, get_family

# LLaVA's builders live in its family module (geopilot/families/llava.py); these names stay importable from here
from geopilot.families.llava import LLAVA_BUILDERS as LLAVA_BUILDERS
from geopilot.families.llava import build_processor as build_processor
from geopilot.families.llava import llava_text_hidden_size as llava_text_hidden_size
from geopilot.families.llava import num_image_tokens as num_image_tokens
from geopilot.families.llava import vit_l14_336_config as vit_l14_336_config
from geopilot.families.qwen2_5_vl import TinyQwenConfig
from geopilot.fileio import require_dir as require_dir
from geopilot.tokenizer import load_tokenizer as load_tokenizer

DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


class TinyModelConfig(StrictConfig):
    """Sizes of the random model used in tests: small enough for a CPU step in well under a second."""

    image_size: int = 32
    patch_size: int = 8  # -> (32 / 8)^2 = 16 image tokens
    vision_hidden: int = 32
    vision_layers: int = 2
    vision_heads: int = 2
    text_hidden: int = 64
    text_layers: int = 2
    text_heads: int = 4
    text_kv_heads: int = 4
    text_intermediate: int = 128
    max_position_embeddings: int = 2048
    seed: int = 0


FAMILY_INITS = {"llava": ("tiny", "llava_hf", "clip_vicuna", "tiny_vision"), "qwen2_5_vl": ("tiny", "pretrained")}


class ModelConfig(StrictConfig):
    family: Literal["llava", "qwen2_5_vl"] = "llava"
    init: Literal["llava_hf", "clip_vicuna", "pretrained", "tiny", "tiny_vision"] = "tiny"
    path: str | None = None  # init=pretrained: a model directory of the family (e.g. a Qwen2.5-VL-7B-Instruct copy)
    llava_path: str | None = None  # init=llava_hf: a llava-hf checkpoint directory
    vision_path: str | None = None  # init=clip_vicuna: CLIP ViT-L/14-336 (CLIPModel or CLIPVisionModel directory)
    llm_path: str | None = None  # init=clip_vicuna: Vicuna-7B-v1.5; tiny_vision: any causal LM directory
    tokenizer_path: str | None = None  # default: llava_path or llm_path; tiny: this dir, else a BPE trained in-process
    vision_feature_layer: int = -2
    pad_vocab_to_multiple_of: int = 64  # llava-hf pads 32002 -> 32064
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    tiny: TinyModelConfig = TinyModelConfig()
    tiny_qwen: TinyQwenConfig = TinyQwenConfig()
    # qwen2_5_vl: each image is resized within [min_pixels, max_pixels] (unset: Qwen's 56*56 .. 28*28*1280)
    min_pixels: int | None = Field(None, ge=28 * 28)
    max_pixels: int | None = Field(None, ge=28 * 28)

    @model_validator(mode="after")
    def _fits_the_family(self) -> ModelConfig:
        if self.init not in FAMILY_INITS[self.family]:
            raise ValueError(
                f"init {self.init!r} does not build family {self.family!r} (it takes {', '.join(FAMILY_INITS[self.family])})"
            )
        if not get_family(self.family).NATIVE_RESOLUTION and (self.min_pixels or self.max_pixels):
            native = ", ".join(name for name, family in FAMILIES.items() if family.NATIVE_RESOLUTION)
            raise ValueError(f"min_pixels/max_pixels apply to family {native} ({self.family} sees a fixed square)")
        if self.min_pixels and self.max_pixels and self.min_pixels > self.max_pixels:
            raise ValueError(f"min_pixels {self.min_pixels} is above max_pixels {self.max_pixels}")
        return self

    @property
    def checkpoint_dir(self) -> str | None:
        """The directory this config loads weights from (None: built from parts or random)."""
        return {"llava_hf": self.llava_path, "pretrained": self.path}.get(self.init)


def text_hidden_size(cfg: ModelConfig) -> int:
    """The language model's hidden size, read from config files only (no weights), e.g. to size ZeRO buckets."""
    return get_family(cfg.family).text_hidden_size(cfg)


def build_model(cfg: ModelConfig):
    """ModelConfig -> (model, processor) of its family."""
    return get_family(cfg.family).build(cfg)


def save_model(model, processor, out_dir: str | Path) -> Path:
    """Write weights (safetensors) + processor side by side, atomically: into a sibling temp dir, then renamed."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        processor.save_pretrained(staging)
        os.chmod(staging, 0o755)  # mkdtemp makes it 0700; a model directory is for others to read too
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def load_model(path: str | Path, device: str = "cpu", dtype: str | None = None, adapter: str | Path | None = None):
    """GeoPilot's loading path: a saved model dir -> (model in eval mode, processor with a segment-safe tokenizer).
    `adapter`: a LoRA adapter dir from training (`export.adapter`), applied over this base and merged."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise WeightsError(
            f"no model at {path} (expected config.json + *.safetensors, e.g. from `geopilot init-model`)"
        )
    family = family_of_dir(path)  # a model_type of no family: one line naming the supported ones
    target = resolve_device(device)  # an unknown or absent device: one line, before any weights are read
    try:
        model, processor = family.load(path, dtype)
    except Exception as err:  # noqa: BLE001 - truncated/corrupt safetensors, missing shards: all mean a bad model dir
        first = first_line(err)
        raise WeightsError(f"{path}: the model weights cannot be read ({type(err).__name__}: {first})") from None
    if adapter is not None:
        model = apply_adapter(model, adapter)
    return model.to(target).eval(), processor


def apply_adapter(model, adapter: str | Path):
    """peft's `PeftModel.from_pretrained(base, DIR)` (the projector is among its saved modules), merged for speed."""
    from peft import PeftModel

    adapter = Path(adapter)
    if not (adapter / "adapter_config.json").is_file():
        raise WeightsError(f"no LoRA adapter at {adapter} (expected adapter_config.json, from export.adapter=true)")
    trained_on, base = adapter_family(adapter), family_of_model(model).NAME
    if trained_on != base:
        raise WeightsError(f"{adapter}: a LoRA adapter trained on a {trained_on} base cannot load onto a {base} base")
    try:
        return PeftModel.from_pretrained(model, adapter).merge_and_unload()
    except Exception as err:  # noqa: BLE001 - a shape mismatch means the adapter was trained over another base
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise WeightsError(
            f"{adapter}: the adapter does not fit this base model ({type(err).__name__}: {first})"
        ) from None


def adapter_family(adapter: Path) -> str:
    """The family an exported adapter was trained on (its run record; adapters from before families are LLaVA's)."""
    import json

    record = adapter / "geopilot_train.json"
    if not record.is_file():
        return "llava"
    try:
        return json.loads(record.read_text(encoding="utf-8"))["config"]["model"].get("family", "llava")
    except (ValueError, KeyError, TypeError):
        raise WeightsError(f"{record}: not a readable run record") from None
