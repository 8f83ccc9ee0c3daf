"""The LLaVA-1.5 family (docs/models.md): `transformers.LlavaForConditionalGeneration` in the llava-hf layout.

The paper's base and the default. Its parts live where they always have: building in `geopilot.model`, the
Vicuna v1 renderer in `geopilot.render`, its chat template in `geopilot.chat_template`; this module is the
family interface over them. Every image is one fixed number of tokens (a 336 px square for the real model).
The chat template is the tokenizer's (`prepare_tokenizer` keeps one of `TEMPLATES`): Vicuna v1 for LLaVA-1.5,
ChatML for a language model instruction-tuned on it (the CPU demo's SmolLM2, `geopilot.render_chatml`); every
renderer below follows the tokenizer it is given.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from geopilot import render, render_chatml
from geopilot.chat_template import CHAT_TEMPLATE, CHATML_TEMPLATE, hf_messages
from geopilot.render import check_rendered
from geopilot.wire import SYSTEM_PROMPT, chat_turns

NAME = "llava"
MODEL_TYPE = "llava"
PROCESSOR_CLASS = "LlavaProcessor"
TOOL_TURN_ROLE = "user"  # the role of a tool turn (and a repair turn) in `hf_messages`
LORA_TARGET_MODULES = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
MODULES_TO_SAVE = ["multi_modal_projector"]
FREEZE_GROUPS = {  # freeze flag -> parameter name prefixes
    "vision_tower": ("model.vision_tower.",),
    "projector": ("model.multi_modal_projector.",),
    "language_model": ("model.language_model.", "lm_head."),
}
BOX_CONVENTION = "normalised [x1, y1, x2, y2] in [0, 1] of the image, as GeoPilot's trace format writes them"

RENDERERS: dict[str, ModuleType] = {CHAT_TEMPLATE: render, CHATML_TEMPLATE: render_chatml}  # template -> renderer

__all__ = ["CHAT_TEMPLATE", "hf_messages"]


def renderer(tokenizer) -> ModuleType:
    """The renderer of the tokenizer's chat template (a tokenizer without a GeoPilot template is Vicuna's)."""
    return RENDERERS.get(tokenizer.chat_template, render)


def render_sample(sample, tokenizer, num_image_tokens: int, max_length: int | None = None):
    """A validated sample -> ids + labels, in the tokenizer's chat template (too long or nothing trained: an error)."""
    count = num_image_tokens if sample.image else 0
    rendered = renderer(tokenizer).render_turns(chat_turns(sample.messages), tokenizer, count, sample.id)
    return check_rendered(rendered, sample, max_length)


def build(cfg):
    """ModelConfig (family llava) -> (LlavaForConditionalGeneration, LlavaProcessor)."""
    from geopilot.model import LLAVA_BUILDERS  # imported here: geopilot.model reads the family registry

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
    from geopilot.model import llava_text_hidden_size

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


def box_to_model(box: list[float], resized: tuple[int, int]) -> list[float]:
    """Boxes stay normalised (the trace format's own convention)."""
    return list(box)


def box_from_model(box: list[float], resized: tuple[int, int]) -> list[float]:
    return [min(max(float(value), 0.0), 1.0) for value in box]


# -- generation on one KV cache (geopilot.generation.KVSession) ---------------------------------------------------

PROMPT_LOOKUP = True  # plain 1-D positions: answer turns decode with prompt-lookup speculation


def image_features(model, pixel_values, image_grid_thw=None):
    """The projected image features, one entry per image (what `mm_encoder_outputs` carries)."""
    return model.get_image_features(pixel_values=pixel_values, return_dict=True).pooler_output


def vision_kwargs(image_token_id: int, input_ids, image_grid_thw=None) -> dict:
    """What a prefill that holds the image needs besides the ids: nothing for LLaVA."""
    return {}


def position_state(model):
    """LLaVA keeps no position state between calls."""
    return None


def set_position_state(model, state) -> None:
    return None


# -- the agent loop's prompts (geopilot.agent.engine.LocalEngine) ---------------------------------------------------


def image_inputs(processor, images) -> dict:
    """8-bit RGB images -> the model's image inputs (padded to square, resized, normalised)."""
    from geopilot.batch import pixel_values

    return {"pixel_values": pixel_values(processor, images)}


def prompt_ids(messages: list, tokenizer, num_image_tokens: int, system: str | None = None) -> list[int]:
    """A chat's messages (ending with a user or tool turn) -> the prompt ids, ending with the generation prompt."""
    system = SYSTEM_PROMPT if system is None else system
    return renderer(tokenizer).render_turns(chat_turns(messages), tokenizer, num_image_tokens, system=system).input_ids


def prompt_text(messages: list, tokenizer, system: str | None = None) -> str:
    """The same conversation as text (the prefix cache's key)."""
    system = SYSTEM_PROMPT if system is None else system
    return renderer(tokenizer).render_text(chat_turns(messages), tokenizer, system)


def tail_ids(tokenizer, text: str) -> list[int]:
    """A later user turn (tool outputs, a repair request) after a generated end of turn, up to the generation prompt
    (Vicuna: `USER: {text} ASSISTANT:`)."""
    return renderer(tokenizer).tail_ids(tokenizer, text)


def assistant_ids(tokenizer, text: str) -> list[int]:
    """An assistant turn as the renderer writes it (Vicuna: ` {json}</s>`)."""
    return renderer(tokenizer).assistant_ids(tokenizer, text)
