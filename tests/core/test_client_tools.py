"""Client-run tools in the agent (issue 25 item 1): plans decoded inside the plan grammar for each tool_choice,
the prefix cache that lets the answer continue from the think turn's KV cache, and what it does with a client
that never comes back."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from helpers.scripted import NoParams

from geopilot.agent import ClientTools, GeoPilot, PrefixCache
from geopilot.sample import Action, AssistantMessage
from geopilot.tool_output import Detection, ToolOutput
from geopilot.tool_protocol import ToolRegistry
from geopilot.wire import assistant_json

OUTPUT = ToolOutput(detections=[Detection(label="plane", box=(0.1, 0.2, 0.3, 0.4), score=0.9)])
PLAN = assistant_json(
    AssistantMessage(
        reasoning='Two "quoted" words \\ and é',
        actions=[
            Action(tool="detect_all", params={}),
            Action(tool="ground", params={"expression": "the plane", "k": [1, -2.5e3, True, None, {}]}),
        ],
    )
)
ANSWER = assistant_json(AssistantMessage(reasoning="Seen.", value="Two planes."))


class WholeScene:
    name, description, modality, params_model = "detect_all", "every object", "optical", NoParams

    def run(self, image, params):
        return OUTPUT


@pytest.fixture
def client_pilot(tiny):
    def make(cache: PrefixCache | None):
        return GeoPilot(tiny[0], tiny[1], ToolRegistry([WholeScene()]), prefix_cache=cache)

    return make


@pytest.mark.parametrize("choice", ["none", "auto", "required", "detect_all"])
def test_the_random_model_writes_a_plan_that_obeys_tool_choice(client_pilot, image, choice):
    """Unconstrained, the tiny random model writes no JSON at all; in the grammar its first turn parses."""
    result = client_pilot(None).chat(
        image,
        "How many planes?",
        generation={"max_new_tokens": 64},
        client_tools=ClientTools(("detect_all",), choice=choice),
    )
    think = result.turns[0]
    assert think.parse == "strict" and not think.problems and not result.repaired
    if choice == "none":
        assert result.outcome == "direct" and not think.plan.actions
    elif choice != "auto":
        assert result.outcome == "tool_calls" and [a.tool for a in result.messages[-1].actions][:1] == ["detect_all"]


def results_history(result) -> list:
    return [m.model_dump(mode="json") for m in result.messages] + [
        {"role": "tool", "name": "detect_all", "content": OUTPUT.model_dump(mode="json")}
    ]


def test_the_answer_continues_from_the_parked_think_turn(client_pilot, image):
    tools = ClientTools(("detect_all",), choice="required")
    generation = {"max_new_tokens": 48}
    cache = PrefixCache()
    pilot = client_pilot(cache)
    think = pilot.chat(image, "How many planes?", generation=generation, client_tools=tools)
    assert think.outcome == "tool_calls" and len(cache) == 1
    auto = ClientTools(("detect_all",))
    hit = pilot.chat(image, None, history=results_history(think), generation=generation, client_tools=auto)
    assert cache.hits == 1 and hit.turns[0].kind == "answer"
    miss = client_pilot(None).chat(
        image, None, history=results_history(think), generation=generation, client_tools=auto
    )
    # a hit prefills the plan (as the template renders it) and the tool turn; a miss the image and the prompt too,
    # and a hit answers exactly as a miss (the grammar decoded the plan in other tokens than a re-prefill reads)
    assert hit.tokens.input < miss.tokens.input - think.tokens.input // 2
    assert hit.turns[0].new_input_tokens == miss.turns[0].new_input_tokens - think.tokens.input
    assert [t.text for t in hit.turns] == [t.text for t in miss.turns]
    # another image, or another system prompt, is another prefix
    pilot.chat(image, "How many planes?", generation=generation, client_tools=tools)
    pilot.chat(image[::-1].copy(), None, history=results_history(think), generation=generation, client_tools=auto)
    pilot.chat(image, None, history=results_history(think), generation=generation, client_tools=auto, system="")
    assert cache.hits == 1 and cache.misses == 2


def test_a_fork_continues_exactly_as_its_batch_would(tiny):
    """KVSession.fork(row) of a left-padded batch: the forked row's next turn is the batch row's, token for token."""
    from geopilot.batch import pixel_values
    from geopilot.generation import GenerationOptions, KVSession
    from geopilot.render import render_turns
    from geopilot.tokenizer import encode_text

    model, processor = tiny
    tok = processor.tokenizer
    images = [np.random.default_rng(seed).integers(0, 255, (32, 32, 3), dtype=np.uint8) for seed in (1, 2)]
    from PIL import Image

    pixels = pixel_values(processor, [Image.fromarray(i) for i in images])
    from geopilot.model import num_image_tokens

    prompts = [
        render_turns([("user", f"<image>\n{q}")], tok, num_image_tokens(model.config)).input_ids
        for q in ("How many planes are parked on the long apron?", "Ships?")
    ]
    options = GenerationOptions(max_new_tokens=12, min_new_tokens=12, prompt_lookup_tokens=0)
    batch = KVSession(model, tok, prompts, pixels, options)
    batch.generate([0, 1])
    fork = batch.fork(1)
    tail = encode_text(tok, " USER: detect_all output: {} ASSISTANT:")
    [alone] = fork.generate([0], [tail])
    _, together = batch.generate([0, 1], [tail, tail])
    assert alone.token_ids == together.token_ids


def test_a_client_that_never_comes_back_costs_its_entry_until_it_expires():
    now = [0.0]
    cache = PrefixCache(max_entries=2, ttl_s=10.0, clock=lambda: now[0])

    class Session:  # stands in for a parked KVSession (its GPU tensors)
        pass

    parked = Session()
    watch = weakref.ref(parked)
    cache.park("a", parked)
    del parked
    now[0] = 9.0
    assert len(cache) == 1 and watch() is not None
    now[0] = 10.0
    assert len(cache) == 0 and cache.take("a") is None and cache.expired == 1
    gc.collect()
    assert watch() is None  # nothing holds it any more
    for key in "bcd":  # bounded: the least recently parked goes first
        cache.park(key, Session())
    assert len(cache) == 2 and cache.take("b") is None and cache.evicted == 1 and cache.take("d") is not None
