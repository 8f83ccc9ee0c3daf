"""The FastChat worker in-process (no controller: FastChat's own routes from its module app, behind
`worker_app`): bad requests get FastChat's 40001, never a 500; a timeout is a timeout and stops the job; bare
base64 JPEG is an image; `/model_details` reports the model's real context."""

from __future__ import annotations

import base64
import io
import json
import logging
import time

import httpx
import numpy as np
import pytest
from helpers.scripted import LONG_S
from helpers.serving import MODEL, png_bytes, serving
from PIL import Image

pytest.importorskip("fastchat")
VALIDATION = 40001


@pytest.fixture
def worker(scripted_pilot, monkeypatch):
    """make(**config) -> (worker, base URL of FastChat's worker app serving it)."""
    from fastchat.serve import base_model_worker

    from geopilot.serving.batcher import Batcher
    from geopilot.serving.config import ServeConfig
    from geopilot.serving.worker import GeoPilotWorker, worker_app

    monkeypatch.setattr(base_model_worker, "logger", logging.getLogger("fastchat-test"))  # no log file in cwd
    stack = []

    def make(delay_s: float = 0.0, **config):
        settings = ServeConfig(model_name=MODEL, **config)
        pilot = scripted_pilot(delay_s)
        batcher = Batcher(pilot, settings.max_batch, 0.01, settings.max_concurrency)
        made = GeoPilotWorker(pilot, settings, "http://127.0.0.1:9", "http://127.0.0.1:9", batcher)
        monkeypatch.setattr(base_model_worker, "worker", made)
        context = serving(worker_app(base_model_worker.app, settings))
        stack.append((context, batcher))
        return made, context.__enter__()

    yield make
    for context, batcher in stack:
        context.__exit__(None, None, None)
        batcher.close()


def _params(question: str = "How many planes are there?", image: str | None = None, **extra) -> dict:
    from geopilot.serving.worker import SEP

    image = image or base64.b64encode(png_bytes()).decode()
    return {"prompt": f"{SEP}USER: $$<image>$${question}{SEP}ASSISTANT:", "images": [image], **extra}


def test_bad_params_get_fastchat_40001(worker):
    made, _ = worker()
    good = _params()
    cases = {
        "no prompt": {k: v for k, v in good.items() if k != "prompt"},
        "int prompt": {**good, "prompt": 5},
        "int image": {**good, "images": [5]},
        "hot temperature": {**good, "temperature": "hot"},
        "NaN top_p": {**good, "top_p": float("nan"), "temperature": 0.7},
        "negative max_new_tokens": {**good, "max_new_tokens": -3},
        "not an object": [1, 2],
    }
    for name, params in cases.items():
        reply = made.generate_gate(params)
        assert reply["error_code"] == VALIDATION, (name, reply)
        assert "\n" not in reply["text"], name
        streamed = [json.loads(c) for c in b"".join(made.generate_stream_gate(params)).split(b"\0") if c]
        assert streamed[-1]["error_code"] == VALIDATION, (name, streamed)
    assert made.generate_gate({**good, "temperature": 1e-300})["error_code"] == 0  # greedy, not inf/nan
    assert made.generate_gate(good)["error_code"] == 0


def test_fastchat_routes_given_bad_json_answer_400_40001(worker):
    _, url = worker()
    bodies = [b"{not json", b"[" * 100_000, b'{"a":' * 5000, b'{"n": ' + b"9" * 5000 + b"}", b"5", b"\xff"]
    for route in ("/worker_generate", "/worker_generate_stream", "/count_token"):
        for raw in bodies:
            reply = httpx.post(url + route, content=raw, timeout=30)
            assert reply.status_code == 400, (route, raw[:20], reply.status_code)
            assert reply.json()["error_code"] == VALIDATION
    counted = httpx.post(url + "/count_token", json={"prompt": 5}, timeout=30).json()
    assert counted["error_code"] == VALIDATION
    assert httpx.post(url + "/count_token", json={"prompt": "hello"}, timeout=30).json()["count"] > 0
    assert httpx.post(url + "/worker_generate", json=_params(), timeout=30).json()["error_code"] == 0


def test_a_timeout_is_a_timeout_and_cancels_the_job(worker):
    """FastChat's timeout code (50006), not 50001; and the long job stops, so the next request is answered."""
    made, url = worker(delay_s=0.05, request_timeout_s=1.0, max_batch=1)
    started = time.monotonic()
    reply = httpx.post(url + "/worker_generate", json=_params("LONG: planes?"), timeout=30).json()
    # the 1 s timeout answered before the 5 s job could finish (2 s bounds failed under a loaded CI machine)
    assert reply["error_code"] == 50006 and time.monotonic() - started < LONG_S - 1.0, reply
    with httpx.stream("POST", url + "/worker_generate_stream", json=_params("LONG: planes?"), timeout=30) as stream:
        events = [json.loads(c) for c in stream.read().split(b"\0") if c]
    assert events[-1]["error_code"] == 50006
    time.sleep(0.5)
    assert made.batcher.admitted == 0
    assert httpx.post(url + "/worker_generate", json=_params(), timeout=30).json()["error_code"] == 0


def test_bare_base64_jpeg_is_an_image(worker):
    made, _ = worker()
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(buffer, "JPEG")
    jpeg = base64.b64encode(buffer.getvalue()).decode()
    assert jpeg.startswith("/9j/")
    reply = made.generate_gate(_params(image=jpeg))
    assert reply["error_code"] == 0, reply
    assert made.generate_gate(_params(image="/etc/passwd"))["error_code"] == VALIDATION


def test_model_details_report_the_real_context_length(worker, tiny):
    made, url = worker()
    real = tiny[0].config.text_config.max_position_embeddings
    assert real != 4096  # the old hard-coded answer
    assert made.context_len == real
    assert httpx.post(url + "/model_details", timeout=10).json()["context_length"] == real


def test_the_worker_answers_only_to_its_address_and_loopback_names(worker):
    """It checks no key: a page re-pointed at 127.0.0.1 (DNS rebinding) gets 421, as from `geopilot serve`."""
    _, url = worker()
    port = url.rsplit(":", 1)[1]
    for host in ("evil.example", f"evil.example:{port}"):
        reply = httpx.post(url + "/model_details", headers={"host": host}, timeout=10)
        assert reply.status_code == 421 and reply.json()["error"]["code"] == "bad_host", reply.text
    assert httpx.post(url + "/model_details", headers={"host": f"localhost:{port}"}, timeout=10).status_code == 200


def test_stop_is_honoured_by_the_worker(worker):
    made, _ = worker()
    reply = made.generate_gate(_params("TOOL: planes?", stop=" planes"))
    assert reply["text"] == "There are 2", reply


def test_the_worker_reads_its_image_list_in_order(worker):
    """FastChat writes one image placeholder per image into the turn and sends `images` in order."""
    from geopilot.serving.worker import SEP

    made, _ = worker(max_images=2)
    before, after = (base64.b64encode(png_bytes(seed=seed)).decode() for seed in (0, 1))
    prompt = f"{SEP}USER: $$<image>$$$$<image>$$What changed?{SEP}ASSISTANT:"
    job, _ = made._job({"prompt": prompt, "images": [before, after]})
    assert [np.asarray(i.image).tolist() for i in job.request["image"]] == [
        np.asarray(Image.open(io.BytesIO(png_bytes(seed=seed)))).tolist() for seed in (0, 1)
    ]
    assert made.generate_gate({"prompt": prompt, "images": [before, after]})["error_code"] == 0
    over = made.generate_gate({"prompt": prompt, "images": [before, after, before]})
    assert over["error_code"] == VALIDATION and "3 images, over this worker's limit of 2" in over["text"]
    small = base64.b64encode(png_bytes(width=32, height=32)).decode()
    sizes = made.generate_gate({"prompt": prompt, "images": [before, small]})
    assert sizes["error_code"] == VALIDATION and "same size" in sizes["text"]
