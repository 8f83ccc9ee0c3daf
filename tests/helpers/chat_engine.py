"""A loopback OpenAI-compatible chat-completions server that does what `vllm serve DIR` does with a GeoPilot export:
the chat template renders the messages, the image tokens are expanded, the model generates greedily.

A random model's free text is no plan (and an endpoint gets no grammar), so a turn can be forced: `script[k]` is
the text of the reply to a conversation holding k assistant messages (the last entry for any more; None: free
greedy decoding). `seen` gets every request's rendered prompt text.
"""

from __future__ import annotations

import base64
import io
import json

import torch
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from PIL import Image
from transformers import LogitsProcessor, LogitsProcessorList

from geopilot.batch import pixel_values
from geopilot.tokenizer import encode_text


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


def engine_app(model, processor, script: list[str | None], seen: list[str] | None = None) -> FastAPI:
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
        images = [Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB") for url in urls]
        text = tok.apply_chat_template(body["messages"], tokenize=False, add_generation_prompt=True)
        if seen is not None:
            seen.append(text)
        inputs = processor(images=images, text=text, return_tensors="pt", add_special_tokens=False)
        inputs["pixel_values"] = pixel_values(processor, images)  # one per image part, in order
        forced = script[min(sum(m["role"] == "assistant" for m in body["messages"]), len(script) - 1)]
        with torch.inference_mode():
            out = model.generate(
                **inputs,
                max_new_tokens=body["max_tokens"],
                do_sample=False,
                logits_processor=LogitsProcessorList([Forced(tok, forced)]),
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
