"""The LLaVA-1.5 family (docs/models.md): `transformers.LlavaForConditionalGeneration` in the llava-hf layout.

The paper's base and the default. Building (a tiny random model, a llava-hf checkpoint, CLIP + Vicuna + a fresh
projector) lives here; the Vicuna v1 renderer in `geopilot.render` and its chat template in
`geopilot.chat_template`, where they always have. Every image is one fixed number of tokens (a 336 px square for the
real model). The chat template is the tokenizer's (`prepare_tokenizer` keeps its kind, `current_template`): Vicuna v1 for
LLaVA-1.5, ChatML for a language model instruction-tuned on it (the CPU demo's SmolLM2, `geopilot.render_chatml`);
every renderer below follows the tokenizer it is given.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from geopilot import render, render_chatml
from geopilot.chat_template import CHAT_TEMPLATE, CHATML_TEMPLATE, hf_messages
from geopilot.errors import ConfigError, WeightsError
from geopilot.fileio import require_dir
from geopilot.render import check_rendered
from geopilot.tokenizer import IMAGE_TOKEN, load_tokenizer, tiny_tokenizer
from geopilot.wire import SYSTEM_PROMPT, chat_turns

NAME = "llava"
MODEL_TYPE = "llava"
PROCESSOR_CLASS = "LlavaProcessor"
NATIVE_RESOLUTION = False  # every image is one fixed square: no min_pixels / max_pixels
TOOL_TURN_ROLE = "user"  # the role of a tool turn (and a repair turn) in `hf_messages`
LORA_TARGET_MODULES = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
MODULES_TO_SAVE = ["multi_modal_projector"]
FREEZE_GROUPS = {  # freeze flag -> parameter name prefixes
    "vision_tower": ("model.vision_tower.",),
    "projector": ("model.multi_modal_projector.",),
    "language_model": ("model.language_model.", "lm_head."),
}
BOX_CONVENTION = (
    "normalised [x1, y1, x2, y2] in [0, 1] of the image (not of the padded square), 3 decimals: the trace format's "
    "own, which is LLaVA-Plus's tool-output convention (0-1 of the image) at one more decimal"
)

RENDERERS: dict[str, ModuleType] = {CHAT_TEMPLATE: render, CHATML_TEMPLATE: render_chatml}  # template -> renderer

__all__ = ["CHAT_TEMPLATE", "hf_messages"]


def renderer(tokenizer) -> ModuleType:
    """The renderer of the tokenizer's chat template (a tokenizer without a GeoPilot template is Vicuna's)."""
    return RENDERERS.get(tokenizer.chat_template, render)


def render_sample(sample, tokenizer, num_image_tokens: int, max_length: int | None = None, boxes=None):
    """A validated sample -> ids + labels, in the tokenizer's chat template (too long or nothing trained: an error).
    `boxes`: the family's box codec (LLaVA has none: the trace's boxes as they are)."""
    count = num_image_tokens if sample.image_names else 0  # per image (a sample's images share one size)
    turns = chat_turns(sample.messages, boxes=boxes)
    return check_rendered(renderer(tokenizer).render_turns(turns, tokenizer, count, sample.id), sample, max_length)


def build(cfg):
    """ModelConfig (family llava) -> (LlavaForConditionalGeneration, LlavaProcessor)."""
    return LLAVA_BUILDERS[cfg.init](cfg)


def load(path: str | Path, dtype: str | None = None):
    """A llava-hf directory -> (model, processor with a segment-safe tokenizer)."""
    import torch
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from geopilot.tokenizer import prepare_tokenizer

    kwargs = {"dtype": getattr(torch, dtype)} if dtype else {}
    model = LlavaForConditionalGeneration.from_pretrained(path, use_safetensors=True, **kwargs)
    processor = AutoProcessor.from_pretrained(path)
    prepare_tokenizer(processor.tokenizer)
    return model, processor


def text_hidden_size(cfg) -> int:
    return llava_text_hidden_size(cfg)


def image_token_count(processor, width: int, height: int) -> int:
    """The same for every image: (crop / patch)^2, whatever `width` x `height` (the image is padded and resized)."""
    crop = processor.image_processor.crop_size
    return (crop["height"] // processor.patch_size) * (crop["width"] // processor.patch_size)


def sample_image_tokens(processor, image_path: str, max_pixels: int) -> int:
    """A training sample's image tokens: the fixed count, without opening the image."""
    return image_token_count(processor, 0, 0)


def image_tokens_key(processor) -> str:
    """What the training data's token counts depend on (part of the tokenisation cache key)."""
    return str(image_token_count(processor, 0, 0))


BOX_SCHEMA = None  # a box param keeps its tool's own schema (normalised numbers)


def box_to_model(box: list[float], resized: tuple[int, int]) -> list[float]:
    """Boxes stay normalised (the trace format's own convention)."""
    return list(box)


def box_from_model(box: list[float], resized: tuple[int, int]) -> list[float]:
    return [min(max(float(value), 0.0), 1.0) for value in box]


def box_codec(processor, width: int, height: int) -> None:
    """None: the model reads and writes the trace's boxes as they are (`geopilot.boxes`)."""
    return None


def sample_boxes(processor, image_path: str, max_pixels: int) -> None:
    return None


# -- building (ModelConfig.init: tiny, llava_hf, clip_vicuna) -------------------------------------------------------


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


def _tiny_vision_config(t):
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


def _build_tiny(cfg):
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


def _build_from_llava_hf(cfg):
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


def _build_from_clip_vicuna(cfg):
    import torch
    from transformers import CLIPVisionModel

    vision_path, llm_path = require_dir(cfg.vision_path, "vision_path"), require_dir(cfg.llm_path, "llm_path")
    vision = CLIPVisionModel.from_pretrained(vision_path, dtype=getattr(torch, cfg.dtype), use_safetensors=True)
    return _assemble(cfg, vision, llm_path)


def _build_tiny_vision(cfg):
    import torch
    from transformers import CLIPVisionModel

    llm_path = require_dir(cfg.llm_path, "llm_path")
    torch.manual_seed(cfg.tiny.seed)
    vision = CLIPVisionModel._from_config(_tiny_vision_config(cfg.tiny), dtype=getattr(torch, cfg.dtype))
    return _assemble(cfg, vision, llm_path)


def _assemble(cfg, vision, llm_path: Path):
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
    return model, build_processor(tokenizer, vision.config.image_size, vision.config.patch_size)


def llava_text_hidden_size(cfg) -> int:
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


# -- generation on one KV cache (geopilot.generation.KVSession) ---------------------------------------------------

PROMPT_LOOKUP = True  # plain 1-D positions: answer turns decode with prompt-lookup speculation
STEPPABLE = True  # and one image tensor: the per-step scheduler (geopilot.serving.scheduler) can drive it


def image_features(model, pixel_values, image_grid_thw=None):
    """The projected image features, one entry per image (what `mm_encoder_outputs` carries)."""
    return model.get_image_features(pixel_values=pixel_values, return_dict=True).pooler_output


def vision_kwargs(image_token_id: int, input_ids, image_grid_thw=None) -> dict:
    """What a prefill that holds the image needs besides the ids: nothing for LLaVA."""
    return {}


def position_state(model):
    """LLaVA keeps no position state between calls."""
    return None


def step_positions(positions, states: list):
    """The position ids of rows decoded side by side (`serve --scheduler step`) from their text positions: the same."""
    return positions


def set_position_state(model, state) -> None:
    return None


# -- the agent loop's prompts (geopilot.agent.engine.LocalEngine) ---------------------------------------------------


def image_inputs(processor, images) -> dict:
    """8-bit RGB images -> the model's image inputs (padded to square, resized, normalised)."""
    from geopilot.batch import pixel_values

    return {"pixel_values": pixel_values(processor, images)}


def prompt_ids(messages: list, tokenizer, num_image_tokens: int, system: str | None = None, boxes=None) -> list[int]:
    """A chat's messages (ending with a user or tool turn) -> the prompt ids, ending with the generation prompt."""
    system = SYSTEM_PROMPT if system is None else system
    turns = chat_turns(messages, boxes=boxes)
    return renderer(tokenizer).render_turns(turns, tokenizer, num_image_tokens, system=system).input_ids


def prompt_text(messages: list, tokenizer, system: str | None = None, boxes=None) -> str:
    """The same conversation as text (the prefix cache's key)."""
    system = SYSTEM_PROMPT if system is None else system
    return renderer(tokenizer).render_text(chat_turns(messages, boxes=boxes), tokenizer, system)


def tail_ids(tokenizer, text: str) -> list[int]:
    """A later user turn (tool outputs, a repair request) after a generated end of turn, up to the generation prompt
    (Vicuna: `USER: {text} ASSISTANT:`)."""
    return renderer(tokenizer).tail_ids(tokenizer, text)


def assistant_ids(tokenizer, text: str) -> list[int]:
    """An assistant turn as the renderer writes it (Vicuna: ` {json}</s>`)."""
    return renderer(tokenizer).assistant_ids(tokenizer, text)
