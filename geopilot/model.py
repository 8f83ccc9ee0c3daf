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
from geopilot.errors import ConfigError, WeightsError, first_line
from geopilot.families import family_of_dir, family_of_model, get_family
from geopilot.families.qwen2_5_vl import TinyQwenConfig
from geopilot.tokenizer import IMAGE_TOKEN, load_tokenizer, tiny_tokenizer

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
        if self.family != "qwen2_5_vl" and (self.min_pixels or self.max_pixels):
            raise ValueError("min_pixels/max_pixels apply to family qwen2_5_vl (LLaVA-1.5 sees a fixed square)")
        if self.min_pixels and self.max_pixels and self.min_pixels > self.max_pixels:
            raise ValueError(f"min_pixels {self.min_pixels} is above max_pixels {self.max_pixels}")
        return self

    @property
    def checkpoint_dir(self) -> str | None:
        """The directory this config loads weights from (None: built from parts or random)."""
        return {"llava_hf": self.llava_path, "pretrained": self.path}.get(self.init)


def num_image_tokens(config) -> int:
    """Image tokens per image for a LlavaConfig: (image / patch)^2, +1 when the CLS token is kept ("full")."""
    vision = config.vision_config
    patches = (vision.image_size // vision.patch_size) ** 2
    return patches + (1 if config.vision_feature_select_strategy == "full" else 0)


def vit_l14_336_config():
    """The real CLIP-ViT-L/14-336 vision config (openai/clip-vit-large-patch14-336), for shape checks without weights."""
    from transformers import CLIPVisionConfig

    return CLIPVisionConfig(
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=24,
        num_attention_heads=16,
        image_size=336,
        patch_size=14,
        projection_dim=768,
        hidden_act="quick_gelu",
    )


def build_processor(tokenizer, image_size: int, patch_size: int):
    """LlavaProcessor = pad-to-square (CLIP mean colour) + resize + CLIP normalisation, tokenizer, chat template."""
    from transformers import LlavaImageProcessorPil, LlavaProcessor

    image_processor = LlavaImageProcessorPil(
        do_pad=True,
        size={"shortest_edge": image_size},
        crop_size={"height": image_size, "width": image_size},
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=patch_size,
        vision_feature_select_strategy="default",
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,  # the CLS token the vision tower adds and "default" drops
        chat_template=tokenizer.chat_template,  # the template `prepare_tokenizer` gave it (Vicuna's or ChatML)
    )


def _llava_config(vision_config, text_config, image_token_id: int, feature_layer: int):
    from transformers import LlavaConfig

    config = LlavaConfig(
        vision_config=vision_config,
        text_config=text_config,
        image_token_index=image_token_id,
        projector_hidden_act="gelu",
        vision_feature_layer=feature_layer,
        vision_feature_select_strategy="default",
    )
    config.image_seq_length = num_image_tokens(config)
    return config


def _tiny_vision_config(t: TinyModelConfig):
    from transformers import CLIPVisionConfig

    return CLIPVisionConfig(
        hidden_size=t.vision_hidden,
        intermediate_size=4 * t.vision_hidden,
        num_hidden_layers=t.vision_layers,
        num_attention_heads=t.vision_heads,
        image_size=t.image_size,
        patch_size=t.patch_size,
        projection_dim=t.vision_hidden,
    )


def _build_tiny(cfg: ModelConfig):
    import torch
    from transformers import LlamaConfig, LlavaForConditionalGeneration

    t = cfg.tiny
    tokenizer = load_tokenizer(cfg.tokenizer_path) if cfg.tokenizer_path else tiny_tokenizer()
    vision = _tiny_vision_config(t)
    vocab = -(-len(tokenizer) // cfg.pad_vocab_to_multiple_of) * cfg.pad_vocab_to_multiple_of
    text = LlamaConfig(
        vocab_size=vocab,
        hidden_size=t.text_hidden,
        intermediate_size=t.text_intermediate,
        num_hidden_layers=t.text_layers,
        num_attention_heads=t.text_heads,
        num_key_value_heads=t.text_kv_heads,
        max_position_embeddings=t.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = _llava_config(vision, text, tokenizer.convert_tokens_to_ids(IMAGE_TOKEN), cfg.vision_feature_layer)
    torch.manual_seed(t.seed)
    model = LlavaForConditionalGeneration._from_config(config, dtype=getattr(torch, cfg.dtype))
    return model, build_processor(tokenizer, t.image_size, t.patch_size)


def require_dir(path: str | None, what: str) -> Path:
    if not path:
        raise ConfigError(f"model config needs {what}")
    if not Path(path).is_dir():
        raise WeightsError(f"{what} directory not found: {path}")
    return Path(path)


def _build_from_llava_hf(cfg: ModelConfig):
    import torch
    from transformers import LlavaForConditionalGeneration

    path = require_dir(cfg.llava_path, "llava_path")
    tokenizer = load_tokenizer(cfg.tokenizer_path or path)
    model = LlavaForConditionalGeneration.from_pretrained(path, dtype=getattr(torch, cfg.dtype), use_safetensors=True)
    config = model.config
    if config.vision_feature_select_strategy != "default" or config.vision_feature_layer != cfg.vision_feature_layer:
        raise ConfigError(
            f"{path}: expected feature layer {cfg.vision_feature_layer} / select 'default', got "
            f"{config.vision_feature_layer} / {config.vision_feature_select_strategy!r}"
        )
    if tokenizer.convert_tokens_to_ids(IMAGE_TOKEN) != config.image_token_index:
        raise ConfigError(f"{path}: the tokenizer's {IMAGE_TOKEN} id differs from the model's image_token_index")
    vision = config.vision_config
    return model, build_processor(tokenizer, vision.image_size, vision.patch_size)


def _build_from_clip_vicuna(cfg: ModelConfig):
    import torch
    from transformers import CLIPVisionModel

    vision_path, llm_path = require_dir(cfg.vision_path, "vision_path"), require_dir(cfg.llm_path, "llm_path")
    vision = CLIPVisionModel.from_pretrained(vision_path, dtype=getattr(torch, cfg.dtype), use_safetensors=True)
    return _assemble(cfg, vision, llm_path)


def _build_tiny_vision(cfg: ModelConfig):
    import torch
    from transformers import CLIPVisionModel

    llm_path = require_dir(cfg.llm_path, "llm_path")
    torch.manual_seed(cfg.tiny.seed)
    vision = CLIPVisionModel._from_config(_tiny_vision_config(cfg.tiny), dtype=getattr(torch, cfg.dtype))
    return _assemble(cfg, vision, llm_path)


def _assemble(cfg: ModelConfig, vision, llm_path: Path):
    """A LLaVA of a vision tower, a fresh 2-layer GELU projector and the causal LM in `llm_path` (+ its tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, LlavaForConditionalGeneration
    from transformers.models.llava.modeling_llava import LlavaMultiModalProjector

    dtype = getattr(torch, cfg.dtype)
    tokenizer = load_tokenizer(cfg.tokenizer_path or llm_path)
    llm = AutoModelForCausalLM.from_pretrained(llm_path, dtype=dtype, use_safetensors=True)
    config = _llava_config(
        vision.config, llm.config, tokenizer.convert_tokens_to_ids(IMAGE_TOKEN), cfg.vision_feature_layer
    )
    with torch.device("meta"):  # a shell: every submodule is replaced below, so nothing is allocated twice
        model = LlavaForConditionalGeneration(config)
    model.model.vision_tower = vision
    model.model.language_model = llm.model
    model.lm_head = llm.lm_head
    model.model.multi_modal_projector = LlavaMultiModalProjector(config).to(dtype)  # fresh, PyTorch default init
    model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=cfg.pad_vocab_to_multiple_of)
    leftover = [name for name, p in model.named_parameters() if p.is_meta]
    if leftover:
        raise WeightsError(f"parameters left uninitialised: {leftover[:5]}")
    vision_config = vision.config
    return model, build_processor(tokenizer, vision_config.image_size, vision_config.patch_size)


def text_hidden_size(cfg: ModelConfig) -> int:
    """The language model's hidden size, read from config files only (no weights), e.g. to size ZeRO buckets."""
    return get_family(cfg.family).text_hidden_size(cfg)


def llava_text_hidden_size(cfg: ModelConfig) -> int:
    from transformers import AutoConfig

    if cfg.init == "tiny":
        return cfg.tiny.text_hidden
    if cfg.init == "llava_hf":
        return AutoConfig.from_pretrained(require_dir(cfg.llava_path, "llava_path")).text_config.hidden_size
    # clip_vicuna, tiny_vision: the causal LM's own config
    return AutoConfig.from_pretrained(require_dir(cfg.llm_path, "llm_path")).hidden_size


LLAVA_BUILDERS = {
    "tiny": _build_tiny,
    "llava_hf": _build_from_llava_hf,
    "clip_vicuna": _build_from_clip_vicuna,
    "tiny_vision": _build_tiny_vision,
}


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
