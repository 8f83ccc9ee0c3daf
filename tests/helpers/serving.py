"""Serving test helpers: a uvicorn server on a free loopback port in a background thread, image payloads and hosts
(the tools and scripted sessions are helpers/scripted.py's)."""

from __future__ import annotations

import base64
import contextlib
import io
import subprocess
import threading
import time

import numpy as np
from PIL import Image

KEY = "test-key"
MODEL = "geopilot-tiny"


def stop_process(process: subprocess.Popen, grace_s: float = 20) -> None:
    """Terminate a server process; kill it if it has not exited within `grace_s`."""
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def serving(app):
    """Run `app` with uvicorn on 127.0.0.1:<free port>; yields the base URL."""
    import uvicorn

    # a gradio_client keeps a heartbeat stream open: stop waiting for it after a second
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
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


# The one client-run tool most tests offer, in the OpenAI `tools` format.
DETECT = {
    "type": "function",
    "function": {
        "name": "detect_objects",
        "description": "finds objects",
        "parameters": {"type": "object", "properties": {"categories": {"type": "array"}}},
    },
}


def client_tool(name: str, description: str = "a client tool", parameters: dict | None = None) -> dict:
    """A client-run tool in the OpenAI `tools` format."""
    function = {"name": name, "description": description, "parameters": parameters or {"type": "object"}}
    return {"type": "function", "function": function}


def nested_schema(levels: int) -> dict:
    """An object schema whose properties nest `levels` objects deep (two JSON levels per object)."""
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"inner": schema}}
    return schema


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
