"""`geopilot mcp --transport http` on any loopback address checks the Host header (and an Origin), so a page whose
name was re-pointed at the loopback address (DNS rebinding) cannot drive the tools. The MCP SDK does this by itself
only for 127.0.0.1, localhost and ::1."""

from __future__ import annotations

import httpx
import pytest
from helpers.mcp_http import MCP_HEADERS, MCP_INITIALIZE
from helpers.serving import serving

from geopilot.cli import main


def _app(monkeypatch, host: str):
    """The ASGI app `geopilot mcp --transport http --host HOST` would serve (uvicorn.run intercepted)."""
    import uvicorn

    served = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: served.update(app=app, **kwargs))
    monkeypatch.delenv("GEOPILOT_API_KEY", raising=False)
    assert main(["mcp", "--transport", "http", "--host", host, "device=cpu"]) == 0
    return served["app"]


@pytest.mark.parametrize("bound", ["127.0.0.2", "127.0.0.1"])
def test_loopback_mcp_refuses_foreign_host_and_origin(monkeypatch, bound):
    app = _app(monkeypatch, bound)
    with serving(app) as url:
        port = url.rsplit(":", 1)[1]
        for host in (f"evil.example:{port}", "evil.example"):
            reply = httpx.post(url + "/mcp", json=MCP_INITIALIZE, headers={**MCP_HEADERS, "host": host}, timeout=30)
            assert reply.status_code == 421, (host, reply.status_code)
        foreign = {**MCP_HEADERS, "host": f"{bound}:{port}", "origin": "http://evil.example"}
        assert httpx.post(url + "/mcp", json=MCP_INITIALIZE, headers=foreign, timeout=30).status_code == 403
        for host in (f"{bound}:{port}", f"localhost:{port}", f"127.0.0.1:{port}"):
            reply = httpx.post(url + "/mcp", json=MCP_INITIALIZE, headers={**MCP_HEADERS, "host": host}, timeout=30)
            assert reply.status_code == 200, (host, reply.status_code, reply.text[:200])
