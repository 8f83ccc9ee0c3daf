"""Serving test helpers: small real tools, a scripted session (exact plan texts through the real agent loop), a
uvicorn server on a free loopback port in a background thread, image payloads."""

from __future__ import annotations

import base64
import contextlib
import io
import threading
import time

import numpy as np
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field

from geopilot.generation import Turn
from geopilot.sample import Action, AssistantMessage
from geopilot.tool_output import Detection, ToolOutput
from geopilot.wire import assistant_json

KEY = "test-key"
MODEL = "geopilot-tiny"


class CategoriesParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    categories: list[str] = Field(min_length=1)


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Detector:
    name, description, modality, params_model = "detect_objects", "finds objects", "optical", CategoriesParams

    def run(self, image, params):
        boxes = [(0.1, 0.2, 0.4, 0.5), (0.5, 0.5, 0.7, 0.9)]
        return ToolOutput(detections=[Detection(label=c, box=b, score=0.9) for c in params.categories for b in boxes])


class HangingTool:
    name, description, modality, params_model = "extract_roads", "never returns in time", "optical", NoParams

    def run(self, image, params):
        time.sleep(30)
        return ToolOutput()


class SlowTool:
    name, description, modality, params_model = "segment_semantic", "takes a while", "optical", NoParams

    def run(self, image, params):
        time.sleep(0.6)
        return ToolOutput()


def plan(tool: str, params: dict) -> str:
    return assistant_json(
        AssistantMessage(reasoning="Counting needs the detector.", actions=[Action(tool=tool, params=params)])
    )


def answer(value: str) -> str:
    return assistant_json(AssistantMessage(reasoning="From the tool output.", value=value))


LONG_S = 5.0  # a turn of a question containing LONG takes this long (a long generation)


class ScriptSession:
    """Stands in for KVSession: a question containing TOOL gets a detector plan, SLOW the slow tool, HANG the
        hanging tool, anything else a direct answer (LONG: after LONG_S); the answer turn after tools (or the first turn
    of a conversation ending with a client's tool results) quotes the count. A one-row turn given a
    `stream` sends 4-character pieces, its `delay_s` spread over them (KVSession too streams only one row)."""

    encode_seconds = 0.0

    def __init__(self, tokenizer, prompts, delay_s: float):
        self.tokenizer, self.delay_s = tokenizer, delay_s
        self.questions = [tokenizer.decode(p) for p in prompts]
        self.turn = [0] * len(prompts)

    def generate(self, rows, tails=None, stream=None, max_new_tokens=None):
        delay = max(LONG_S if "LONG" in self.questions[r] else self.delay_s for r in rows)
        if stream is None or len(rows) != 1:  # a streamed turn takes its delay piece by piece, as decoding does
            time.sleep(delay)
            stream = None
        turns = []
        for row in rows:
            question = self.questions[row]
            if self.turn[row] == 0 and "Answer my first question" in question:  # a client brought tool results
                text = answer("There are 2 planes.")
            elif self.turn[row] == 0 and "SLOW" in question:
                text = plan("segment_semantic", {})
            elif self.turn[row] == 0 and "HANG" in question:
                text = plan("extract_roads", {})
            elif self.turn[row] == 0 and "TOOL" in question:
                text = plan("detect_objects", {"categories": ["plane"]})
            elif self.turn[row] == 0:
                text = answer("A direct answer about the scene.")
            else:
                text = answer("There are 2 planes.")
            self.turn[row] += 1
            if stream is not None:
                starts = range(0, len(text), 4)
                for start in starts:
                    time.sleep(delay / len(starts))
                    stream(text[start : start + 4])
            turns.append(Turn(self.tokenizer(text, add_special_tokens=False)["input_ids"], text, True, 5, 0.001))
        return turns


@contextlib.contextmanager
def serving(app):
    """Run `app` with uvicorn on 127.0.0.1:<free port>; yields the base URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def png_bytes(width: int = 64, height: int = 48, seed: int = 0) -> bytes:
    array = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def image_message(question: str, url: str | None = None) -> list[dict]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": url or data_url(png_bytes())}},
                {"type": "text", "text": question},
            ],
        }
    ]


@contextlib.contextmanager
def image_host(drip_interval_s: float = 0.3, drip_bytes: int = 200):
    """A loopback image server: `/drip` answers 200 and then one byte every `drip_interval_s` (a PNG signature,
    then zeros), `drip_bytes` of them; any other path a small PNG at once. Yields its base URL."""
    import http.server

    image = png_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("content-type", "image/png")
            if self.path != "/drip":
                self.send_header("content-length", str(len(image)))
                self.end_headers()
                self.wfile.write(image)
                return
            self.end_headers()
            body = b"\x89PNG\r\n\x1a\n".ljust(drip_bytes, b"\0")
            try:
                for index in range(drip_bytes):
                    self.wfile.write(body[index : index + 1])
                    self.wfile.flush()
                    time.sleep(drip_interval_s)
            except OSError:  # the server under test hung up at its deadline
                pass

        def log_message(self, *args):
            pass

    class Quiet(http.server.ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request, client_address):
            pass

    host = Quiet(("127.0.0.1", 0), Handler)
    threading.Thread(target=host.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{host.server_address[1]}"
    finally:
        host.shutdown()
        host.server_close()
