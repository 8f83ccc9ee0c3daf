"""KV-cache reuse is exact: the answer turn with the think turn's cache equals a full re-prefill (image included)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import LogitsProcessor, LogitsProcessorList

from geopilot.batch import pixel_values
from geopilot.generation import AnswerExtractor, GenerationOptions, KVSession
from geopilot.model import num_image_tokens
from geopilot.render import render_turns, user_turn_text
from geopilot.tokenizer import encode_text
from geopilot.tool_output import ToolOutput
from geopilot.wire import format_tool_turn

ATOL = 1e-4


def _prompt(tokenizer, config, question: str) -> list[int]:
    return render_turns([("user", f"<image>\n{question}")], tokenizer, num_image_tokens(config)).input_ids


def _tail(tokenizer, text: str) -> list[int]:
    return encode_text(
        tokenizer,
        user_turn_text(format_tool_turn([("detect_objects", ToolOutput(error=text))], "How many?"), first=False),
    )


def _pixels(processor, sizes):
    rng = np.random.default_rng(1)
    return pixel_values(processor, [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for h, w in sizes])


@pytest.mark.parametrize("think_tokens", [5, 1])
def test_answer_turn_with_kv_reuse_equals_a_full_re_prefill(tiny, think_tokens):
    model, processor = tiny
    tok = processor.tokenizer
    prompt, pixels = _prompt(tok, model.config, "How many planes?"), _pixels(processor, [(40, 56)])
    fixed = GenerationOptions(max_new_tokens=think_tokens, min_new_tokens=think_tokens)  # cut off: an </s> is added
    answer = GenerationOptions(max_new_tokens=6, min_new_tokens=6)
    reuse = KVSession(model, tok, [prompt], pixels, fixed)
    again = KVSession(model, tok, [prompt], pixels, fixed, reuse_cache=False)
    [think_a], [think_b] = reuse.generate([0]), again.generate([0])
    assert think_a.token_ids == think_b.token_ids and not think_a.finished
    tail = _tail(tok, "timeout")
    reuse.generation_config = again.generation_config = answer.generation_config(tok)
    [ans_a], [ans_b] = reuse.generate([0], [tail], keep_logits=True), again.generate([0], [tail], keep_logits=True)
    assert ans_a.new_input_tokens == len(tail) + 1  # the </s> closing the cut-off think turn, then the tool turn
    assert ans_b.new_input_tokens == len(prompt) + think_tokens + 1 + len(tail)
    assert ans_a.token_ids == ans_b.token_ids
    torch.testing.assert_close(ans_a.logits, ans_b.logits, atol=ATOL, rtol=0)
    # and against one plain forward over the whole conversation
    whole = torch.tensor([prompt + think_a.token_ids + [tok.eos_token_id] + tail])
    with torch.inference_mode():
        logits = model(input_ids=whole, pixel_values=pixels).logits[0, -1]
    torch.testing.assert_close(ans_a.logits[0], logits, atol=ATOL, rtol=0)


class EndFirstRowEarly(LogitsProcessor):
    """Row 0 of the think turn says </s> after 2 tokens, so its row carries pads inside the sequence afterwards."""

    def __init__(self, eos_id: int):
        self.eos_id, self.start, self.enabled = eos_id, None, True

    def __call__(self, input_ids, scores):
        self.start = input_ids.shape[1] if self.start is None else self.start
        if self.enabled and input_ids.shape[1] - self.start == 2:
            scores[0] = float("-inf")
            scores[0, self.eos_id] = 0.0
        return scores


def test_a_batch_with_padding_and_dropped_rows_matches_single_rows(tiny):
    model, processor = tiny
    tok = processor.tokenizer
    questions = ["How many planes?", "Count every storage tank near the harbor, please.", "Roads?"]
    prompts = [_prompt(tok, model.config, q) for q in questions]
    pixels = _pixels(processor, [(40, 56), (32, 32), (64, 20)])
    think, answer = GenerationOptions(max_new_tokens=5), GenerationOptions(max_new_tokens=5, min_new_tokens=5)
    early = EndFirstRowEarly(tok.eos_token_id)
    batch = KVSession(model, tok, prompts, pixels, think, logits_processor=LogitsProcessorList([early]))
    thinks = batch.generate([0, 1, 2])
    early.enabled = False
    assert thinks[0].finished and len(thinks[0].token_ids) == 2 and len(thinks[2].token_ids) == 5
    tails = {0: _tail(tok, "a"), 2: _tail(tok, "a much longer error message from the tool")}
    batch.generation_config = answer.generation_config(tok)
    answers = dict(zip([0, 2], batch.generate([0, 2], [tails[0], tails[2]], keep_logits=True), strict=True))
    for row in (0, 2):
        early = EndFirstRowEarly(tok.eos_token_id) if row == 0 else None
        forcing = LogitsProcessorList([early]) if early else None
        single = KVSession(model, tok, [prompts[row]], pixels[row : row + 1], think, logits_processor=forcing)
        [alone] = single.generate([0])
        if early:
            early.enabled = False
        assert alone.token_ids == thinks[row].token_ids
        single.generation_config = answer.generation_config(tok)
        [alone_answer] = single.generate([0], [tails[row]], keep_logits=True)
        assert alone_answer.token_ids == answers[row].token_ids
        torch.testing.assert_close(alone_answer.logits, answers[row].logits, atol=ATOL, rtol=0)


def test_answer_extractor_streams_only_the_value_of_an_answer_turn():
    pieces: list[str] = []
    extractor = AnswerExtractor(pieces.append)
    for char in '{"reasoning":"r","actions":[],"value":"Seven \\"big\\" planes \\u00e9."}':
        extractor.feed(char)
    assert "".join(pieces) == 'Seven "big" planes é.'
    silent: list[str] = []
    calling = AnswerExtractor(silent.append)
    calling.feed('{"reasoning":"r","actions":[{"tool":"detect_objects","params":{}}],"value":"wait"}')
    assert silent == []


def test_a_streamed_byte_run_is_the_text_it_decodes_to(tiny):
    """`<0xD0><0x87>` is "Ї"; one more byte `<0xE2>` makes the run invalid, and the decoder writes one U+FFFD per
    byte: the streamer waits for the run to end instead of sending "Ї" (then the stream was not the answer)."""
    from geopilot.generation import text_streamer

    tok = tiny[1].tokenizer
    ids = [
        *tok.convert_tokens_to_ids(["<0xD0>", "<0x87>", "<0xE2>"]),
        *tok("a b", add_special_tokens=False)["input_ids"],
    ]
    assert tok.decode(ids[:2]) == "Ї" and tok.decode(ids[:3]) == "\ufffd" * 3
    pieces: list[str] = []
    streamer = text_streamer(tok, pieces.append)
    streamer.put(torch.tensor([[tok.bos_token_id]]))  # the prompt
    for token in ids:
        streamer.put(torch.tensor([token]))
    streamer.end()
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True) and "Ї" not in "".join(pieces)
