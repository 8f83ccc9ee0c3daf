"""Prompt-lookup speculation on the answer turn gives exactly the greedy tokens of plain decoding."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from geopilot.batch import pixel_values
from geopilot.generation import GenerationOptions, KVSession, _propose
from geopilot.model import num_image_tokens
from geopilot.render import render_turns, user_turn_text
from geopilot.tokenizer import encode_text
from geopilot.tool_output import Detection, ToolOutput
from geopilot.wire import format_tool_turn

BOXES = [(0.1, 0.1, 0.2, 0.2), (0.3, 0.3, 0.4, 0.4), (0.6, 0.5, 0.7, 0.6)]


def test_propose_continues_the_latest_match_of_the_longest_suffix():
    assert _propose([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3], 2) == [7, 8]
    assert _propose([5, 6, 7, 6], 3) == [7, 6]
    assert _propose([1, 2, 3], 4) == []


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


@pytest.mark.parametrize("lookup", [3, 10])
def test_answer_turn_with_lookup_is_token_identical_to_greedy(tiny, lookup):
    plain, _ = _answer_turn(tiny, 0, 48)
    pieces = []
    fast, session = _answer_turn(tiny, lookup, 48, stream=pieces.append)
    assert fast.token_ids == plain.token_ids and len(fast.token_ids) == 48
    assert "".join(pieces).strip() == fast.text  # the streamer saw every accepted token
    assert session.cache.get_seq_length() == session.sequences.shape[1] - 1  # rejected proposals were cropped


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
