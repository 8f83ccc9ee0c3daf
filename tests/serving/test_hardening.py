"""Issue 22, items 2, 3 and 8 over GeoPilot's own API: deadlines that hold (image URLs, long generations, long
questions), 400 never 500 for hostile bodies, and the browser-facing defaults (Host, Origin, Content-Type, the
demo's headers, a client that leaves mid-body, `stop`)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import httpx
import pytest
from helpers.serving import KEY, MODEL, image_host, image_message, serving

AUTH = {"authorization": f"Bearer {KEY}"}


def _post(url, body=None, raw=None, headers=None, timeout=30):
    headers = {**AUTH, **(headers or {})}
    if raw is not None:
        return httpx.post(url + "/v1/chat/completions", content=raw, headers=headers, timeout=timeout)
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=timeout)


def _ok(url):
    return _post(url, {"model": MODEL, "messages": image_message("what is this?")})


# -- item 2: deadlines -----------------------------------------------------------------------------------------------


def test_a_slow_drip_image_url_is_cut_at_the_fetch_deadline_and_the_request_deadline(server):
    """One byte every 0.3 s never trips a per-read timeout; the whole fetch has one deadline: `url_timeout_s`
    (400), or the request's own timeout when that comes first (504)."""
    with image_host(drip_interval_s=0.3) as host:
        for config, status, bound in (
            ({"url_timeout_s": 1.0, "request_timeout_s": 30.0}, 400, 1.0),
            ({"url_timeout_s": 10.0, "request_timeout_s": 1.5}, 504, 1.5),
        ):
            url, _ = server(allowed_url_hosts=["127.0.0.1"], **config)
            started = time.monotonic()
            reply = _post(url, {"model": MODEL, "messages": image_message("hi", host + "/drip")})
            took = time.monotonic() - started
            assert reply.status_code == status, reply.text
            assert took < bound + 1.0, took
            assert _post(url, {"model": MODEL, "messages": image_message("what?", host + "/ok.png")}).status_code == 200


def test_slow_drips_hold_no_thread_and_count_in_health(server):
    """Eight drips at once (more than the default thread pool of 6 on 2 cores): /health counts them as in
    progress, and an ordinary request still answers at once."""
    url, app = server(allowed_url_hosts=["127.0.0.1"], url_timeout_s=6.0)
    with image_host(drip_interval_s=0.5) as host:
        drips = [
            threading.Thread(
                target=_post, args=(url, {"model": MODEL, "messages": image_message("hi", host + "/drip")})
            )
            for _ in range(8)
        ]
        for thread in drips:
            thread.start()
        deadline = time.monotonic() + 5
        while httpx.get(url + "/health", timeout=5).json()["in_progress"] < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert httpx.get(url + "/health", timeout=5).json()["in_progress"] == 8
        started = time.monotonic()
        assert _ok(url).status_code == 200
        assert time.monotonic() - started < 1.5
        for thread in drips:
            thread.join(timeout=30)
    assert app.state.batcher.admitted == 0


def test_a_timed_out_request_stops_its_work(server):
    """A 5 s generation answered 504 at 2 s stops there: a request queued behind it (sent at 1.5 s, so it has
    until 3.5 s) gets its answer instead of timing out too."""
    url, app = server(delay_s=0.05, request_timeout_s=2.0, max_batch=1)
    results = []
    long = threading.Thread(
        target=lambda: results.append(_post(url, {"model": MODEL, "messages": image_message("LONG?")}))
    )
    long.start()
    time.sleep(1.5)
    behind = _ok(url)
    long.join(timeout=30)
    assert results[0].status_code == 504
    assert behind.status_code == 200, behind.text
    assert app.state.batcher.admitted == 0


def test_a_fifteen_megabyte_question_is_refused_by_length_before_tokenising(server):
    url, _ = server()
    started = time.monotonic()
    reply = _post(url, {"model": MODEL, "messages": image_message("x" * 15_000_000)})
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "context_length_exceeded", reply.text
    assert time.monotonic() - started < 2.0
    assert _ok(url).status_code == 200


# -- item 3: 400, never 500 ------------------------------------------------------------------------------------------


def test_hostile_json_bodies_are_400(server):
    url, _ = server()
    valid = json.dumps({"model": MODEL, "messages": image_message("what?")})
    cases = {
        "100k deep array": b"[" * 100_000 + b"]" * 100_000,
        "5k deep object": b'{"a":' * 5000 + b"1" + b"}" * 5000,
        "5000-digit max_tokens": valid[:-1].encode() + b', "max_tokens": ' + b"9" * 5000 + b"}",
        "5000-digit extra field": valid[:-1].encode() + b', "seed": ' + b"7" * 5000 + b"}",
        "NaN temperature": valid[:-1].encode() + b', "temperature": NaN}',
        "Infinity top_p": valid[:-1].encode() + b', "top_p": Infinity}',
        "not UTF-8": b'{"model": "\xff\xfe"}',
        "deep extra field": valid[:-1].encode() + b', "user": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    }
    for name, raw in cases.items():
        reply = _post(url, raw=raw, headers={"content-type": "application/json"})
        assert reply.status_code == 400, (name, reply.status_code, reply.text[:200])
        assert "\n" not in reply.json()["error"]["message"], name
    assert _ok(url).status_code == 200


@pytest.mark.parametrize(
    "image_url",
    [
        "http://[::1/x.png",
        "http://127.0.0.1:99999/x.png",
        "http://127.0.0.1:abc/x.png",
        "http://127.0.0.1/a\r\nHost: evil.example",
        "http://127.0.0.1/a\x00b",
        "http://127.0.0.1/\tx.png",
        "http://127.0.0.1 /x.png",
    ],
)
def test_unparsable_image_urls_are_400(server, image_url):
    url, _ = server(allowed_url_hosts=["127.0.0.1", "::1"])
    reply = _post(url, {"model": MODEL, "messages": image_message("hi", image_url)})
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "bad_image_url", reply.text


def test_temperature_1e_300_is_greedy_not_a_500(tiny):
    """A real KVSession: dividing the logits by 1e-300 gives inf/nan probabilities; below 1e-5 means greedy."""
    from geopilot.agent import GeoPilot
    from geopilot.serving.api import create_app
    from geopilot.serving.config import ServeConfig
    from geopilot.tool_protocol import ToolRegistry

    pilot = GeoPilot(tiny[0], tiny[1], ToolRegistry([]))
    app = create_app(pilot, ServeConfig(model_name=MODEL, api_key=KEY, max_new_tokens=24))
    with serving(app) as url:  # 24: room for the shortest plan (18 tokens of the tiny vocabulary)
        body = {"model": MODEL, "messages": image_message("what is this?"), "max_tokens": 24}
        tiny_t = _post(url, {**body, "temperature": 1e-300})
        greedy = _post(url, {**body, "temperature": 0})
    assert tiny_t.status_code == 200, tiny_t.text
    assert tiny_t.json()["choices"][0]["message"] == greedy.json()["choices"][0]["message"]


# -- item 8: browser-facing defaults ---------------------------------------------------------------------------------


def test_a_keyless_loopback_server_answers_only_to_loopback_host_names(server):
    """DNS rebinding: the attacker's page, re-pointed at 127.0.0.1, sends its own name as Host."""
    url, _ = server(api_key=None)
    port = url.rsplit(":", 1)[1]
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.nip.io:{port}"):
        reply = _post(url, {"model": MODEL, "messages": image_message("what?")}, headers={"host": host})
        assert reply.status_code == 421, (host, reply.status_code)
        assert httpx.get(url + "/v1/models", headers={"host": host}, timeout=10).status_code == 421
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost"):
        assert httpx.get(url + "/v1/models", headers={"host": host}, timeout=10).status_code == 200, host
    assert _post(url, {"model": MODEL, "messages": image_message("what?")}).status_code == 200


def test_with_a_key_cross_site_origins_and_non_json_bodies_are_refused(server):
    """A browser holding the key (HTTP Basic for /demo) can be made to POST cross-site without a preflight only
    as text/plain or a form; both are refused, and so is any foreign Origin."""
    url, _ = server()
    body = json.dumps({"model": MODEL, "messages": image_message("what?")}).encode()
    for content_type in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded"):
        reply = _post(url, raw=body, headers={"content-type": content_type})
        assert reply.status_code == 415, (content_type, reply.status_code)
    for origin in ("https://evil.example", "null", "http://127.0.0.1:1"):
        reply = _post(url, raw=body, headers={"content-type": "application/json", "origin": origin})
        assert reply.status_code == 403, (origin, reply.status_code)
    same = _post(url, raw=body, headers={"content-type": "application/json", "origin": url})
    assert same.status_code == 200 and same.headers["x-content-type-options"] == "nosniff"


def test_demo_sends_frame_and_sniffing_headers(server):
    url, _ = server()
    reply = httpx.get(url + "/demo/", headers=AUTH, timeout=10)
    assert reply.status_code == 200
    assert reply.headers["x-frame-options"] == "DENY" and reply.headers["x-content-type-options"] == "nosniff"
    assert reply.headers["referrer-policy"] == "no-referrer"


def test_a_client_leaving_mid_body_is_one_log_line(server):
    url, app = server()
    port = int(url.rsplit(":", 1)[1])
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep(level=logging.DEBUG)
    loggers = [logging.getLogger(name) for name in ("uvicorn.error", "geopilot.serving")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {KEY}\r\n"
            sock.sendall((head + "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n").encode())
            sock.sendall(b'{"model": "' + b"x" * 1000)
            time.sleep(0.3)
        deadline = time.monotonic() + 5
        while not records and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    assert [r.name for r in records] == ["geopilot.serving"], [(r.name, r.getMessage()) for r in records]
    [record] = records
    assert record.exc_info is None and "\n" not in record.getMessage() and "left" in record.getMessage()
    assert app.state.batcher.admitted == 0 and _ok(url).status_code == 200


def test_stop_sequences_cut_the_answer_streamed_or_not(server):
    url, _ = server(delay_s=0.02)
    body = {"model": MODEL, "messages": image_message("TOOL: how many planes?")}
    whole = _post(url, {**body, "stop": [" planes", "zzz"]})
    assert whole.json()["choices"][0]["message"]["content"] == "There are 2"
    assert _post(url, {**body, "stop": "There"}).json()["choices"][0]["message"]["content"] == ""
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json={**body, "stream": True, "stop": "2 pl"}, headers=AUTH, timeout=30
    ) as response:
        events = [json.loads(line[5:]) for line in response.iter_lines() if line.startswith("data: {")]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert text == "There are " and events[-1]["choices"][0]["finish_reason"] == "stop"
    for bad in (["a", "b", "c", "d", "e"], [""], 5):
        assert _post(url, {**body, "stop": bad}).status_code == 400, bad
