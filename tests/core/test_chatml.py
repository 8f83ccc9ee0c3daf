"""A LLaVA whose tokenizer carries ChatML (the CPU demo's SmolLM2 base): the llava family renders every kind of
sample exactly as the exported `CHATML_TEMPLATE` does (ids and assistant masks), the agent's prompt, tail and
assistant ids agree with the template, and a saved tokenizer keeps its template (Vicuna's stays the default)."""

from __future__ import annotations

import pytest
from helpers.samples import ALL_KINDS

from geopilot.chat_template import CHAT_TEMPLATE, CHATML_TEMPLATE, IM_END, IM_START, current_template, hf_messages
from geopilot.families import llava
from geopilot.render import IGNORE_INDEX
from geopilot.sample import parse_sample
from geopilot.tokenizer import load_tokenizer, prepare_tokenizer, tiny_tokenizer
from geopilot.wire import SYSTEM_PROMPT, assistant_json, chat_turns

IMAGE_TOKENS = 4
SPECIAL_STRINGS = {"special_text"}  # text that spells a special token: the template tokenises it, the renderer not


@pytest.fixture(scope="module")
def chatml():
    tokenizer = tiny_tokenizer(600)
    tokenizer.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
    tokenizer.eos_token = IM_END  # as SmolLM2-Instruct's: a turn ends generation
    return prepare_tokenizer(tokenizer, CHATML_TEMPLATE)


def template_ids(tokenizer, messages: list[dict], **kwargs) -> tuple[list[int], list[int]]:
    out = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True, **kwargs
    )
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    ids, mask = [], []
    for token, flag in zip(out["input_ids"], out["assistant_masks"], strict=True):  # expand as the processor does
        ids += [token] * (IMAGE_TOKENS if token == image_id else 1)
        mask += [flag] * (IMAGE_TOKENS if token == image_id else 1)
    return ids, mask


@pytest.mark.parametrize("system", [None, "You are GeoPilot.", ""])
@pytest.mark.parametrize("kind", sorted(set(ALL_KINDS) - SPECIAL_STRINGS))
def test_renderer_equals_the_chatml_template_token_for_token(kind, system, chatml):
    sample = parse_sample(ALL_KINDS[kind]())
    messages = hf_messages(sample.messages, system=system)
    ids, mask = template_ids(chatml, messages)
    if system is None:
        rendered = llava.render_sample(sample, chatml, IMAGE_TOKENS)
    else:  # the renderer takes the system prompt as an argument, the template as a message
        turns = chat_turns(sample.messages)
        rendered = llava.renderer(chatml).render_turns(turns, chatml, IMAGE_TOKENS, system=system)
    assert ids == rendered.input_ids
    assert [bool(m) for m in mask] == [label != IGNORE_INDEX for label in rendered.labels]
    text = chatml.apply_chat_template(messages, tokenize=False)
    opening = f"{IM_START}system\n{SYSTEM_PROMPT if system is None else system}{IM_END}\n" if system != "" else ""
    assert text.startswith(opening + f"{IM_START}user\n<image>\n")
    assert text.endswith(f"{IM_END}\n") and "USER:" not in text and "</s>" not in text


def test_labels_cover_each_assistant_turn_and_its_end(chatml):
    sample = parse_sample(ALL_KINDS["two_tools"]())
    rendered = llava.render_sample(sample, chatml, IMAGE_TOKENS)
    im_end = chatml.convert_tokens_to_ids(IM_END)
    spans = rendered.trained_spans()
    assert len(spans) == sum(1 for m in sample.messages if m.role == "assistant")
    assert all(rendered.input_ids[end - 1] == im_end for _, end in spans)


def test_the_agents_ids_continue_the_template(chatml):
    """The prompt (generation prompt included), a generated `{json}<|im_end|>` and the next tail are the template's
    rendering of the longer conversation, up to its next generation prompt."""
    sample = parse_sample(ALL_KINDS["two_tools"]())
    head, plan = sample.messages[:1], sample.messages[1]
    prompt = llava.prompt_ids(head, chatml, IMAGE_TOKENS)
    ids, _ = template_ids(chatml, hf_messages(head), add_generation_prompt=True)
    assert prompt == ids
    last_tool = max(i for i, m in enumerate(sample.messages) if m.role == "tool")
    tool_text = chat_turns(sample.messages[: last_tool + 1])[-1][1]  # the round's tool outputs, one user turn
    continued = prompt + llava.assistant_ids(chatml, assistant_json(plan)) + llava.tail_ids(chatml, tool_text)
    ids, _ = template_ids(chatml, hf_messages(sample.messages[: last_tool + 1]), add_generation_prompt=True)
    assert continued == ids


def test_a_saved_tokenizer_keeps_its_template_and_others_get_vicunas(chatml, tmp_path):
    chatml.save_pretrained(tmp_path / "chatml")
    assert load_tokenizer(tmp_path / "chatml").chat_template == CHATML_TEMPLATE
    assert llava.renderer(load_tokenizer(tmp_path / "chatml")).__name__ == "geopilot.render_chatml"
    older = chatml.chat_template.replace("describes the message form", "describes it")  # another version's text
    assert current_template(older) == CHATML_TEMPLATE and current_template(None) == CHAT_TEMPLATE
    foreign = tiny_tokenizer(600)
    foreign.chat_template = "{{ messages }}"  # an upstream template is replaced by the wire format's
    assert prepare_tokenizer(foreign).chat_template == CHAT_TEMPLATE
