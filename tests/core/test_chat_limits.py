"""Items 5 and 7: the chat loop stays within the model's context and its deadline, caps tool calls per plan, and
sets `ChatResult.error` when every tool call of the answer failed."""

from __future__ import annotations

import time

import numpy as np
import pytest

from geopilot.agent import MIN_TURN_TOKENS, GeoPilot
from geopilot.cancellation import check_cancelled
from geopilot.generation import Turn
from geopilot.sample import Action, AssistantMessage
from geopilot.tool_output import ToolOutput
from geopilot.tool_protocol import ToolRegistry
from geopilot.tools.tasks import NoParams
from geopilot.wire import assistant_json

IMAGE = np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)


def plan(*tools: str) -> str:
    return assistant_json(AssistantMessage(reasoning="r", actions=[Action(tool=t, params={}) for t in tools]))


def answer(value: str) -> str:
    return assistant_json(AssistantMessage(reasoning="r", value=value))


class Scripted:
    """A session factory whose single row replies with the given texts; records each call's max_new_tokens."""

    def __init__(self, tokenizer, *texts: str):
        self.tokenizer, self.texts, self.limits = tokenizer, list(texts), []

    def __call__(self, prompts, pixels, options):
        self.prompt = prompts[0]
        return self

    encode_seconds = 0.0

    def generate(self, rows, tails=None, stream=None, max_new_tokens=None):
        self.limits.append(max_new_tokens)
        text = self.texts.pop(0)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if max_new_tokens is not None:
            ids = ids[:max_new_tokens]
        new = len(tails[0]) if tails is not None else len(self.prompt)
        return [Turn(ids, text, True, new, 0.001)]


class Ok:
    name, description, modality, params_model = "ok", "works", None, NoParams

    def run(self, image, params):
        return ToolOutput(message="fine")


class Broken(Ok):
    name = "broken"

    def run(self, image, params):
        raise RuntimeError("backend exploded")


class Slow(Ok):
    name = "slow"

    def run(self, image, params):
        for _ in range(500):  # 5 s, with a cancellation point every 10 ms
            check_cancelled()
            time.sleep(0.01)
        return ToolOutput(message="late")


@pytest.fixture(scope="module")
def tiny():
    from geopilot.model import ModelConfig, build_model

    model, processor = build_model(ModelConfig())
    return model.eval(), processor


def make(tiny, *texts, **kwargs) -> tuple[GeoPilot, Scripted]:
    model, processor = tiny
    scripted = Scripted(processor.tokenizer, *texts)
    tools = ToolRegistry([Ok(), Broken(), Slow()], timeout_s=30)
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
