"""Rendering: labels cover exactly the assistant turns, the Jinja template agrees token for token, nothing is cut silently."""

from __future__ import annotations

import pytest
from helpers.samples import ALL_KINDS, one_tool_call
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geopilot.chat_template import hf_messages
from geopilot.errors import SampleError
from geopilot.render import IGNORE_INDEX, render_sample
from geopilot.sample import AssistantMessage, parse_sample
from geopilot.wire import assistant_json, chat_turns

IMAGE_TOKENS = 16


def expected_assistant_texts(sample) -> list[str]:
    return [" " + assistant_json(m) + "</s>" for m in sample.messages if isinstance(m, AssistantMessage)]


def decoded_spans(rendered, tokenizer) -> list[str]:
    return [tokenizer.decode(rendered.input_ids[a:b]) for a, b in rendered.trained_spans()]


def template_ids_and_mask(sample, tokenizer, image_tokens: int):
    """What `apply_chat_template(..., return_assistant_tokens_mask=True)` gives for the sample's HF messages
    (the template is the one `prepare_tokenizer` sets)."""
    out = tokenizer.apply_chat_template(
        hf_messages(sample.messages), tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    ids, mask = [], []
    for token, flag in zip(
        out["input_ids"], out["assistant_masks"], strict=True
    ):  # expand <image> as the processor does
        repeat = image_tokens if token == image_id else 1
        ids += [token] * repeat
        mask += [flag] * repeat
    return ids, mask


@pytest.mark.parametrize("kind", list(ALL_KINDS))
def test_labelled_spans_are_exactly_the_assistant_turns(kind, tiny_tokenizer):
    sample = parse_sample(ALL_KINDS[kind]())
    rendered = render_sample(sample, tiny_tokenizer, IMAGE_TOKENS)
    assert decoded_spans(rendered, tiny_tokenizer) == expected_assistant_texts(sample)
    assert rendered.input_ids.count(tiny_tokenizer.convert_tokens_to_ids("<image>")) == IMAGE_TOKENS
    assert (
        rendered.input_ids[0] == tiny_tokenizer.bos_token_id
        and rendered.input_ids.count(tiny_tokenizer.bos_token_id) == 1
    )
    eos = tiny_tokenizer.eos_token_id
    assert [i for i, t in enumerate(rendered.input_ids) if t == eos] == [b - 1 for _, b in rendered.trained_spans()]


@pytest.mark.parametrize("kind", [k for k in ALL_KINDS if k != "special_text"])
def test_chat_template_agrees_token_for_token(kind, tiny_tokenizer):
    sample = parse_sample(ALL_KINDS[kind]())
    rendered = render_sample(sample, tiny_tokenizer, IMAGE_TOKENS)
    ids, mask = template_ids_and_mask(sample, tiny_tokenizer, IMAGE_TOKENS)
    assert ids == rendered.input_ids
    assert [bool(m) for m in mask] == [label != IGNORE_INDEX for label in rendered.labels]


def test_special_token_strings_in_text_stay_text(tiny_tokenizer):
    sample = parse_sample(ALL_KINDS["special_text"]())
    rendered = render_sample(sample, tiny_tokenizer, IMAGE_TOKENS)
    eos = tiny_tokenizer.eos_token_id
    assert rendered.input_ids.count(eos) == 2  # one per assistant turn, although the text says "</s>" three times
    assert rendered.input_ids.count(tiny_tokenizer.convert_tokens_to_ids("<image>")) == IMAGE_TOKENS


def test_too_long_sample_is_reported_not_cut(tiny_tokenizer):
    sample = parse_sample(one_tool_call())
    full = len(render_sample(sample, tiny_tokenizer, IMAGE_TOKENS).input_ids)
    with pytest.raises(SampleError, match=r"exceed max_length .*assistant turn") as info:
        render_sample(sample, tiny_tokenizer, IMAGE_TOKENS, max_length=full - 5)
    assert info.value.sample_id == sample.id
    assert len(render_sample(sample, tiny_tokenizer, IMAGE_TOKENS, max_length=full).input_ids) == full


# U+2581 is SentencePiece's space mark: a Metaspace tokenizer reads it as a space, so it cannot decode back as itself
printable = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\u2581"), min_size=0, max_size=40
)
params = st.dictionaries(
    st.text(min_size=1, max_size=8), st.one_of(st.integers(), printable, st.lists(printable, max_size=3)), max_size=3
)


@st.composite
def random_samples(draw):
    """Random dialogues: 1-3 rounds, each with or without 1-2 tool calls, arbitrary unicode text."""
    has_image = draw(st.booleans())
    messages = []
    for round_index in range(draw(st.integers(1, 3))):
        question = draw(printable).replace("<image>", "")
        prefix = "<image>\n" if has_image and round_index == 0 else ""
        messages.append({"role": "user", "content": prefix + question})
        tools = draw(st.lists(st.sampled_from(["detect_objects", "ground", "extract_roads"]), max_size=2))
        if tools:
            messages.append(
                {
                    "role": "assistant",
                    "reasoning": draw(printable),
                    "actions": [{"tool": t, "params": draw(params)} for t in tools],
                    "value": None,
                }
            )
            for tool in tools:
                x1, y1 = draw(st.floats(0, 0.49)), draw(st.floats(0, 0.49))
                content = {"detections": [{"label": draw(printable) or "x", "box": [x1, y1, x1 + 0.5, y1 + 0.5]}]}
                messages.append({"role": "tool", "name": tool, "content": content})
        messages.append({"role": "assistant", "reasoning": draw(printable), "actions": [], "value": draw(printable)})
    return parse_sample({"id": "h", "image": "a.png" if has_image else None, "messages": messages})


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(sample=random_samples())
def test_property_labels_decode_to_assistant_turns(sample, tiny_tokenizer):
    rendered = render_sample(sample, tiny_tokenizer, IMAGE_TOKENS)
    assert decoded_spans(rendered, tiny_tokenizer) == expected_assistant_texts(sample)
    assert len(rendered.input_ids) == len(rendered.labels)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(sample=random_samples())
def test_property_template_agrees(sample, tiny_tokenizer):
    if any(
        "</s>" in text or "<s>" in text or "<pad>" in text or "<unk>" in text for _, text in chat_turns(sample.messages)
    ):
        return  # the template tokenises special-token strings as special tokens; the renderer (safely) does not
    if any(role == "assistant" and "<image>" in text for role, text in chat_turns(sample.messages)):
        return  # the same for `<image>` written in a reply (the user turn's is the image, in both)
    rendered = render_sample(sample, tiny_tokenizer, IMAGE_TOKENS)
    ids, mask = template_ids_and_mask(sample, tiny_tokenizer, IMAGE_TOKENS)
    assert ids == rendered.input_ids
    assert [bool(m) for m in mask] == [label != IGNORE_INDEX for label in rendered.labels]


@pytest.mark.parametrize("kind", [k for k in ALL_KINDS if k != "special_text"])
def test_real_sentencepiece_tokenizer_agrees(kind, sp_tokenizer):
    """`sp_tokenizer`: a real 32k Llama-layout SentencePiece model (tests/core/conftest.py)."""
    sample = parse_sample(ALL_KINDS[kind]())
    rendered = render_sample(sample, sp_tokenizer, 576)
    assert decoded_spans(rendered, sp_tokenizer) == expected_assistant_texts(sample)
    ids, mask = template_ids_and_mask(sample, sp_tokenizer, 576)
    assert ids == rendered.input_ids
    assert [bool(m) for m in mask] == [label != IGNORE_INDEX for label in rendered.labels]
