"""Issue 37 items 6 and 7 over `geopilot indicators serve` (and the indicator tools over `geopilot mcp --transport
http --catalog`): a keyless server answers only to loopback Host names (421 otherwise, as `geopilot serve` does:
one BrowserGate), refuses cross-site Origins and non-JSON bodies, and hostile bodies are 4xx in bounded time and
memory, quoting at most 200 characters of the input. The apps are the ones the commands build (uvicorn.run
intercepted), served on a loopback port; the Host header is what a DNS-rebound page would send."""

from __future__ import annotations

import json

import httpx
import pytest
from helpers.bounded import ServerLog, assert_bounded, assert_one_line, measured
from helpers.mcp_http import MCP_HEADERS, MCP_INITIALIZE
from helpers.serving import serving

from geopilot.cli import main

pytest.importorskip("rasterio")
pytest.importorskip("shapely")
pytest.importorskip("pyogrio")

FOREIGN = ("evil.example", "evil.example:{port}", "127.0.0.1.evil.example:{port}", "localhost.:{port}")


@pytest.fixture(scope="module")
def catalog(tmp_path_factory) -> str:
    from geopilot.data_gen.synthetic.region import synth_region

    out = tmp_path_factory.mktemp("region")
    synth_region(out)
    return str(out / "catalog.yaml")


def built_app(monkeypatch, argv: list[str]):
    """The ASGI app `geopilot ARGV` would serve."""
    import uvicorn

    served = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: served.update(app=app, **kwargs))
    monkeypatch.delenv("GEOPILOT_API_KEY", raising=False)
    assert main(argv) == 0
    return served["app"]


def indicators(monkeypatch, catalog: str, *extra: str):
    return built_app(monkeypatch, ["indicators", "serve", "--catalog", catalog, *extra])


def assert_refused(reply: httpx.Response, status: int, code: str) -> None:
    assert reply.status_code == status, (reply.status_code, reply.text[:300])
    error = reply.json()["error"]
    assert error["code"] == code and reply.headers["x-content-type-options"] == "nosniff", error
    assert_one_line(code, error["message"])


@pytest.mark.parametrize("bound", ["127.0.0.1", "127.0.0.2", "localhost"])
def test_a_keyless_indicator_server_answers_only_to_loopback_host_names(monkeypatch, catalog, bound):
    with serving(indicators(monkeypatch, catalog, "--host", bound)) as url:
        port = url.rsplit(":", 1)[1]
        for host in FOREIGN:
            host = host.format(port=port)
            assert_refused(httpx.get(url + "/tools", headers={"host": host}), 421, "bad_host")
            assert_refused(httpx.get(url + "/health", headers={"host": host}), 421, "bad_host")
            assert_refused(httpx.post(url + "/tools/list_layers", json={}, headers={"host": host}), 421, "bad_host")
        for host in (f"{bound}:{port}", f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", bound):
            reply = httpx.post(url + "/tools/list_layers", json={}, headers={"host": host})
            assert reply.status_code == 200, (host, reply.status_code, reply.text[:200])


def test_cross_site_origins_and_non_json_bodies_are_refused(monkeypatch, catalog):
    with serving(indicators(monkeypatch, catalog)) as url:
        host = url.removeprefix("http://")
        refused = httpx.post(url + "/tools/list_layers", json={}, headers={"origin": "http://evil.example"})
        assert_refused(refused, 403, "cross_origin")
        assert_refused(httpx.post(url + "/tools/list_layers", json={}, headers={"origin": "null"}), 403, "cross_origin")
        for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            reply = httpx.post(url + "/tools/list_layers", content=b"{}", headers={"content-type": content_type})
            assert_refused(reply, 415, "unsupported_media_type")
        same = httpx.post(url + "/tools/list_layers", json={}, headers={"origin": f"http://{host}"})
        assert same.status_code == 200, same.text


def test_a_missing_artefact_is_a_404_quoting_at_most_200_characters(monkeypatch, catalog):
    with serving(indicators(monkeypatch, catalog)) as url:
        reply = httpx.get(url + "/artifacts/" + "c" * 8000)
        assert reply.status_code == 404 and "c" * 201 not in reply.text and len(reply.text) < 1000, reply.text[:300]


def test_with_a_key_any_host_is_answered_but_only_with_the_key(monkeypatch, catalog):
    app = indicators(monkeypatch, catalog, "--host", "0.0.0.0", "--api-key", "s3cret")
    with serving(app) as url:
        keyed = {"host": "indicators.example.org", "authorization": "Bearer s3cret"}
        assert httpx.post(url + "/tools/list_layers", json={}, headers=keyed).status_code == 200
        assert httpx.post(url + "/tools/list_layers", json={}, headers={"host": "x.example"}).status_code == 401


def test_the_indicator_tools_over_mcp_http_answer_only_to_loopback_host_names(monkeypatch, catalog):
    app = built_app(monkeypatch, ["mcp", "--transport", "http", "--catalog", catalog, "--host", "127.0.0.3"])
    with serving(app) as url:
        port = url.rsplit(":", 1)[1]
        for host in FOREIGN:
            reply = httpx.post(
                url + "/mcp", json=MCP_INITIALIZE, headers={**MCP_HEADERS, "host": host.format(port=port)}
            )
            assert_refused(reply, 421, "bad_host")
        reply = httpx.post(url + "/mcp", json=MCP_INITIALIZE, headers={**MCP_HEADERS, "host": f"127.0.0.3:{port}"})
        assert reply.status_code == 200, reply.text[:300]


BODIES = {
    "JSON 5000 levels deep": (b'{"a":' * 5000 + b"1" + b"}" * 5000, 400),
    "an array 100,000 levels deep": (b"[" * 100_000 + b"]" * 100_000, 400),
    "a 5,000-digit number": (b'{"layer": ' + b"9" * 5000 + b"}", 400),
    "NaN": (b'{"layer": "land_cover", "area": "Evora", "level": "municipality", "threshold": NaN}', 422),
    "a 900,000-character key": (json.dumps({"k" * 900_000: 1}).encode(), 422),
    "a 900,000-character area": (
        json.dumps({"layer": "land_cover", "area": "a" * 900_000, "level": "municipality"}).encode(),
        422,
    ),
    "a 5 MB body": (json.dumps({"layer": "x" * 5_000_000}).encode(), 413),
    "not JSON": (b"{{{", 422),
}


@pytest.mark.parametrize("case", list(BODIES))
def test_hostile_bodies_are_4xx_quoting_little_within_bounds(monkeypatch, catalog, case):
    raw, status = BODIES[case]
    with serving(indicators(monkeypatch, catalog)) as url, ServerLog() as log:
        result = measured(
            lambda: httpx.post(
                url + "/tools/analyse_area", content=raw, headers={"content-type": "application/json"}, timeout=60
            )
        )
        reply = result.value
        assert reply.status_code == status, (case, reply.status_code, reply.text[:300])
        assert len(reply.text) < 5000 and "\n" not in reply.text, (case, reply.text[:300])
        assert not any(c * 201 in reply.text for c in "kax9"), (case, reply.text[:300])
        assert_bounded(case, result)
        assert httpx.post(url + "/tools/list_layers", json={}).status_code == 200
        assert log.tracebacks() == [], case
