"""geopilot/agent/loop.py's limits: the chat loop stays within the model's context and its deadline, caps tool calls
per plan, and sets `ChatResult.error` when every tool call of the answer failed."""

from __future__ import annotations

import time

import numpy as np
from helpers.scripted import BrokenTool, NoParams, Scripts, SlowTool, answer, plan

from geopilot.agent import MIN_TURN_TOKENS, GeoPilot
from geopilot.tool_output import ToolOutput
from geopilot.tool_protocol import ToolRegistry

IMAGE = np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)


class Ok:
    name, description, modality, params_model = "ok", "works", None, NoParams

    def run(self, image, params):
        return ToolOutput(message="fine")


def make(tiny, *texts, **kwargs) -> tuple[GeoPilot, Scripts]:
    model, processor = tiny
    scripted = Scripts(processor.tokenizer, list(texts))  # one row replying with `texts`
    tools = ToolRegistry([Ok(), BrokenTool("broken", None), SlowTool(5.0, "slow", None)], timeout_s=30)
    return GeoPilot(model, processor, tools, session_factory=scripted, **kwargs), scripted


def test_every_tool_call_failed_sets_error(tiny):
    pilot, _ = make(tiny, plan("broken", "broken"), answer("I could not tell."))
    result = pilot.chat(IMAGE, "What is there?")
    assert result.outcome == "tools" and result.answer == "I could not tell."
    assert result.error.startswith("every tool call failed: broken: tool 'broken' failed: RuntimeError")
    pilot, _ = make(tiny, plan("broken", "ok"), answer("Half worked."))
    assert pilot.chat(IMAGE, "What is there?").error is None  # one call worked: the answer stands on it


def test_tool_calls_per_plan_are_capped(tiny):
    pilot, _ = make(tiny, plan("ok", "ok", "ok"), answer("done"), max_tool_calls=2)
    result = pilot.chat(IMAGE, "What is there?")
    assert [c.error_kind for c in result.tool_calls] == [None, None, "call_limit"]
    assert "more than max_tool_calls=2" in result.tool_calls[2].error


def test_the_chat_deadline_stops_the_tool_and_the_next_turn(tiny):
    pilot, scripted = make(tiny, plan("slow"), answer("never generated"), chat_timeout_s=0.5)
    started = time.monotonic()
    result = pilot.chat(IMAGE, "What is there?")
    assert time.monotonic() - started < 3.0
    assert result.tool_calls[0].error_kind == "timeout"
    assert result.outcome == "deadline" and "chat_timeout_s=0.5" in result.error
    assert len(scripted.limits) == 1  # the answer turn was not started


def test_turns_are_shortened_then_the_chat_ends_at_the_context(tiny):
    model, processor = tiny
    pilot, scripted = make(tiny, plan("ok"), answer("never generated"))
    context = model.config.text_config.max_position_embeddings
    try:
        prompt_length = len(pilot._prepare(pilot_request := _request(IMAGE, "What is there?")).prompt)
        model.config.text_config.max_position_embeddings = prompt_length + 40
        result = pilot.chat(IMAGE, "What is there?")
    finally:
        model.config.text_config.max_position_embeddings = context
    assert pilot_request.query == "What is there?"
    assert scripted.limits[0] == 40  # the think turn got what was left of the context, not max_new_tokens
    assert result.outcome == "context_limit" and f"fewer than {MIN_TURN_TOKENS} left" in result.error
    assert len(scripted.limits) == 1  # the answer turn (after the tool output) would not fit: not started


def _request(image, query):
    from geopilot.agent import ChatRequest

    return ChatRequest(image=image, query=query)


def test_an_answer_cut_off_at_max_new_tokens_keeps_its_words(tiny):
    from helpers.scripted import CutOff

    whole = answer("There are three ships in the harbour and two more at the pier.")
    cut = CutOff(whole[: whole.index(" and two")])
    pilot, scripted = make(tiny, plan("ok"), cut)
    result = pilot.chat(IMAGE, "What is there?")
    assert result.outcome == "tools" and result.answer == "There are three ships in the harbour…"
    assert "cut off at max_new_tokens" in result.error and not result.repaired
    assert len(scripted.limits) == 2  # no repair turn: it would be cut off again
    assert result.messages[-1].value == "There are three ships in the harbour"

    pilot, _ = make(tiny, CutOff('{"reasoning":"The user asks'), answer("Fixed."))  # cut before any answer: repaired
    result = pilot.chat(IMAGE, "What is there?")
    assert result.repaired and result.answer == "Fixed." and "cut off at max_new_tokens" in result.turns[0].parse_error
