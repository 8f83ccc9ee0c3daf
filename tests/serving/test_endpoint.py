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

import base64
import io
import json

import numpy as np
import pytest
import torch
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from helpers.scripted import Detector
from helpers.serving import serving
from PIL import Image
from transformers import LogitsProcessor, LogitsProcessorList

from geopilot.agent import GeoPilot
from geopilot.batch import pixel_values
from geopilot.generation import KVSession
from geopilot.sample import Action, AssistantMessage
from geopilot.tokenizer import encode_text
from geopilot.tool_protocol import ToolRegistry
from geopilot.wire import assistant_json

INVALID = assistant_json(AssistantMessage(reasoning="Count them.", actions=[Action(tool="count_planes", params={})]))
VALID = assistant_json(
    AssistantMessage(
        reasoning="Detect them.", actions=[Action(tool="detect_objects", params={"categories": ["plane"]})]
    )
)


class Forced(LogitsProcessor):
    """Forces a scripted token sequence (then </s>) when given one; otherwise leaves the scores alone."""

    def __init__(self, tokenizer, text: str | None):
        self.ids = None if text is None else encode_text(tokenizer, " " + text) + [tokenizer.eos_token_id]
        self.start = None

    def __call__(self, input_ids, scores):
        if self.ids is None:
            return scores
        if self.start is None:
            self.start = input_ids.shape[1]
        forced = torch.full_like(scores, float("-inf"))
        forced[:, self.ids[min(input_ids.shape[1] - self.start, len(self.ids) - 1)]] = 0.0
        return forced


SCRIPT = [INVALID, VALID, None]  # by the number of assistant turns so far


class ForcedSession(KVSession):
    def __init__(self, model, tokenizer, prompts, pixels, options):
        super().__init__(model, tokenizer, prompts, pixels, options)
        self.turn = 0

    def generate(self, rows, tails=None, stream=None, keep_logits=False, max_new_tokens=None):
        self.logits_processor = LogitsProcessorList([Forced(self.tokenizer, SCRIPT[self.turn])])
        self.turn += 1
        return super().generate(rows, tails, stream, keep_logits, max_new_tokens)


def engine_app(model, processor) -> FastAPI:
    """A minimal chat-completions server: chat template -> ids (image tokens expanded) -> greedy generate."""
    tok = processor.tokenizer
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def complete(request: Request):
        body = await request.json()
        urls = [
            p["image_url"]["url"]
            for m in body["messages"]
            if isinstance(m["content"], list)
            for p in m["content"]
            if p["type"] == "image_url"
        ]
        image = Image.open(io.BytesIO(base64.b64decode(urls[0].split(",", 1)[1]))).convert("RGB")
        text = tok.apply_chat_template(body["messages"], tokenize=False, add_generation_prompt=True)
        inputs = processor(images=[image], text=text, return_tensors="pt", add_special_tokens=False)
        inputs["pixel_values"] = pixel_values(processor, [image])
        script = SCRIPT[sum(m["role"] == "assistant" for m in body["messages"])]
        with torch.inference_mode():
            out = model.generate(
                **inputs,
                max_new_tokens=body["max_tokens"],
                do_sample=False,
                logits_processor=LogitsProcessorList([Forced(tok, script)]),
            )
        generated = out[0, inputs["input_ids"].shape[1] :].tolist()
        finished = tok.eos_token_id in generated
        ids = generated[: generated.index(tok.eos_token_id)] if finished else generated
        content, finish = tok.decode(ids, skip_special_tokens=True), "stop" if finished else "length"
        usage = {"prompt_tokens": inputs["input_ids"].shape[1], "completion_tokens": len(ids)}
        if body.get("stream"):  # SSE: the text in two pieces, then the finish reason and the usage
            half = len(content) // 2
            events = [
                {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                for piece in (content[:half], content[half:])
            ]
            events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "usage": usage})
            lines = [f"data: {json.dumps(event)}\n\n" for event in events] + ["data: [DONE]\n\n"]
            return StreamingResponse(iter(lines), media_type="text/event-stream")
        return {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}],
            "usage": usage,
        }

    return app


@pytest.mark.parametrize("seed", [5, 6])
def test_endpoint_answers_equal_the_in_process_ones(tiny, seed):
    model, processor = tiny
    registry = ToolRegistry([Detector()])
    image = np.random.default_rng(seed).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    generation = {"max_new_tokens": 64}
    local = GeoPilot(
        model,
        processor,
        registry,
        session_factory=lambda prompts, pixels, options: ForcedSession(
            model, processor.tokenizer, prompts, pixels, options
        ),
    ).chat(image, "How many planes are there?", generation=generation)
    with serving(engine_app(model, processor)) as url:
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
    with serving(engine_app(model, processor)) as engine:
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
