"""`GeoPilot.from_endpoint` against a loopback OpenAI-compatible server that renders the exported chat template and
generates with the tiny model in transformers (what `vllm serve DIR` does): greedy answers equal the in-process
path's, and the tools run on the client side.

A random model's free text does not survive decode -> re-encode (byte pieces, non-canonical splits), and an
endpoint only returns text, so the first two turns are forced on both sides (the same logits processor): a plan
calling an unknown tool (-> the repair turn), then a valid detector plan (-> the tool runs here). The answer turn
is free greedy decoding on both sides; after a repair an unparsable answer is returned as is, so `answer` is the
model's own greedy text, decoded in-process from the reused KV cache and by the server from the re-rendered
conversation.
"""

from __future__ import annotations

import numpy as np
import pytest
from fastapi import FastAPI, Request
from helpers.chat_engine import Forced, engine_app
from helpers.scripted import BoxSegmenter, Detector
from helpers.serving import serving
from transformers import LogitsProcessorList

from geopilot.agent import GeoPilot
from geopilot.generation import KVSession
from geopilot.sample import Action, AssistantMessage
from geopilot.tool_protocol import ToolRegistry
from geopilot.wire import assistant_json

INVALID = assistant_json(AssistantMessage(reasoning="Count them.", actions=[Action(tool="count_planes", params={})]))
VALID = assistant_json(
    AssistantMessage(
        reasoning="Detect them.", actions=[Action(tool="detect_objects", params={"categories": ["plane"]})]
    )
)


SCRIPT = [INVALID, VALID, None]  # by the number of assistant turns so far


class ForcedSession(KVSession):
    def __init__(self, model, tokenizer, prompts, pixels, options, **images):
        super().__init__(model, tokenizer, prompts, pixels, options, **images)
        self.turn = 0

    def generate(self, rows, tails=None, stream=None, keep_logits=False, max_new_tokens=None):
        self.logits_processor = LogitsProcessorList([Forced(self.tokenizer, SCRIPT[self.turn])])
        self.turn += 1
        return super().generate(rows, tails, stream, keep_logits, max_new_tokens)


@pytest.mark.parametrize("seed, count", [(5, 1), (6, 1), (7, 2)])
def test_endpoint_answers_equal_the_in_process_ones(tiny, seed, count):
    """One image, or two (before, after: two image_url parts to the endpoint, in order)."""
    model, processor = tiny
    registry = ToolRegistry([Detector()])
    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 255, (48, 64, 3), dtype=np.uint8) for _ in range(count)]
    image = images[0] if count == 1 else images
    generation = {"max_new_tokens": 64}
    local = GeoPilot(
        model,
        processor,
        registry,
        session_factory=lambda prompts, pixels, options, **more: ForcedSession(
            model, processor.tokenizer, prompts, pixels, options, **more
        ),
    ).chat(image, "How many planes are there?", generation=generation)
    with serving(engine_app(model, processor, SCRIPT)) as url:
        remote_pilot = GeoPilot.from_endpoint(url + "/v1", "tiny", tools=registry)
        remote = remote_pilot.chat(image, "How many planes are there?", generation=generation)
        [batched] = remote_pilot.chat_batch(
            [{"image": image, "query": "How many planes are there?"}], generation=generation
        )
        pieces = []
        streamed = remote_pilot.chat(image, "How many planes are there?", generation=generation, stream=pieces.append)
    assert [t.kind for t in local.turns] == ["think", "repair", "answer"] and local.repaired
    assert local.tool_calls[0].output is not None and remote.tool_calls[0].output == local.tool_calls[0].output
    assert [t.text for t in remote.turns] == [t.text for t in local.turns]
    assert remote.answer == local.answer == batched.answer == streamed.answer and len(local.answer) > 10
    assert remote.outcome == local.outcome == "unparsable"
    assert [t.generated_tokens for t in remote.turns] == [t.generated_tokens for t in local.turns]


def test_serve_with_an_engine_url_answers_through_the_endpoint(tiny):
    """`geopilot serve --engine-url URL`: GeoPilot's API in front, the LLM turns on the engine, tools here."""
    from helpers.serving import KEY, image_message
    from openai import OpenAI

    from geopilot.serving.api import create_app
    from geopilot.serving.config import ServeConfig

    model, processor = tiny
    registry = ToolRegistry([Detector()])
    with serving(engine_app(model, processor, SCRIPT)) as engine:
        pilot = GeoPilot.from_endpoint(engine + "/v1", "tiny", registry)
        with serving(create_app(pilot, ServeConfig(model_name="tiny", api_key=KEY, max_new_tokens=64))) as url:
            client = OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
            reply = client.chat.completions.create(model="tiny", messages=image_message("How many planes are there?"))
    trace = reply.model_extra["geopilot"]
    assert trace["tool_calls"][0]["function"]["name"] == "detect_objects"
    assert [t["kind"] for t in trace["result"]["turns"]] == ["think", "repair", "answer"]
    assert reply.choices[0].message.content == trace["result"]["turns"][-1]["text"]


def test_serving_imports_no_private_names_from_other_modules():
    """The endpoint engine runs the agent loop through `geopilot.agent`'s public seam, not its internals."""
    import ast
    from pathlib import Path

    import geopilot.serving

    for path in Path(geopilot.serving.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                private = [alias.name for alias in node.names if alias.name.startswith("_")]
                assert not private, f"{path.name} imports {private} from {node.module}"


def scripted_engine(replies: list[tuple[str, int]], delay_s: float = 0.0, max_model_len: int | None = None):
    """An OpenAI-compatible server that answers each chat completion with the next (text, prompt_tokens) and
    counts the requests; /models lists `max_model_len` as vLLM does."""
    import asyncio

    app, seen = FastAPI(), []

    @app.get("/v1/models")
    def models():
        return {"data": [{"id": "tiny", "object": "model", "max_model_len": max_model_len}]}

    @app.post("/v1/chat/completions")
    async def complete(request: Request):
        seen.append(await request.json())
        await asyncio.sleep(delay_s)
        text, prompt_tokens = replies[min(len(seen), len(replies)) - 1]
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 20}
        message = {"role": "assistant", "content": text}
        return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}], "usage": usage}

    return app, seen


def test_the_chat_deadline_holds_under_the_http_engine():
    """`chat_timeout_s` bounds a chat whose turns are generated by a slow server, as it does in process."""
    import time

    app, seen = scripted_engine([(VALID, 100)], delay_s=5.0)
    image = np.zeros((32, 32, 3), dtype=np.uint8)
    with serving(app) as url:
        pilot = GeoPilot.from_endpoint(url + "/v1", "tiny", ToolRegistry([Detector()]), chat_timeout_s=0.5)
        started = time.monotonic()
        result = pilot.chat(image, "How many planes are there?")
        elapsed = time.monotonic() - started
    assert result.outcome == "deadline" and "chat_timeout_s=0.5" in result.error
    assert elapsed < 2.0 and len(seen) == 1


def test_the_context_check_holds_under_the_http_engine():
    """The server's usage says the conversation nearly fills its context (`max_model_len` from /models): the
    answer turn after the tool output is not sent; the chat ends as context_limit, as in process."""
    app, seen = scripted_engine([(VALID, 980)], max_model_len=1024)
    image = np.zeros((32, 32, 3), dtype=np.uint8)
    with serving(app) as url:
        pilot = GeoPilot.from_endpoint(url + "/v1", "tiny", ToolRegistry([Detector()]))
        assert pilot.context_length == 1024
        result = pilot.chat(image, "How many planes are there?")
    assert result.tool_calls and result.tool_calls[0].tool == "detect_objects"
    assert result.outcome == "context_limit" and "context of 1024 tokens" in result.error
    assert len(seen) == 1


def test_a_qwen_endpoint_reads_pixel_boxes_and_its_plans_come_back_normalised():
    """`--engine-url` on a Qwen2.5-VL server: the conversation it renders holds the boxes in pixels of the resized
    image (Qwen's default resize: a 448 px square stays 448), its box params are decoded as whole pixels, and the
    plan's pixels reach the tool, and the answer, normalised."""
    import json

    think = (
        '{"reasoning":"Segment it.","actions":[{"tool":"segment_box","params":{"box":[112,224,336,336]}}],"value":null}'
    )
    answer = '{"reasoning":"From the tool output.","actions":[],"value":"It is at [112, 224, 336, 336]."}'
    app, seen = scripted_engine([(think, 300), (answer, 400)])
    segmenter = BoxSegmenter()
    image = np.random.default_rng(0).integers(0, 255, (448, 448, 3), dtype=np.uint8)
    with serving(app) as url:
        pilot = GeoPilot.from_endpoint(url + "/v1", "tiny", ToolRegistry([segmenter]), family="qwen2_5_vl")
        result = pilot.chat(image, "Segment the plane in the lower half.")
    assert segmenter.received == [(0.25, 0.5, 0.75, 0.75)]
    assert result.answer == "It is at [0.25, 0.5, 0.75, 0.75]." and result.outcome == "tools"
    tool_turn = seen[1]["messages"][-1]
    assert tool_turn["role"] == "tool" and '"box":[112,224,336,336]' in tool_turn["content"]
    assert seen[1]["messages"][-2]["content"] == think  # the plan goes back as the model wrote it
    schema = json.dumps(seen[0]["response_format"]["json_schema"]["schema"])
    assert '"box": {"type": "array", "items": {"type": "integer", "minimum": 0}' in schema
