"""The Qwen2.5-VL family (docs/models.md): `transformers.Qwen2_5_VLForConditionalGeneration` at native resolution.

- Image tokens follow the image size: 14 px patches merged 2x2, one token per 28 x 28 px of the image resized
  (aspect kept) to a multiple of 28 within `min_pixels`..`max_pixels` (`image_token_count`).
- Chat: ChatML with Qwen's own template, exactly as its model repository ships it (`CHAT_TEMPLATE`); the renderer
  writes the same tokens segment by segment, so labels cover exactly each assistant turn's `{json}<|im_end|>`.
  A GeoPilot tool turn (`geopilot.wire.format_tool_turn`) is a `tool` message.
- Boxes: Qwen2.5-VL was pretrained on absolute integer pixel coordinates of its resized input (`smart_resize`'s
  size; its grounding answers read `{"bbox_2d": [x1, y1, x2, y2], "label": ...}`). Every box the model reads
  (tool outputs, plan params, answers quoting one) is written so, and read back (`box_codec`, `geopilot.boxes`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from geopilot.boxes import BoxCodec
from geopilot.config import StrictConfig
from geopilot.errors import ConfigError
from geopilot.fileio import require_dir
from geopilot.render import IGNORE_INDEX, Rendered, check_rendered
from geopilot.sample import IMAGE_PLACEHOLDER, Message, Sample
from geopilot.tokenizer import encode_text
from geopilot.wire import chat_turns

NAME = "qwen2_5_vl"
MODEL_TYPE = "qwen2_5_vl"
PROCESSOR_CLASS = "Qwen2_5_VLProcessor"
NATIVE_RESOLUTION = True  # image tokens follow the image size within min_pixels / max_pixels
TOOL_TURN_ROLE = "tool"  # the role of a tool turn (and a repair turn) in `hf_messages`
DEFAULT_SYSTEM = "You are a helpful assistant."  # what the upstream template writes when no system message comes
IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
SPECIAL_TOKENS = [END_OF_TEXT, IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]
DEFAULT_MIN_PIXELS, DEFAULT_MAX_PIXELS = 56 * 56, 28 * 28 * 1280  # Qwen2VLImageProcessor's defaults
LORA_TARGET_MODULES = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
MODULES_TO_SAVE = ["merger"]  # the vision-to-LLM projector (`model.visual.merger`), LLaVA's multi_modal_projector
FREEZE_GROUPS = {  # freeze flag -> parameter name prefixes (the merger is the projector, not the vision tower)
    "vision_tower": ("model.visual.patch_embed.", "model.visual.blocks."),
    "projector": ("model.visual.merger.",),
    "language_model": ("model.language_model.", "lm_head."),
}
BOX_CONVENTION = (
    "absolute integer pixel coordinates [x1, y1, x2, y2] of the image as the processor resizes it (smart_resize)"
)
# what a plan's box param is decoded in: four whole pixels (`geopilot.agent.plan_schema.plan_json_schema`)
BOX_SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 4, "maxItems": 4}
BOX_DECIMALS = 4  # a box read back: 1e-4 of the side is under a pixel up to 5000 px

# Qwen/Qwen2.5-VL-7B-Instruct chat_template.json, verbatim (the same text as Qwen2-VL's).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] "
    "== 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content "
    "%}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}"
)


class TinyQwenConfig(StrictConfig):
    """A random Qwen2.5-VL small enough for CPU tests (~0.4 M parameters; a 448 px square is 256 image tokens)."""

    text_hidden: int = 64
    text_layers: int = 2
    text_heads: int = 4
    text_kv_heads: int = 2
    text_intermediate: int = 128
    mrope_section: list[int] = Field(default_factory=lambda: [2, 2, 4])  # sums to head_dim / 2
    vision_hidden: int = 64
    vision_intermediate: int = 128
    vision_depth: int = 2
    vision_heads: int = 4
    window_size: int = 56
    fullatt_block_indexes: list[int] = Field(default_factory=lambda: [1])
    max_position_embeddings: int = 32768
    vocab_size: int = 1024  # of the byte-level BPE trained in process
    seed: int = 0

    @model_validator(mode="after")
    def _mrope_fits_the_heads(self) -> TinyQwenConfig:
        half = self.text_hidden // self.text_heads // 2
        if sum(self.mrope_section) != half:
            raise ValueError(f"mrope_section {self.mrope_section} must sum to head_dim / 2 = {half}")
        return self


def tiny_tokenizer(vocab_size: int = 1024):
    """A byte-level BPE with Qwen's ChatML and vision special tokens, trained in process (deterministic)."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    from geopilot.tokenizer import tiny_corpus

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([DEFAULT_SYSTEM, "system user assistant tool"] + tiny_corpus(), trainer=trainer)
    merges = [tuple(pair) for pair in json.loads(bpe.to_str())["model"]["merges"]]
    tokenizer = Qwen2Tokenizer(
        vocab=bpe.get_vocab(), merges=merges, unk_token=None, eos_token=IM_END, pad_token=END_OF_TEXT
    )
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[1:]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_processor(tokenizer, min_pixels: int, max_pixels: int):
    """Qwen2_5_VLProcessor: resize within [min_pixels, max_pixels] to multiples of 28, the tokenizer, the template."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessorPil, Qwen2VLVideoProcessor

    tokenizer.chat_template = CHAT_TEMPLATE
    return Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),  # unused here; the processor class requires one
        chat_template=CHAT_TEMPLATE,
    )


def _build_tiny(cfg):
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    t = cfg.tiny_qwen
    tokenizer = tiny_tokenizer(t.vocab_size)
    ids = dict(zip(SPECIAL_TOKENS, tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS), strict=True))
    vocab = -(-len(tokenizer) // cfg.pad_vocab_to_multiple_of) * cfg.pad_vocab_to_multiple_of
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": vocab,
            "hidden_size": t.text_hidden,
            "intermediate_size": t.text_intermediate,
            "num_hidden_layers": t.text_layers,
            "num_attention_heads": t.text_heads,
            "num_key_value_heads": t.text_kv_heads,
            "max_position_embeddings": t.max_position_embeddings,
            "rope_scaling": {"type": "mrope", "mrope_section": t.mrope_section},
            "bos_token_id": None,
            "eos_token_id": ids[IM_END],
            "pad_token_id": ids[END_OF_TEXT],
        },
        vision_config={
            "depth": t.vision_depth,
            "hidden_size": t.vision_hidden,
            "intermediate_size": t.vision_intermediate,
            "num_heads": t.vision_heads,
            "out_hidden_size": t.text_hidden,
            "window_size": t.window_size,
            "fullatt_block_indexes": t.fullatt_block_indexes,
        },
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
    )
    torch.manual_seed(t.seed)
    model = Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=getattr(torch, cfg.dtype))
    model.generation_config.eos_token_id = ids[IM_END]
    model.generation_config.pad_token_id = ids[END_OF_TEXT]
    return model, build_processor(tokenizer, *pixel_range(cfg))


def _build_pretrained(cfg):
    path = require_dir(cfg.path, "path")
    model, processor = load(path, cfg.dtype)
    saved = processor.image_processor.size  # the saved processor's range, unless the config sets its own
    min_pixels, max_pixels = cfg.min_pixels or saved["shortest_edge"], cfg.max_pixels or saved["longest_edge"]
    if min_pixels > max_pixels:
        raise ConfigError(f"min_pixels {min_pixels} is above max_pixels {max_pixels} (with {path}'s processor)")
    processor.image_processor.size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    return model, processor


def pixel_range(cfg) -> tuple[int, int]:
    """The model config's (min_pixels, max_pixels), Qwen's defaults where unset (ModelConfig checks the order)."""
    return (cfg.min_pixels or DEFAULT_MIN_PIXELS, cfg.max_pixels or DEFAULT_MAX_PIXELS)


def build(cfg):
    """ModelConfig (family qwen2_5_vl) -> (Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor)."""
    return {"tiny": _build_tiny, "pretrained": _build_pretrained}[cfg.init](cfg)


def load(path: str | Path, dtype: str | None = None):
    """A Qwen2.5-VL directory as transformers writes it -> (model, processor with GeoPilot's pad/eos checked)."""
    import torch
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    kwargs = {"dtype": getattr(torch, dtype)} if dtype else {}
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(path, use_safetensors=True, **kwargs)
    processor = AutoProcessor.from_pretrained(path)
    tokenizer = processor.tokenizer
    if tokenizer.pad_token is None:
        tokenizer.pad_token = END_OF_TEXT
    tokenizer.padding_side = "right"
    return model, processor


def text_hidden_size(cfg) -> int:
    from transformers import AutoConfig

    if cfg.init == "tiny":
        return cfg.tiny_qwen.text_hidden
    return AutoConfig.from_pretrained(require_dir(cfg.path, "path")).text_config.hidden_size


def image_token_count(processor, width: int, height: int) -> int:
    """Image tokens for a `width` x `height` image: one per merged 28 x 28 px patch of the resized image."""
    height, width = resized_size(processor, width, height)
    unit = processor.image_processor.patch_size * processor.image_processor.merge_size
    return (height // unit) * (width // unit)


def sample_image_tokens(processor, image_path: str, max_pixels: int) -> int:
    """A training sample's image tokens: its image's size as `geopilot.image.load_image` reads it, resized."""
    from geopilot.image import load_image

    width, height = load_image(image_path, max_pixels=max_pixels).image.size
    return image_token_count(processor, width, height)


def image_tokens_key(processor) -> str:
    """What the training data's token counts depend on (part of the tokenisation cache key)."""
    size = processor.image_processor.size
    return f"{NAME}:{size['shortest_edge']}-{size['longest_edge']}"


def resized_size(processor, width: int, height: int) -> tuple[int, int]:
    """(height, width) the processor resizes a `width` x `height` image to (Qwen's `smart_resize`); a processor
    of None: Qwen's defaults (a served model whose folder is not here)."""
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    if processor is None:
        return smart_resize(height, width, factor=28, min_pixels=DEFAULT_MIN_PIXELS, max_pixels=DEFAULT_MAX_PIXELS)
    image_processor = processor.image_processor
    return smart_resize(
        height,
        width,
        factor=image_processor.patch_size * image_processor.merge_size,
        min_pixels=image_processor.size["shortest_edge"],
        max_pixels=image_processor.size["longest_edge"],
    )


def box_to_model(box: list[float], resized: tuple[int, int]) -> list[int]:
    """A normalised [x1, y1, x2, y2] box -> Qwen2.5-VL's absolute pixels on the resized (height, width) image."""
    height, width = resized
    x1, y1, x2, y2 = box
    return [round(x1 * width), round(y1 * height), round(x2 * width), round(y2 * height)]


def box_from_model(box: list[float], resized: tuple[int, int]) -> list[float]:
    """Qwen2.5-VL's absolute pixels on the resized (height, width) image -> a normalised box clipped to [0, 1]."""
    height, width = resized
    scale = (width, height, width, height)
    return [round(min(max(value / size, 0.0), 1.0), BOX_DECIMALS) for value, size in zip(box, scale, strict=True)]


def box_codec(processor, width: int, height: int) -> BoxCodec:
    """A `width` x `height` image's boxes in pixels of the size the processor resizes it to."""
    resized = resized_size(processor, width, height)
    return BoxCodec(lambda box: box_to_model(box, resized), lambda box: box_from_model(box, resized))


def sample_boxes(processor, image_path: str, max_pixels: int) -> BoxCodec:
    """A training sample's box codec: its image's size as `geopilot.image.load_image` reads it, resized."""
    from geopilot.image import load_image

    return box_codec(processor, *load_image(image_path, max_pixels=max_pixels).image.size)


def hf_messages(messages: list[Message], system: str | None = None, boxes: BoxCodec | None = None) -> list[dict]:
    """Sample messages -> the HF message form `CHAT_TEMPLATE` reads: a user turn with images is
    `[{"type": "image"}, ..., {"type": "text", "text": question}]` (one image part per image, in order), each
    round's tool outputs ONE `tool` message written by `format_tool_turn`, an assistant turn its compact JSON.
    `system` replaces Qwen's default system prompt; `boxes` (`box_codec` of the image) writes every box in pixels
    of the resized image."""
    out: list[dict] = [] if system is None else [{"role": "system", "content": system}]
    for role, text in chat_turns(messages, tool_role=TOOL_TURN_ROLE, boxes=boxes):
        if role == "user" and (count := text.count(IMAGE_PLACEHOLDER)):
            question = text.replace(IMAGE_PLACEHOLDER, "").strip()
            out.append({"role": role, "content": [{"type": "image"}] * count + [{"type": "text", "text": question}]})
        else:
            out.append({"role": role, "content": text})
    return out


def _message_ids(message: dict, tokenizer, num_image_tokens: int) -> tuple[list[int], list[int]]:
    """One message `<|im_start|>{role}\n{content}<|im_end|>\n` -> (ids, labels): an assistant message trains on
    `{content}<|im_end|>`, nothing else is trained. Text stays text (a `<|im_end|>` written in it ends nothing)."""
    special = dict(zip(SPECIAL_TOKENS, tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS), strict=True))
    head = [special[IM_START]] + encode_text(tokenizer, message["role"] + "\n")
    content = message["content"]
    body: list[int] = []
    for part in [{"type": "text", "text": content}] if isinstance(content, str) else content:
        if part["type"] == "image":
            body += [special[VISION_START]] + [special[IMAGE_PAD]] * num_image_tokens + [special[VISION_END]]
        else:
            body += encode_text(tokenizer, part["text"])
    body += [special[IM_END]]
    newline = encode_text(tokenizer, "\n")
    trained = body if message["role"] == "assistant" else [IGNORE_INDEX] * len(body)
    return head + body + newline, [IGNORE_INDEX] * len(head) + trained + [IGNORE_INDEX] * len(newline)


def _generation_prompt(tokenizer) -> list[int]:
    return tokenizer.convert_tokens_to_ids([IM_START]) + encode_text(tokenizer, "assistant\n")


def render_messages(
    messages: list[dict], tokenizer, num_image_tokens: int, add_generation_prompt: bool = False
) -> Rendered:
    """HF messages (as `hf_messages` writes them) -> the ids `CHAT_TEMPLATE` gives once the processor expands each
    image to `num_image_tokens` pads, built message by message so labels cover exactly `{json}<|im_end|>` of each
    assistant turn; Qwen's default system message first unless the messages bring one."""
    if not messages or messages[0]["role"] != "system":
        messages = [{"role": "system", "content": DEFAULT_SYSTEM}] + messages
    ids: list[int] = []
    labels: list[int] = []
    for message in messages:
        message_ids, message_labels = _message_ids(message, tokenizer, num_image_tokens)
        ids += message_ids
        labels += message_labels
    if add_generation_prompt:
        prompt = _generation_prompt(tokenizer)
        ids += prompt
        labels += [IGNORE_INDEX] * len(prompt)
    return Rendered(ids, labels)


def render_sample(
    sample: Sample,
    tokenizer,
    num_image_tokens: int,
    max_length: int | None = None,
    boxes: BoxCodec | None = None,
) -> Rendered:
    """A validated sample -> ids + labels (`num_image_tokens`: each of this sample's images, from
    `image_token_count`, a sample's images sharing one size; `boxes`: its `box_codec`, from `sample_boxes`; None
    writes the trace's normalised boxes)."""
    messages = hf_messages(sample.messages, boxes=boxes)
    rendered = render_messages(messages, tokenizer, num_image_tokens if sample.image_names else 0)
    return check_rendered(rendered, sample, max_length)


# -- generation on one KV cache (geopilot.generation.KVSession) ---------------------------------------------------

PROMPT_LOOKUP = False  # 3-D rope positions: answer turns decode with `generate` (which adds the rope deltas)
STEPPABLE = True  # the per-step scheduler adds each row's own rope delta to its positions (`step_positions`)


def image_features(model, pixel_values, image_grid_thw):
    """The merged image features, one tensor per image (what `mm_encoder_outputs` carries)."""
    return list(model.get_image_features(pixel_values, image_grid_thw, return_dict=True).pooler_output)


def vision_kwargs(image_token_id: int, input_ids, image_grid_thw) -> dict:
    """A forward that holds the image computes the 3-D rope positions from the grid and the image-token positions."""
    return {"image_grid_thw": image_grid_thw, "mm_token_type_ids": (input_ids == image_token_id).int()}


def position_state(model):
    """The rope deltas the model stored at the image's prefill (one row per conversation): later turns add them."""
    return model.model.rope_deltas


def step_positions(positions, states: list):
    """The position ids of rows decoded side by side (`serve --scheduler step`): each row's text positions plus its
    own rope delta (`states`, from its image's prefill); the model expands 2-D ids to the three rope sections."""
    import torch

    return positions + torch.cat(states).to(positions.device)


def set_position_state(model, state) -> None:
    """Put a session's rope deltas back: the model holds one set, and another session may have run since."""
    model.model.rope_deltas = state


def tail_ids(tokenizer, text: str, role: str = TOOL_TURN_ROLE) -> list[int]:
    """A later turn after a generated `...<|im_end|>`: the newline closing it, the message (GeoPilot's tool turns,
    and the loop's repair turn that answers a plan like one, are `tool` messages) and the generation prompt."""
    message_ids, _ = _message_ids({"role": role, "content": text}, tokenizer, 0)
    return encode_text(tokenizer, "\n") + message_ids + _generation_prompt(tokenizer)


# -- the agent loop's prompts (geopilot.agent.engine.LocalEngine) ---------------------------------------------------


def image_inputs(processor, images) -> dict:
    """8-bit RGB images -> `pixel_values` (every image's patches, concatenated) and `image_grid_thw`."""
    out = processor.image_processor(images=images, return_tensors="pt")
    return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}


def prompt_ids(
    messages: list, tokenizer, num_image_tokens: int, system: str | None = None, boxes: BoxCodec | None = None
) -> list[int]:
    """A chat's messages (ending with a user or tool turn) -> the prompt ids, ending with the generation prompt."""
    hf = hf_messages(messages, system, boxes)
    return render_messages(hf, tokenizer, num_image_tokens, add_generation_prompt=True).input_ids


def prompt_text(messages: list, tokenizer, system: str | None = None, boxes: BoxCodec | None = None) -> str:
    """The same conversation as the template writes it (one `<|image_pad|>` per image, before the processor
    expands it): the prefix cache's key, `geopilot inspect`'s text."""
    return tokenizer.decode(render_messages(hf_messages(messages, system, boxes), tokenizer, 1).input_ids)


def assistant_ids(tokenizer, text: str) -> list[int]:
    """An assistant turn's content as the renderer writes it: `{json}<|im_end|>`."""
    return encode_text(tokenizer, text) + tokenizer.convert_tokens_to_ids([IM_END])
