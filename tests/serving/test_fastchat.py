"""The FastChat stack on loopback: a real FastChat 0.2.36 controller, the GeoPilot worker (`python serve.py
--controller ...`, tiny model, the whole agent loop inside) and FastChat's OpenAI API server; the `openai` client
gets a completion for a request with an image, equal to the in-process greedy answer. FastChat's API server
cannot stream under pydantic 2 (docs/serving.md), so the worker's own stream route is checked directly."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from helpers.serving import png_bytes, stop_process

ROOT = Path(__file__).resolve().parents[2]
KEY = "fastchat-key"
QUESTION = "How many planes are there?"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait(check, what: str, processes, timeout: float = 240.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in processes:
            if process.poll() is not None:
                raise RuntimeError(f"{process.args} exited with {process.returncode} while waiting for {what}")
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{what} not ready after {timeout} s")


@pytest.fixture(scope="module")
def fastchat_stack(tiny_model_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("fastchat-logs")
    env = {**os.environ, "LOGDIR": str(logs), "TOKENIZERS_PARALLELISM": "false"}
    controller, worker, api = _free_port(), _free_port(), _free_port()
    controller_url = f"http://127.0.0.1:{controller}"
    commands = [
        [sys.executable, "-m", "fastchat.serve.controller", "--host", "127.0.0.1", "--port", str(controller)],
        [
            sys.executable,
            str(ROOT / "serve.py"),
            "--model",
            str(tiny_model_dir),
            "--controller",
            controller_url,
            "--port",
            str(worker),
            "--max-new-tokens",
            "64",
            "--device",
            "cpu",
        ],
        [
            sys.executable,
            "-m",
            "fastchat.serve.openai_api_server",
            "--host",
            "127.0.0.1",
            "--port",
            str(api),
            "--controller-address",
            controller_url,
            "--api-keys",
            KEY,
        ],
    ]
    processes = []
    try:
        for command in commands:
            log = open(logs / f"{Path(command[1]).name}-{len(processes)}.log", "w")  # noqa: SIM115
            processes.append(subprocess.Popen(command, cwd=logs, env=env, stdout=log, stderr=subprocess.STDOUT))

        def models():
            return httpx.get(
                f"http://127.0.0.1:{api}/v1/models", headers={"authorization": f"Bearer {KEY}"}, timeout=5
            ).json()

        _wait(
            lambda: [m["id"] for m in models().get("data", [])] == [tiny_model_dir.name],
            "worker registration",
            processes,
        )
        yield {"api": f"http://127.0.0.1:{api}", "worker": f"http://127.0.0.1:{worker}", "model": tiny_model_dir.name}
    finally:
        for process in processes:
            process.terminate()  # all at once, then wait for each
        for process in processes:
            stop_process(process)


def _message(image: bytes) -> list[dict]:
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    return [
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}],
        }
    ]


pytestmark = pytest.mark.slow  # three server processes: about 30 s on a quiet 2-core machine, 75 s under load


def test_openai_client_through_fastchat_gets_the_agent_answer(fastchat_stack, tiny_model_dir):
    from openai import OpenAI

    from geopilot.agent import GeoPilot

    image = png_bytes(64, 48, seed=7)
    client = OpenAI(base_url=fastchat_stack["api"] + "/v1", api_key=KEY, max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model=fastchat_stack["model"], messages=_message(image), max_tokens=24, temperature=0
    )
    local = GeoPilot.from_pretrained(tiny_model_dir, device="cpu").chat(
        image, QUESTION, generation={"max_new_tokens": 24}
    )
    assert reply.choices[0].message.content == local.answer
    assert reply.usage.completion_tokens == local.tokens.generated

    # a bad image is a clear error, and the worker keeps serving
    from openai import BadRequestError

    with pytest.raises(BadRequestError, match="not an image"):
        client.chat.completions.create(model=fastchat_stack["model"], messages=_message(b"not a png"), max_tokens=8)
    again = client.chat.completions.create(
        model=fastchat_stack["model"], messages=_message(image), max_tokens=24, temperature=0
    )
    assert again.choices[0].message.content == local.answer


def test_worker_protocol_streams_and_reports_status(fastchat_stack):
    from geopilot.serving.worker import ROLES, SEP, SEP2

    worker = fastchat_stack["worker"]
    status = httpx.post(worker + "/worker_get_status", timeout=10).json()
    assert status["model_names"] == [fastchat_stack["model"]]
    conv = httpx.post(worker + "/worker_get_conv_template", timeout=10).json()["conv"]
    assert (conv["sep"], conv["sep2"], list(conv["roles"])) == (SEP, SEP2, list(ROLES))
    image = base64.b64encode(png_bytes(64, 48, seed=7)).decode()
    params = {
        "prompt": f"{SEP}USER: $$<image>$${QUESTION}{SEP}ASSISTANT:",
        "images": [image],
        "max_new_tokens": 24,
        "temperature": 0,
    }
    with httpx.stream("POST", worker + "/worker_generate_stream", json=params, timeout=120) as response:
        events = [json.loads(chunk) for chunk in response.read().split(b"\0") if chunk]
    assert events[-1]["error_code"] == 0 and events[-1]["finish_reason"] == "stop"
    whole = httpx.post(worker + "/worker_generate", json=params, timeout=120).json()
    assert whole["text"] == events[-1]["text"] and whole["geopilot"]["answer"] == whole["text"]
    refused = httpx.post(
        worker + "/worker_generate", json={**params, "images": ["http://169.254.169.254/x.png"]}, timeout=30
    ).json()
    assert refused["error_code"] != 0 and "base64" in refused["text"]
