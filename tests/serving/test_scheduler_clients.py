"""The per-step scheduler behind the HTTP API (tiny model, in process): a client that disconnects mid-stream leaves
the batch and the others' replies are those of a run without it; a burst of 10x --max-concurrency requests gets
200s and 503s only, and the server's memory stays flat."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import psutil
import pytest
from helpers.scripted import Detector
from helpers.serving import KEY, MODEL, image_message, serving

from geopilot.serving.scheduler import StepScheduler
from geopilot.tool_protocol import ToolRegistry

HEADERS = {"authorization": f"Bearer {KEY}"}


@pytest.fixture
def pilot(tiny):
    from geopilot.agent import GeoPilot

    return GeoPilot(tiny[0], tiny[1], ToolRegistry([Detector(boxes=2)]))


def _app(pilot, **config):
    from geopilot.serving.api import create_app
    from geopilot.serving.config import ServeConfig

    return create_app(pilot, ServeConfig(model_name=MODEL, api_key=KEY, **config))


def _until(condition, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "timed out"

        time.sleep(0.002)


def _body(question: str, tokens: int, **extra) -> dict:
    return {"model": MODEL, "messages": image_message(question), "max_tokens": tokens, **extra}


def _reply(url: str, body: dict) -> dict:
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, headers=HEADERS, timeout=120)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    return {"message": data["choices"][0]["message"], "usage": data["usage"]}


def test_a_client_that_leaves_mid_stream_frees_its_row_and_the_others_are_unaffected(pilot):
    others = [_body("what is in the first image?", 64), _body("and in the second?", 48, min_tokens=48)]
    with serving(_app(pilot, scheduler="static", max_batch=1)) as url:
        reference = [_reply(url, body) for body in others]  # unbatched, and without the stream
    app = _app(pilot, scheduler="step")
    batcher = app.state.batcher
    assert isinstance(batcher, StepScheduler)
    with serving(app) as url:
        long = _body("count everything", 700, min_tokens=700, stream=True)  # turns of 700 tokens: it runs long
        with (
            httpx.Client(headers=HEADERS, timeout=120) as client,
            client.stream("POST", f"{url}/v1/chat/completions", json=long) as stream,
        ):
            assert stream.status_code == 200  # the stream is open (nothing of it is read)
            _until(lambda: any(r.job.on_text is not None for r in batcher.rows) and len(batcher.steps) > 3, 120)
            streamed = next(r for r in batcher.rows if r.job.on_text is not None)
            replies: list[dict] = []
            threads = [threading.Thread(target=lambda b=b: replies.append((b, _reply(url, b)))) for b in others]
            for thread in threads:
                thread.start()
            _until(lambda: len(batcher.rows) == 3, 120)  # the other two joined the stream's batch
        # the client is gone: its row leaves within a few steps, long before its 700-token turns
        _until(lambda: streamed not in batcher.rows, timeout_s=30)
        assert streamed.job.future.cancelled() and streamed.cache is None and streamed not in batcher._batch
        for thread in threads:
            thread.join(timeout=120)
    assert [reply for _, reply in sorted(replies, key=lambda pair: others.index(pair[0]))] == reference


@pytest.mark.slow  # 17 s on the shared 2-core machine (load 9): four bursts of 40 requests
def test_a_burst_of_ten_times_max_concurrency_gets_503s_no_errors_and_memory_stays_flat(pilot):
    limit, margin_mb = 4, 50  # RSS after the last burst within 50 MB of after the first (the warm-up)
    app = _app(pilot, scheduler="step", max_concurrency=limit)

    async def burst(url: str) -> list[int]:
        async with httpx.AsyncClient(headers=HEADERS, timeout=120) as client:
            replies = await asyncio.gather(
                *(client.post(f"{url}/v1/chat/completions", json=_body(f"image {i}?", 24)) for i in range(10 * limit))
            )
        return [reply.status_code for reply in replies]

    process = psutil.Process()
    with serving(app) as url:
        codes = asyncio.run(burst(url))  # warm-up: caches, the tool registry, the grammar
        warm = process.memory_info().rss / 2**20
        for _ in range(3):
            codes += asyncio.run(burst(url))
        grown = process.memory_info().rss / 2**20 - warm
        _until(lambda: app.state.batcher.admitted == 0 and not app.state.batcher.rows)
    assert set(codes) <= {200, 503} and codes.count(200) >= 4 * limit and codes.count(503) > 0
    assert grown < margin_mb, f"RSS grew {grown:.0f} MB over three bursts"
