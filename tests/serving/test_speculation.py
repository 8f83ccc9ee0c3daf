"""Prompt-lookup speculation on the answer turn gives exactly the greedy tokens of plain decoding."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from geopilot.batch import pixel_values
from geopilot.generation import LOOKUP_MAX_NGRAM, GenerationOptions, KVSession, _propose
from geopilot.model import num_image_tokens
from geopilot.render import render_turns, user_turn_text
from geopilot.tokenizer import encode_text
from geopilot.tool_output import Detection, ToolOutput
from geopilot.wire import format_tool_turn

BOXES = [(0.1, 0.1, 0.2, 0.2), (0.3, 0.3, 0.4, 0.4), (0.6, 0.5, 0.7, 0.6)]


def test_propose_continues_the_latest_match_of_the_longest_suffix():
    assert _propose([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3], 2) == [7, 8]
    assert _propose([1, 2, 5, 1, 2, 6, 1, 2], 10) == [6, 1]  # equally long matches: the most recent one
    assert _propose([1, 2, 3], 4) == []


def test_propose_prefers_a_longer_match_to_a_more_recent_shorter_one():
    ids = [1, 2, 3, 4, 9, 8, 7, 6, 3, 4, 5, 5, 5, 5, 1, 2, 3, 4]
    assert _propose(ids, 10) == [9, 8, 7, 6]  # not [5, 5, ...] after the more recent `3 4`
    long = list(range(100, 100 + LOOKUP_MAX_NGRAM + 4))
    assert _propose(long + [0] + long[:-3] + [1] + long[:-3], 20)[:3] == [1, 100, 101]  # both reach the cap: newest


def test_propose_skips_one_token_matches_and_drafts_as_many_tokens_as_matched():
    assert _propose([5, 6, 7, 6], 3) == []  # a lone `6` (a digit, a comma) says little about what follows
    assert _propose([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3], 10) == [4, 5, 6]
    assert _propose([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6], 4) == [7, 8, 9, 1]


def test_propose_finds_the_quoted_box_among_digit_tokens(tiny):
    tok = tiny[1].tokenizer
    output = ToolOutput(detections=[Detection(label="plane", box=b, score=0.9) for b in BOXES])
    context = encode_text(tok, user_turn_text(format_tool_turn([("detect_objects", output)], "How many?"), first=False))
    quoting = encode_text(tok, " The planes are at [0.1,0.1,0.2,0.2], [0.3,0.3,")
    assert len(tok.tokenize("0.4,0.4")) == 7  # digits are single tokens: `,0.` alone occurs in every box
    assert tok.decode(_propose(context + quoting, 10)).startswith("0.4,0.4]")


def _answer_turn(tiny, lookup: int, answer_tokens: int, stream=None):
    model, processor = tiny
    tok = processor.tokenizer
    prompt = render_turns([("user", "<image>\nHow many planes?")], tok, num_image_tokens(model.config)).input_ids
    rng = np.random.default_rng(1)
    pixels = pixel_values(processor, [Image.fromarray(rng.integers(0, 255, (40, 56, 3), dtype=np.uint8))])
    session = KVSession(model, tok, [prompt], pixels, GenerationOptions(max_new_tokens=6, prompt_lookup_tokens=lookup))
    session.generate([0])
    output = ToolOutput(detections=[Detection(label="plane", box=b, score=0.9) for b in BOXES])
    tail = encode_text(tok, user_turn_text(format_tool_turn([("detect_objects", output)], "How many?"), first=False))
    session.generation_config = GenerationOptions(
        max_new_tokens=answer_tokens, min_new_tokens=answer_tokens
    ).generation_config(tok)
    [turn] = session.generate([0], [tail], stream=stream)
    return turn, session


@pytest.mark.parametrize(("lookup", "tokens"), [(3, 48), (10, 48), (10, 96)])
def test_answer_turn_with_lookup_is_token_identical_to_greedy(tiny, lookup, tokens):
    plain, _ = _answer_turn(tiny, 0, tokens)
    pieces = []
    fast, session = _answer_turn(tiny, lookup, tokens, stream=pieces.append)
    assert fast.token_ids == plain.token_ids and len(fast.token_ids) == tokens
    assert "".join(pieces).strip() == fast.text  # the streamer saw every accepted token
    assert session.cache.get_seq_length() == session.sequences.shape[1] - 1  # rejected proposals were cropped
    stats = fast.lookup  # the random model repeats itself, so proposals are accepted: the check is not vacuous
    assert plain.lookup is None and stats.generated == tokens and stats.accepted > 0
    assert stats.forwards + stats.accepted == tokens and stats.accepted <= stats.proposed


def test_agent_answers_are_identical_with_and_without_lookup(tiny):
    from geopilot.agent import GeoPilot
    from geopilot.tool_protocol import ToolRegistry

    model, processor = tiny
    image = np.random.default_rng(3).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    pilot = GeoPilot(model, processor, ToolRegistry([]))
    results = [
        pilot.chat(image, "How many planes?", generation={"max_new_tokens": 24, "prompt_lookup_tokens": n})
        for n in (0, 10)
    ]
    assert results[0].answer == results[1].answer
    assert [t.text for t in results[0].turns] == [t.text for t in results[1].turns]
