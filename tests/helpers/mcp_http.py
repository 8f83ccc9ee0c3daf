"""`geopilot mcp --transport http` as a subprocess on a free local port, for the slow MCP tests (test_mcp.py,
test_mcp_probes.py), and the first request a streamable-HTTP MCP client sends."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MCP_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@contextmanager
def mcp_http_server(*args: str, timeout_s: float) -> Iterator[str]:
    """Start `geopilot mcp --transport http --port P ARGS...`, wait (up to `timeout_s`) until it accepts connections
    and yield its URL; the server is stopped on exit. A server that dies while starting fails with its stderr."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "geopilot.cli", "mcp", "--transport", "http", "--port", str(port), *args]
    server = subprocess.Popen(command, cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with socket.socket() as client_socket:
                if client_socket.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert server.poll() is None, server.stderr.read().decode()
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.terminate()
        server.wait(timeout=30)
