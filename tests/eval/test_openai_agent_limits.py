"""`geopilot eval --agent openai`: `--request-timeout` bounds the whole request (a server dripping a byte at a time never
trips a per-read timeout) and a reply over the size cap is refused before it is read whole."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from geopilot.eval.agents import InfraError, OpenAIAgent
from geopilot.tool_protocol import ToolRegistry

REPLY = json.dumps({"choices": [{"message": {"role": "assistant", "content": "fine"}}]}).encode()


class _Quiet(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass


@pytest.fixture
def endpoint():
    """mode -> base URL: "drip" sends the reply a byte every 0.2 s, "huge" a 64 MB body as fast as it can."""
    servers = []

    def make(mode: str) -> str:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("content-type", "application/json")
                size = len(REPLY) if mode == "drip" else 64 * 2**20
                self.send_header("content-length", str(size))
                self.end_headers()
                try:
                    if mode == "drip":
                        for index in range(len(REPLY)):
                            self.wfile.write(REPLY[index : index + 1])
                            self.wfile.flush()
                            time.sleep(0.2)
                    else:
                        block = b" " * 2**20
                        for _ in range(64):
                            self.wfile.write(block)
                except OSError:
                    pass

        server = _Quiet(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/v1"

    yield make
    for server in servers:
        server.shutdown()
        server.server_close()


def _agent(url: str, **kwargs) -> OpenAIAgent:
    return OpenAIAgent(url, "scripted", ToolRegistry([]), timeout_s=1.0, retries=0, **kwargs)


def test_timeout_bounds_the_whole_request(endpoint):
    agent = _agent(endpoint("drip"))
    started = time.monotonic()
    with pytest.raises(InfraError, match="timed out after 1 s"):
        agent._post({"model": "scripted", "messages": []})
    assert time.monotonic() - started < 2.0  # the drip alone would take len(REPLY) * 0.2 s, about 15 s


def test_a_huge_reply_is_refused_at_the_cap(endpoint):
    import resource

    agent = _agent(endpoint("huge"), max_response_bytes=4 * 2**20)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(InfraError, match="over 4,194,304 bytes"):
        agent._post({"model": "scripted", "messages": []})
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 48, grown_mb  # the 64 MB body was not read whole
