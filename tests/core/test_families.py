"""Model families: Qwen2.5-VL's renderer equals its upstream chat template token for token (the processor expanding
the image) on every sample kind, labels cover exactly the assistant turns, image tokens follow the image size under
Qwen2.5-VL and not under LLaVA, boxes convert both ways, and the bad inputs of a family get one clear line."""

from __future__ import annotations

import copy
import json

import pytest
from helpers.samples import ALL_KINDS, assistant, one_tool_call, tool
from PIL import Image

from geopilot.errors import ConfigError, WeightsError
from geopilot.families import FAMILIES, family_of_dir, llava, qwen2_5_vl
from geopilot.model import ModelConfig, apply_adapter, load_model
from geopilot.sample import parse_sample

# Qwen/Qwen2.5-VL-7B-Instruct's chat_template.json as the model repository ships it (the JSON text, escapes and all).
UPSTREAM_CHAT_TEMPLATE_JSON = r"""{
  "chat_template": "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
}"""
SYSTEM = "You are GeoPilot, a remote-sensing assistant. Réponds brièvement."


def chain() -> dict:
    """Two rounds of tools before the answer: the second plan reads the first tool's output."""
    data = one_tool_call()
    answer = data["messages"].pop()
    data["messages"] += [
        assistant("Now ground the largest one.", actions=({"tool": "ground", "params": {"expression": "plane"}},)),
        tool("ground", {"detections": [{"label": "plane", "box": [0.5, 0.5, 0.75, 0.7], "score": 0.8}]}),
        answer,
    ]
    return data


KINDS = {**ALL_KINDS, "chain": chain}


def test_the_chat_template_is_upstreams_verbatim(qwen):
    assert qwen2_5_vl.CHAT_TEMPLATE == json.loads(UPSTREAM_CHAT_TEMPLATE_JSON)["chat_template"]
    _, processor = qwen
    assert processor.chat_template == qwen2_5_vl.CHAT_TEMPLATE  # what an export saves (chat_template.jinja/json)


@pytest.mark.parametrize("system", [None, SYSTEM])
@pytest.mark.parametrize("kind", list(KINDS))
def test_renderer_equals_the_processors_template_token_for_token(kind, system, qwen):
    _, processor = qwen
    sample = parse_sample(KINDS[kind]())
    messages = qwen2_5_vl.hf_messages(sample.messages, system=system)
    image = Image.new("RGB", (200, 120), (90, 120, 60))
    text = processor.apply_chat_template(messages, tokenize=False)
    expected = processor(text=[text], images=[image], return_tensors="pt")["input_ids"][0].tolist()
    tokens = qwen2_5_vl.image_token_count(processor, *image.size)
    rendered = qwen2_5_vl.render_messages(messages, processor.tokenizer, tokens)
    assert rendered.input_ids == expected
    assert text.startswith(f"<|im_start|>system\n{system or qwen2_5_vl.DEFAULT_SYSTEM}<|im_end|>\n")
    if system is None:  # a sample carries no system message: training renders Qwen's default
        assert qwen2_5_vl.render_sample(sample, processor.tokenizer, tokens).input_ids == expected


@pytest.mark.parametrize("kind", list(KINDS))
def test_labels_cover_exactly_each_assistant_turn(kind, qwen):
    _, processor = qwen
    tokenizer = processor.tokenizer
    sample = parse_sample(KINDS[kind]())
    rendered = qwen2_5_vl.render_sample(sample, tokenizer, 16)
    turns = [m["content"] for m in qwen2_5_vl.hf_messages(sample.messages) if m["role"] == "assistant"]
    spans = rendered.trained_spans()
    assert [tokenizer.decode(rendered.input_ids[a:b]) for a, b in spans] == [t + "<|im_end|>" for t in turns]
    for start, end in spans:  # each span opens right after `<|im_start|>assistant\n`
        assert tokenizer.decode(rendered.input_ids[:start]).endswith("<|im_start|>assistant\n")
        assert rendered.labels[start:end] == rendered.input_ids[start:end]
    assert sum(b - a for a, b in spans) == rendered.num_trained


def test_tool_outputs_are_one_tool_message_per_round():
    sample = parse_sample(KINDS["two_tools"]())
    messages = qwen2_5_vl.hf_messages(sample.messages)
    tools = [m for m in messages if m["role"] == "tool"]
    assert len(tools) == 1 and tools[0]["content"].count(" output: ") == 2
    assert tools[0]["content"].endswith("Answer my first question: " + messages[0]["content"][1]["text"])


def test_generation_prompt_matches_the_template(qwen):
    _, processor = qwen
    sample = parse_sample(KINDS["one_tool_call"]())
    messages = qwen2_5_vl.hf_messages(sample.messages[:3])  # user, plan, tool: the answer turn's prompt
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
    rendered = qwen2_5_vl.render_messages(messages, processor.tokenizer, 0, add_generation_prompt=True)
    image = [t for t in ids if t != processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")]
    assert rendered.input_ids == image and text.endswith("<|im_start|>assistant\n")


def test_image_tokens_follow_the_size_under_qwen_and_not_under_llava(qwen, tiny):
    _, processor = qwen
    counts = {}
    for size in (448, 896):
        image = Image.new("RGB", (size, size))
        grid = processor.image_processor(images=[image], return_tensors="pt")["image_grid_thw"][0].tolist()
        counts[size] = qwen2_5_vl.image_token_count(processor, size, size)
        assert counts[size] == grid[0] * grid[1] * grid[2] // 4  # the processor's own 2x2-merged patch grid
    assert counts == {448: 256, 896: 1024}
    _, llava_processor = tiny
    assert llava.image_token_count(llava_processor, 448, 448) == llava.image_token_count(llava_processor, 896, 896)
    shapes = [llava_processor.image_processor([Image.new("RGB", (s, s))])["pixel_values"][0].shape for s in (448, 896)]
    assert shapes[0] == shapes[1]


def test_max_pixels_caps_a_large_scene():
    model_cfg = ModelConfig(family="qwen2_5_vl", init="tiny", min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)
    processor = qwen2_5_vl.build_processor(qwen2_5_vl.tiny_tokenizer(), *qwen2_5_vl.pixel_range(model_cfg))
    assert qwen2_5_vl.image_token_count(processor, 4000, 4000) <= 64
    assert qwen2_5_vl.image_token_count(processor, 30, 30) >= 4


def test_boxes_round_trip_in_each_familys_convention():
    box = [0.1, 0.25, 0.5, 0.75]
    assert qwen2_5_vl.box_to_model(box, (448, 896)) == [90, 112, 448, 336]  # (height, width) of the resized image
    assert qwen2_5_vl.box_from_model([90, 112, 448, 336], (448, 896)) == pytest.approx([0.1004, 0.25, 0.5, 0.75], 1e-3)
    assert llava.box_from_model(llava.box_to_model(box, (336, 336)), (336, 336)) == box


def test_min_pixels_above_max_pixels_is_one_line():
    with pytest.raises(ConfigError, match="min_pixels 5000 is above max_pixels 4000"):
        from geopilot.config import build_config

        build_config(ModelConfig, {"family": "qwen2_5_vl", "min_pixels": 5000, "max_pixels": 4000})


def test_an_init_of_another_family_is_refused():
    from geopilot.config import build_config

    with pytest.raises(ConfigError, match="init 'llava_hf' does not build family 'qwen2_5_vl'"):
        build_config(ModelConfig, {"family": "qwen2_5_vl", "init": "llava_hf"})


def test_a_tiny_qwen_whose_mrope_misses_its_head_dim_is_one_line():
    from geopilot.config import build_config

    config = {"family": "qwen2_5_vl", "tiny_qwen": {"text_hidden": 128, "text_heads": 4}}
    with pytest.raises(ConfigError, match=r"mrope_section \[2, 2, 4\] must sum to head_dim / 2 = 16"):
        build_config(ModelConfig, config)


def test_a_model_type_of_no_family_names_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "idefics3"}))
    with pytest.raises(WeightsError, match="model_type 'idefics3' is not a supported family") as err:
        load_model(tmp_path)
    assert all(name in str(err.value) for name in FAMILIES) and "\n" not in str(err.value)


def test_families_are_read_from_saved_dirs(tiny_model_dir, qwen):
    assert family_of_dir(tiny_model_dir) is llava
    assert type(qwen[0]).__name__ == "Qwen2_5_VLForConditionalGeneration"


def test_a_llava_adapter_is_refused_on_a_qwen_base(qwen, tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    record = {"config": {"model": {"family": "llava", "init": "tiny"}}}
    (adapter / "geopilot_train.json").write_text(json.dumps(record))
    with pytest.raises(WeightsError, match="trained on a llava base cannot load onto a qwen2_5_vl base"):
        apply_adapter(copy.copy(qwen[0]), adapter)


def _image(width: int, height: int, seed: int) -> Image.Image:
    import numpy as np

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))


def _prompt(processor, image: Image.Image, question: str) -> list[int]:
    sample_messages = [{"type": "image"}, {"type": "text", "text": question}]
    tokens = qwen2_5_vl.image_token_count(processor, *image.size)
    return qwen2_5_vl.render_messages(
        [{"role": "user", "content": sample_messages}], processor.tokenizer, tokens, add_generation_prompt=True
    ).input_ids


@pytest.mark.parametrize("think_tokens", [5, 1])
def test_answer_turn_with_kv_reuse_equals_a_full_re_prefill_on_qwen(qwen, think_tokens):
    """Two conversations of different image sizes (so different image-token counts, left-padded) in one batch."""
    import torch

    from geopilot.generation import GenerationOptions, KVSession
    from geopilot.tool_output import ToolOutput
    from geopilot.wire import format_tool_turn

    model, processor = qwen
    tok = processor.tokenizer
    images = [_image(84, 56, 1), _image(112, 140, 2)]
    prompts = [
        _prompt(processor, image, q) for image, q in zip(images, ["How many planes?", "Any ships?"], strict=True)
    ]
    assert len(prompts[0]) != len(prompts[1])
    inputs = processor.image_processor(images=images, return_tensors="pt")
    pixels, grid = inputs["pixel_values"], inputs["image_grid_thw"]
    fixed = GenerationOptions(max_new_tokens=think_tokens, min_new_tokens=think_tokens)  # cut off: an eos is added
    reuse = KVSession(model, tok, prompts, pixels, fixed, image_grid_thw=grid)
    again = KVSession(model, tok, prompts, pixels, fixed, reuse_cache=False, image_grid_thw=grid)
    think_a, think_b = reuse.generate([0, 1]), again.generate([0, 1])
    assert [t.token_ids for t in think_a] == [t.token_ids for t in think_b]
    tail = qwen2_5_vl.tail_ids(tok, "tool", format_tool_turn([("detect_objects", ToolOutput(error="x"))], "How?"))
    answer = GenerationOptions(max_new_tokens=6, min_new_tokens=6)
    reuse.generation_config = again.generation_config = answer.generation_config(tok)
    ans_a = reuse.generate([0, 1], [tail, tail], keep_logits=True)
    ans_b = again.generate([0, 1], [tail, tail], keep_logits=True)
    assert ans_a[0].new_input_tokens == len(tail) + 1  # the <|im_end|> closing the cut-off think turn, then the tail
    for a, b in zip(ans_a, ans_b, strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=0)
    # and the first row against one plain forward over its whole conversation
    whole = torch.tensor([prompts[0] + think_a[0].token_ids + [tok.eos_token_id] + tail])
    vision = qwen2_5_vl.vision_kwargs(model.config.image_token_id, whole, grid[:1])
    with torch.inference_mode():
        logits = model(input_ids=whole, pixel_values=pixels[: int(grid[0].prod())], **vision).logits[0, -1]
    torch.testing.assert_close(ans_a[0].logits[0], logits, atol=1e-4, rtol=0)


def test_a_session_keeps_its_positions_when_another_ran_between_its_turns(qwen):
    """The model holds one set of rope deltas; a session puts its own back before extending its cache."""
    import torch

    from geopilot.generation import GenerationOptions, KVSession

    model, processor = qwen
    tok = processor.tokenizer
    options = GenerationOptions(max_new_tokens=3, min_new_tokens=3)
    tail = qwen2_5_vl.tail_ids(tok, "tool", "detect_objects output: {}")

    def one_image_session(image: Image.Image, question: str) -> KVSession:
        inputs = processor.image_processor(images=[image], return_tensors="pt")
        prompt = _prompt(processor, image, question)
        return KVSession(model, tok, [prompt], inputs["pixel_values"], options, image_grid_thw=inputs["image_grid_thw"])

    answers = []
    for interleave in (False, True):
        session = one_image_session(_image(84, 56, 3), "Where?")
        session.generate([0])
        if interleave:  # another conversation, with a larger image, runs in between
            one_image_session(_image(280, 280, 4), "Count.").generate([0])
        answers.append(session.generate([0], [tail], keep_logits=True)[0].logits)
    torch.testing.assert_close(answers[0], answers[1], atol=1e-5, rtol=0)


def test_an_endpoint_speaks_the_served_familys_message_form(qwen_dir, tiny_model_dir):
    """`--engine-url`: a local model folder names its family; `--model-family` (family=) says it for a remote one."""
    from geopilot.agent.http_engine import HttpEngine

    assert HttpEngine("http://127.0.0.1:9/v1", str(qwen_dir)).family is qwen2_5_vl
    assert HttpEngine("http://127.0.0.1:9/v1", "served-name").family is llava
    assert HttpEngine("http://127.0.0.1:9/v1", "served-name", family="qwen2_5_vl").family is qwen2_5_vl
    assert HttpEngine("http://127.0.0.1:9/v1", str(tiny_model_dir)).family is llava


def test_serve_refuses_a_model_of_another_family_than_named(tiny_model_dir):
    import argparse

    from geopilot.errors import GeoPilotInputError
    from geopilot.serving.cli import build_pilot

    args = argparse.Namespace(engine_url=None, model=str(tiny_model_dir), model_family="qwen2_5_vl")
    with pytest.raises(GeoPilotInputError, match="is a llava model, not --model-family qwen2_5_vl"):
        build_pilot(args, None)
