"""The chat template IS the wire format: for every kind of sample, in every HF message shape, transformers'
`apply_chat_template` renders the renderer's text and tokenises to the renderer's ids; the first token after BOS
is Vicuna's `▁A`; an export's saved tokenizer reproduces the trained ids; bad messages raise a clear error."""

from __future__ import annotations

import copy

import pytest
from helpers.samples import ALL_KINDS
from jinja2.exceptions import TemplateError

from geopilot.chat_template import CHAT_TEMPLATE, hf_messages
from geopilot.render import IGNORE_INDEX, render_sample, render_text, render_turns
from geopilot.sample import UserMessage, parse_sample
from geopilot.wire import SYSTEM_PROMPT, chat_turns

IMAGE_TOKENS = 4
SYSTEM = "You are GeoPilot, a remote-sensing assistant. Réponds brièvement."
SHAPES = ["default", "system", "empty_system", "image_after_text", "text_parts"]
SPECIAL_STRINGS = {"special_text"}  # the template tokenises "</s>" written in text as EOS; the renderer does not


def shaped(sample, shape: str) -> tuple[list[dict], str]:
    """The sample's HF messages in one of the shapes a client may send, and the system prompt they imply."""
    system = {"system": SYSTEM, "empty_system": ""}.get(shape)
    messages = hf_messages(sample.messages, system=system)
    first = messages[0]["content"]
    if shape == "image_after_text" and isinstance(first, list):
        first.reverse()  # [{"type": "text", ...}, {"type": "image"}]
    if shape == "text_parts":  # what vLLM sends for an "openai"-format template: every content as a list of parts
        for message in messages:
            if isinstance(message["content"], str):
                message["content"] = [{"type": "text", "text": message["content"]}]
    return messages, SYSTEM_PROMPT if system is None else system


def template_ids(tokenizer, messages: list[dict], image_tokens: int, **kwargs) -> tuple[list[int], list[int]]:
    out = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True, **kwargs
    )
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    ids, mask = [], []
    for token, flag in zip(out["input_ids"], out["assistant_masks"], strict=True):  # expand as the processor does
        repeat = image_tokens if token == image_id else 1
        ids += [token] * repeat
        mask += [flag] * repeat
    return ids, mask


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", list(ALL_KINDS))
def test_template_renders_the_wire_text_and_ids(kind, shape, tiny_tokenizer):
    sample = parse_sample(ALL_KINDS[kind]())
    messages, system = shaped(sample, shape)
    turns = chat_turns(sample.messages)
    text = tiny_tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == render_text(turns, tiny_tokenizer, system=system)
    assert text.count("<image>") == 1 and text.startswith(f"<s> {system + ' ' if system else ''}USER: <image>\n")
    if kind in SPECIAL_STRINGS:
        return
    rendered = render_turns(turns, tiny_tokenizer, IMAGE_TOKENS, system=system)
    ids, mask = template_ids(tiny_tokenizer, messages, IMAGE_TOKENS)
    assert ids == rendered.input_ids
    assert [bool(m) for m in mask] == [label != IGNORE_INDEX for label in rendered.labels]


def test_image_is_moved_to_the_front_as_llava_does(tiny_tokenizer):
    data = ALL_KINDS["tool_free"]()
    data["messages"][0]["content"] = "  Is there a harbor in this image? <image>"
    sample = parse_sample(data)
    text = render_text(chat_turns(sample.messages), tiny_tokenizer)
    assert "USER: <image>\nIs there a harbor in this image? ASSISTANT:" in text
    as_string = [{"role": "user", "content": data["messages"][0]["content"]}] + hf_messages(sample.messages)[1:]
    assert tiny_tokenizer.apply_chat_template(as_string, tokenize=False) == text  # a string with <image> inside


def test_generation_prompt_is_the_agents_prompt(tiny_tokenizer):
    """`add_generation_prompt=True` after a user turn or after tool turns gives what the agent feeds the model."""
    sample = parse_sample(ALL_KINDS["two_tools"]())
    for upto in (1, 4):  # the question alone; the question, the think turn and both tool outputs
        head = sample.messages[:upto]
        messages = hf_messages(head)
        prompt = render_turns(chat_turns(head), tiny_tokenizer, IMAGE_TOKENS)
        text = tiny_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert text == render_text(chat_turns(head), tiny_tokenizer) and text.endswith(" ASSISTANT:")
        assert template_ids(tiny_tokenizer, messages, IMAGE_TOKENS, add_generation_prompt=True)[0] == prompt.input_ids
        without = tiny_tokenizer.apply_chat_template(messages, tokenize=False)
        assert without == text.removesuffix(" ASSISTANT:")


@pytest.mark.parametrize(
    "change, error",
    [
        (lambda m: m.insert(1, {"role": "critic", "content": "x"}), "unknown role critic"),
        (lambda m: m[2].pop("name"), 'a tool message needs "name"'),
        (lambda m: m.insert(1, {"role": "system", "content": "x"}), "system message may only be the first"),
        (lambda m: m.insert(0, {"role": "assistant", "content": "{}"}), "assistant message must follow"),
        (lambda m: m.insert(1, {"role": "user", "content": "again"}), "user message must come first or follow"),
        (lambda m: m[2].update(content={"count": 1}), "tool content must be a string or a list of parts"),
        (lambda m: m[0]["content"].append({"type": "video"}), "user content parts must be"),
    ],
)
def test_bad_messages_raise_a_clear_template_error(change, error, tiny_tokenizer):
    messages = hf_messages(parse_sample(ALL_KINDS["one_tool_call"]()).messages)
    change(messages)
    with pytest.raises(TemplateError, match=error):
        tiny_tokenizer.apply_chat_template(messages, tokenize=False)


def test_first_token_after_bos_carries_the_prefix_space(tiny_tokenizer):
    """Vicuna reads `A chat ...` as `<s> ▁A ...`; later segments stay without one (segment-safe)."""
    ids = render_turns([("user", "Is there a harbor?")], tiny_tokenizer, 0).input_ids
    tokens = tiny_tokenizer.convert_ids_to_tokens(ids)
    assert tokens[0] == "<s>" and tokens[1].startswith("▁") and tiny_tokenizer.decode(ids[1:2]).strip() == "A"
    rendered = render_sample(parse_sample(ALL_KINDS["multi_turn"]()), tiny_tokenizer, IMAGE_TOKENS)
    second_user = rendered.trained_spans()[0][1]  # the token after the first `</s>`
    assert not tiny_tokenizer.convert_ids_to_tokens(rendered.input_ids[second_user]).startswith("▁")


# -- the real 32k SentencePiece model (`sp_dir`, `sp_tokenizer`: tests/core/conftest.py) ------------------------


def test_base_tokenizer_reads_the_prompt_as_we_render_it(sp_dir, sp_tokenizer):
    """The whole first prompt, read by the base tokenizer (SentencePiece with its dummy prefix, as Vicuna's
    slow tokenizer and LLaVA-1.5 training read it), is exactly the rendered ids."""
    import sentencepiece
    from transformers import LlamaTokenizer

    question = "How many planes are parked on the apron? Combien d'avions « 飞机 » ?"
    prompt = f"{SYSTEM_PROMPT} USER: {question} ASSISTANT:"
    ours = render_turns([("user", question)], sp_tokenizer, 0).input_ids
    spm = sentencepiece.SentencePieceProcessor(model_file=str(sp_dir / "tokenizer.model"))
    assert ours == [spm.bos_id()] + spm.encode(prompt)
    base = LlamaTokenizer.from_pretrained(sp_dir)  # default flags: the prefix space is on
    assert ours == [base.bos_token_id] + base(prompt, add_special_tokens=False)["input_ids"]
    assert sp_tokenizer.convert_ids_to_tokens(ours[:3]) == ["<s>", "▁A", "▁chat"]


@pytest.fixture(scope="module")
def served_sp_tokenizer(sp_tokenizer, tmp_path_factory):
    """The tokenizer files and chat template an export saves (`save_model` writes the processor this way), loaded
    back by plain transformers with no GeoPilot code in between."""
    from transformers import AutoTokenizer

    from geopilot.model import build_processor

    export = tmp_path_factory.mktemp("sp_export")
    build_processor(copy.deepcopy(sp_tokenizer), 336, 14).save_pretrained(export)
    return AutoTokenizer.from_pretrained(export)


@pytest.mark.parametrize("kind", [k for k in ALL_KINDS if k not in SPECIAL_STRINGS])
def test_exported_tokenizer_reproduces_the_trained_ids(kind, sp_tokenizer, served_sp_tokenizer):
    """An export's saved tokenizer + chat template gives the ids and the assistant mask the renderer trained on."""
    served = served_sp_tokenizer
    assert served.chat_template == CHAT_TEMPLATE
    sample = parse_sample(ALL_KINDS[kind]())
    rendered = render_sample(sample, sp_tokenizer, 576)
    ids, mask = template_ids(served, hf_messages(sample.messages), 576)
    assert ids == rendered.input_ids
    assert [bool(m) for m in mask] == [label != IGNORE_INDEX for label in rendered.labels]
    assert served.decode(ids) == render_text(chat_turns(sample.messages), served).replace("<image>", "<image>" * 576)


def test_question_text_quoted_in_the_tool_turn_matches_the_template(tiny_tokenizer):
    """The tool turn quotes the round's question without the image, stripped, in both renderings."""
    data = ALL_KINDS["one_tool_call"]()
    data["messages"][0]["content"] = "<image>\n  How many planes?  "
    sample = parse_sample(data)
    text = tiny_tokenizer.apply_chat_template(hf_messages(sample.messages), tokenize=False)
    assert "\n\nAnswer my first question: How many planes? ASSISTANT:" in text
    assert text == render_text(chat_turns(sample.messages), tiny_tokenizer)
    assert chat_turns([UserMessage(content="<image>\n  How many planes?  ")]) == [("user", "<image>\nHow many planes?")]
