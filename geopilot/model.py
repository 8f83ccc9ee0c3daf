"""The model: `transformers.LlavaForConditionalGeneration` in the llava-hf layout (loads in plain transformers and vLLM).

Three ways to build it (`ModelConfig.init`):
  llava_hf     a llava-hf LLaVA-1.5-7B directory (the paper's initialisation)
  clip_vicuna  a CLIP-ViT-L/14-336 directory + a Vicuna-7B-v1.5 directory + a fresh 2-layer GELU projector
  tiny         a small random config, for tests and CPU runs
Always: vision feature layer -2, feature select "default" (CLS dropped), pad-to-square with the CLIP mean colour.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Literal

from geopilot.chat_template import CHAT_TEMPLATE
from geopilot.config import StrictConfig
from geopilot.device import resolve_device
from geopilot.errors import ConfigError, WeightsError, first_line
from geopilot.tokenizer import IMAGE_TOKEN, load_tokenizer, prepare_tokenizer, tiny_tokenizer

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


class ModelConfig(StrictConfig):
    init: Literal["llava_hf", "clip_vicuna", "tiny"] = "tiny"
    llava_path: str | None = None  # init=llava_hf: a llava-hf checkpoint directory
    vision_path: str | None = None  # init=clip_vicuna: CLIP ViT-L/14-336 (CLIPModel or CLIPVisionModel directory)
    llm_path: str | None = None  # init=clip_vicuna: Vicuna-7B-v1.5 (LlamaForCausalLM directory)
    tokenizer_path: str | None = None  # default: llava_path or llm_path; tiny: this dir, else a BPE trained in-process
    vision_feature_layer: int = -2
    pad_vocab_to_multiple_of: int = 64  # llava-hf pads 32002 -> 32064
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    tiny: TinyModelConfig = TinyModelConfig()


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
    tokenizer.chat_template = CHAT_TEMPLATE
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=patch_size,
        vision_feature_select_strategy="default",
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,  # the CLS token the vision tower adds and "default" drops
        chat_template=CHAT_TEMPLATE,
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


def _build_tiny(cfg: ModelConfig):
    import torch
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaForConditionalGeneration

    t = cfg.tiny
    tokenizer = load_tokenizer(cfg.tokenizer_path) if cfg.tokenizer_path else tiny_tokenizer()
    vision = CLIPVisionConfig(
        hidden_size=t.vision_hidden,
        intermediate_size=4 * t.vision_hidden,
        num_hidden_layers=t.vision_layers,
        num_attention_heads=t.vision_heads,
        image_size=t.image_size,
        patch_size=t.patch_size,
        projection_dim=t.vision_hidden,
    )
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


def _require_dir(path: str | None, what: str) -> Path:
    if not path:
        raise ConfigError(f"model config needs {what}")
    if not Path(path).is_dir():
        raise WeightsError(f"{what} directory not found: {path}")
    return Path(path)


def _build_from_llava_hf(cfg: ModelConfig):
    import torch
    from transformers import LlavaForConditionalGeneration

    path = _require_dir(cfg.llava_path, "llava_path")
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
    from transformers import AutoModelForCausalLM, CLIPVisionModel, LlavaForConditionalGeneration
    from transformers.models.llava.modeling_llava import LlavaMultiModalProjector

    vision_path, llm_path = _require_dir(cfg.vision_path, "vision_path"), _require_dir(cfg.llm_path, "llm_path")
    dtype = getattr(torch, cfg.dtype)
    tokenizer = load_tokenizer(cfg.tokenizer_path or llm_path)
    vision = CLIPVisionModel.from_pretrained(vision_path, dtype=dtype, use_safetensors=True)
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
    return model, build_processor(tokenizer, vision.config.image_size, vision.config.patch_size)


def text_hidden_size(cfg: ModelConfig) -> int:
    """The language model's hidden size, read from config files only (no weights), e.g. to size ZeRO buckets."""
    from transformers import AutoConfig

    if cfg.init == "tiny":
        return cfg.tiny.text_hidden
    if cfg.init == "llava_hf":
        return AutoConfig.from_pretrained(_require_dir(cfg.llava_path, "llava_path")).text_config.hidden_size
    return AutoConfig.from_pretrained(_require_dir(cfg.llm_path, "llm_path")).hidden_size


BUILDERS = {"tiny": _build_tiny, "llava_hf": _build_from_llava_hf, "clip_vicuna": _build_from_clip_vicuna}


def build_model(cfg: ModelConfig):
    """ModelConfig -> (LlavaForConditionalGeneration, LlavaProcessor)."""
    return BUILDERS[cfg.init](cfg)


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
    import torch
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    path = Path(path)
    if not (path / "config.json").is_file():
        raise WeightsError(
            f"no model at {path} (expected config.json + *.safetensors, e.g. from `geopilot init-model`)"
        )
    kwargs = {"dtype": getattr(torch, dtype)} if dtype else {}
    target = resolve_device(device)  # an unknown or absent device: one line, before any weights are read
    try:
        model = LlavaForConditionalGeneration.from_pretrained(path, use_safetensors=True, **kwargs)
    except Exception as err:  # noqa: BLE001 - truncated/corrupt safetensors, missing shards: all mean a bad model dir
        first = first_line(err)
        raise WeightsError(f"{path}: the model weights cannot be read ({type(err).__name__}: {first})") from None
    if adapter is not None:
        model = apply_adapter(model, adapter)
    model = model.to(target).eval()
    processor = AutoProcessor.from_pretrained(path)
    prepare_tokenizer(processor.tokenizer)
    return model, processor


def apply_adapter(model, adapter: str | Path):
    """peft's `PeftModel.from_pretrained(base, DIR)` (the projector is among its saved modules), merged for speed."""
    from peft import PeftModel

    adapter = Path(adapter)
    if not (adapter / "adapter_config.json").is_file():
        raise WeightsError(f"no LoRA adapter at {adapter} (expected adapter_config.json, from export.adapter=true)")
    try:
        return PeftModel.from_pretrained(model, adapter).merge_and_unload()
    except Exception as err:  # noqa: BLE001 - a shape mismatch means the adapter was trained over another base
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise WeightsError(
            f"{adapter}: the adapter does not fit this base model ({type(err).__name__}: {first})"
        ) from None
