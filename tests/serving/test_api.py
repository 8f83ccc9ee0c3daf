"""GeoPilot's own OpenAI-compatible endpoint through the `openai` client: answers, streaming, the tool trace,
and the bad inputs that must get a clear 4xx/5xx while the server keeps serving."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from helpers.serving import KEY, MODEL, data_url, image_message, png_bytes


def _client(url):
    from openai import OpenAI

    return OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)


def test_openai_client_gets_the_answer_and_the_tool_trace(server):
    url, _ = server()
    client = _client(url)
    assert [m.id for m in client.models.list().data] == [MODEL]
    reply = client.chat.completions.create(model=MODEL, messages=image_message("TOOL: how many planes?"))
    assert reply.choices[0].message.content == "There are 2 planes."
    trace = reply.model_extra["geopilot"]
    assert trace["tool_calls"] == [
        {
            "id": "call_0",
            "type": "function",
            "function": {"name": "detect_objects", "arguments": json.dumps({"categories": ["plane"]})},
        }
    ]
    result = trace["result"]
    assert result["outcome"] == "tools" and [t["kind"] for t in result["turns"]] == ["think", "answer"]
    assert len(result["tool_calls"][0]["output"]["detections"]) == 2 and result["timings"]["total"] > 0
    direct = client.chat.completions.create(model=MODEL, messages=image_message("what is this?"))
    assert direct.choices[0].message.content == "A direct answer about the scene."
    assert direct.model_extra["geopilot"]["tool_calls"] == []


def test_openai_client_streams_the_answer_then_the_trace(server):
    url, _ = server(delay_s=0.01)
    stream = _client(url).chat.completions.create(
        model=MODEL, messages=image_message("TOOL: how many planes?"), stream=True
    )
    chunks = list(stream)
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 2 and "".join(pieces) == "There are 2 planes."
    last = chunks[-1]
    assert last.choices[0].finish_reason == "stop"
    assert last.model_extra["geopilot"]["tool_calls"][0]["function"]["name"] == "detect_objects"


def test_visualization_and_history(server):
    url, _ = server()
    messages = image_message("TOOL: how many planes?") + [
        {"role": "assistant", "content": "There are 2 planes."},
        {"role": "user", "content": "TOOL: and now?"},
    ]
    body = {"model": MODEL, "messages": messages, "geopilot": {"visualize": True}}
    reply = httpx.post(url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEY}"}, timeout=30)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["geopilot"]["visualization"].startswith("data:image/png;base64,")
    sent = data["geopilot"]["result"]["messages"]  # the history, then this exchange
    assert [m["role"] for m in sent] == ["user", "assistant", "user", "assistant", "tool", "assistant"]
    assert sent[0]["content"] == "<image>\nTOOL: how many planes?" and sent[1]["value"] == "There are 2 planes."
    assert sent[2]["content"] == "TOOL: and now?"


def _post(url, body=None, raw=None, key=KEY, **kwargs):
    headers = {"authorization": f"Bearer {key}"} if key else {}
    if raw is not None:
        return httpx.post(url + "/v1/chat/completions", content=raw, headers=headers, timeout=30, **kwargs)
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=30, **kwargs)


def test_every_route_but_health_needs_the_key(server):
    url, app = server()
    paths = {route.path.replace("{name}", MODEL) for route in app.routes} | {"/nope"}
    assert {"/health", "/v1/models", "/v1/chat/completions", "/demo"} <= paths
    for path in sorted(paths - {"/health"}):
        for method in ("GET", "POST"):
            for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Basic Og=="}):
                reply = httpx.request(method, url + path, headers=headers, timeout=10)
                assert reply.status_code == 401, (method, path, headers, reply.status_code)
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    basic = httpx.get(url + "/demo/", auth=("anyone", KEY), timeout=10)
    assert basic.status_code == 200 and "gradio" in basic.text.lower()


def test_size_limits_give_413(server):
    url, _ = server(max_body_bytes=2**20, max_image_pixels=100_000)
    big_body = {"model": MODEL, "messages": image_message("hi", data_url(b"A" * 3 * 2**20))}
    assert _post(url, big_body).status_code == 413
    chunked = _post(url, raw=iter([b"{" + b" " * 2**19] * 4))  # no Content-Length: cut while it streams
    assert chunked.status_code == 413
    big_image = _post(url, {"model": MODEL, "messages": image_message("hi", data_url(png_bytes(400, 300)))})
    assert big_image.status_code == 413 and "pixels" in big_image.json()["error"]["message"]
    assert _post(url, {"model": MODEL, "messages": image_message("what is this?")}).status_code == 200


def test_long_thin_and_pillow_bomb_images_are_413_at_once(server):
    """1 x 20000 (pads to 400 M pixels) and 15000 x 15000 (over Pillow's bomb limit): 413 image_too_large from the
    header, in well under a second, and the server keeps answering."""
    from helpers.images import header_png

    default_limit, _ = server()  # 40 M pixels: the thin images pad to 400 M
    huge_limit, _ = server(max_image_pixels=10**9)  # over ours, so Pillow's own bomb check must answer
    cases = [(default_limit, 1, 20000), (default_limit, 20000, 1), (huge_limit, 15000, 15000)]
    for url, width, height in cases:
        started = time.perf_counter()
        reply = _post(url, {"model": MODEL, "messages": image_message("hi", data_url(header_png(width, height)))})
        assert reply.status_code == 413 and reply.json()["error"]["code"] == "image_too_large", reply.text
        assert time.perf_counter() - started < 1.0
    for url in (default_limit, huge_limit):
        assert _post(url, {"model": MODEL, "messages": image_message("what is this?")}).status_code == 200


def test_fifty_megabytes_of_base64_is_refused(server):
    url, _ = server()
    reply = _post(url, {"model": MODEL, "messages": image_message("hi", "data:image/png;base64," + "A" * 50 * 2**20)})
    assert reply.status_code == 413
    assert _post(url, {"model": MODEL, "messages": image_message("what is this?")}).status_code == 200


@pytest.mark.parametrize(
    "image_url",
    [
        "http://127.0.0.1:8000/x.png",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/a.png",
        "http://[::1]/a.png",
        "http://localhost/a.png",
        "file:///etc/passwd",
    ],
)
def test_internal_urls_are_refused(server, image_url):
    url, _ = server()
    reply = _post(url, {"model": MODEL, "messages": image_message("hi", image_url)})
    assert reply.status_code == 400, reply.text


def test_url_allowed_only_when_listed_even_if_on_the_allowlist_by_name(server):
    import http.server

    image = png_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("content-type", "image/png")
            self.end_headers()
            self.wfile.write(image)

        def log_message(self, *args):
            pass

    images = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=images.serve_forever, daemon=True).start()
    try:
        where = f"http://127.0.0.1:{images.server_address[1]}/scene.png"
        by_name, _ = server(allowed_url_hosts=["localhost"])  # a name that resolves to loopback: still refused
        named = where.replace("127.0.0.1", "localhost")
        assert _post(by_name, {"model": MODEL, "messages": image_message("hi", named)}).status_code == 400
        listed, _ = server(allowed_url_hosts=["127.0.0.1"])
        assert _post(listed, {"model": MODEL, "messages": image_message("what?", where)}).status_code == 200
        assert (
            _post(listed, {"model": MODEL, "messages": image_message("hi", "http://169.254.169.254/")}).status_code
            == 400
        )
    finally:
        images.shutdown()


def test_bad_input_gets_a_clear_error_and_the_server_keeps_serving(server):
    url, _ = server()
    ok = {"model": MODEL, "messages": image_message("what is this?")}
    cases = {
        "malformed json": (_post(url, raw=b'{"model": "x", "messages": [}'), 400),
        "non-image data url": (
            _post(url, {"model": MODEL, "messages": image_message("hi", data_url(b"hello", "text/plain"))}),
            400,
        ),
        "not base64": (_post(url, {"model": MODEL, "messages": image_message("hi", "data:image/png;base64,@@@")}), 400),
        "not an image": (_post(url, {"model": MODEL, "messages": image_message("hi", data_url(b"GIF89a nope"))}), 400),
        "unknown model": (_post(url, {**ok, "model": "gpt-9"}), 404),
        "no image": (_post(url, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}), 400),
        "empty question": (_post(url, {"model": MODEL, "messages": image_message("  ")}), 400),
        "bad field": (_post(url, {**ok, "max_tokens": 0}), 400),
    }
    for name, (reply, status) in cases.items():
        assert reply.status_code == status, (name, reply.text)
        message = reply.json()["error"]["message"]
        assert message and "\n" not in message and "Traceback" not in message, name
    assert _post(url, ok).json()["choices"][0]["message"]["content"] == "A direct answer about the scene."


def test_a_hanging_tool_times_out_and_the_request_still_answers(server):
    url, _ = server(tool_timeout_s=0.5)
    reply = _post(url, {"model": MODEL, "messages": image_message("HANG: roads?")})
    assert reply.status_code == 200
    [call] = reply.json()["geopilot"]["result"]["tool_calls"]
    assert call["error_kind"] == "timeout"
    assert _post(url, {"model": MODEL, "messages": image_message("what is this?")}).status_code == 200


def test_request_timeout_is_504(server):
    url, _ = server(delay_s=1.5, request_timeout_s=0.5)
    reply = _post(url, {"model": MODEL, "messages": image_message("what is this?")})
    assert reply.status_code == 504


def test_a_job_given_up_on_logs_no_unretrieved_future(server, caplog):
    """The timed-out job still ends (cancelled between turns); its outcome is read, so asyncio logs no traceback."""
    import gc

    url, app = server(delay_s=1.0, request_timeout_s=0.3)
    assert _post(url, {"model": MODEL, "messages": image_message("TOOL: how many planes?")}).status_code == 504
    deadline = time.monotonic() + 10
    while app.state.batcher.admitted and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.5)  # the batch ends after its delay
    gc.collect()
    assert "never retrieved" not in caplog.text


def test_full_server_answers_503_and_a_client_that_leaves_frees_its_slot(server):
    url, app = server(delay_s=0.4, max_concurrency=1, max_batch=1)
    batcher = app.state.batcher
    body = {"model": MODEL, "messages": image_message("TOOL: how many planes?"), "stream": True}
    headers = {"authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=30) as streaming:
        assert streaming.status_code == 200
        lines = streaming.iter_lines()
        next(lines)  # the first chunk: the request holds the only slot
        assert batcher.admitted == 1
        busy = _post(url, {"model": MODEL, "messages": image_message("what is this?")})
        assert busy.status_code == 503 and busy.headers["retry-after"]
    # the client closed the stream mid-answer: its slot is free again
    deadline = time.monotonic() + 10
    while batcher.admitted and time.monotonic() < deadline:
        time.sleep(0.05)
    assert batcher.admitted == 0
    assert _post(url, {"model": MODEL, "messages": image_message("what is this?")}).status_code == 200
