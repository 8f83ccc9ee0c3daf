"""GeoPilot's OpenAI-compatible API (FastAPI): `POST /v1/chat/completions` (streaming and not), `GET /v1/models`,
`GET /health` (no key) and the web demo at `GET /demo`.

    app = create_app(pilot, ServeConfig(model_name="geopilot", api_key="KEY"))   # uvicorn.run(app, ...)

A request is one conversation with exactly one image (`image_url`: a `data:image/...;base64,` URL, or an http(s)
URL on the allowlist). Without `tools` GeoPilot runs its own tools: the reply's message content is the answer; the
extension field `geopilot` carries the tool calls in OpenAI's `tool_calls` shape and the whole `ChatResult` (turns,
tool outputs, timings), plus, when the request asks with `"geopilot": {"visualize": true}`, the image with the tool
outputs drawn as a PNG data URL. With `tools` the client runs them (`geopilot.serving.protocol`): the plan comes
back as `message.tool_calls` (`finish_reason: "tool_calls"`) and the request with the `role: "tool"` results gets
the answer. Earlier turns become `history`; a first system message replaces the Vicuna system prompt; `stop`
sequences cut the answer text; every other field works or is refused naming it. Errors are
OpenAI-shaped JSON: 400 bad input, 401 no/wrong key, 403 cross-site, 404 unknown model, 413 too big, 415 not JSON,
421 a Host a keyless server does not answer to, 503 full (retry), 504 timed out. A request's timeout covers all of
it: fetching its image URL, waiting in the queue and generating; a request that runs out of time is cancelled.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import ClientDisconnect

from geopilot.errors import clipped
from geopilot.network import BrowserGate, answered_host_names, key_matches
from geopilot.serving import web_login
from geopilot.serving.batcher import Batcher, Job
from geopilot.serving.chat_request import (
    conversation_request,
    generation_options,
    image_sources,
    parse_body,
    pick,
)
from geopilot.serving.config import ServeConfig
from geopilot.serving.jobs import admit, geojson_of, job_error
from geopilot.serving.protocol import (
    ChatCompletionRequest,
    tool_call_entries,
)
from geopilot.serving.scheduler import make_batcher
from geopilot.serving.security import (
    BodyLimit,
    ServeError,
    UrlPolicy,
)
from geopilot.serving.stops import StopFilter, cut

log = logging.getLogger("geopilot.serving")
OPEN_PATHS = {"/health"}


class AuthGate:
    """ASGI middleware: every path but /health needs the key (401 with a Basic challenge for browsers)."""

    def __init__(self, app, key: str | None):
        self.app, self.key = app, key

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or self.key is None or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        header = headers.get(b"authorization")
        demo = web_login.is_demo(scope["path"])
        if key_matches(header.decode("latin-1") if header else None, self.key) or (
            demo and web_login.same_key(web_login.cookie_key(headers), self.key)
        ):
            return await self.app(scope, receive, web_login.framing_refused(send) if demo else send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        if demo:  # a browser passes the key once: the login form or `?key=` becomes a cookie
            given, rest = web_login.query_key(scope.get("query_string", b""))
            if web_login.same_key(given, self.key):
                return await web_login.redirect_with_cookie(send, scope["path"], rest, given)
            return await web_login.refuse(scope, send, "wrong API key" if given else "this demo needs the API key")
        payload = json.dumps(ServeError(401, "missing or wrong API key", "authentication_error").body()).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"www-authenticate", b'Basic realm="GeoPilot", charset="UTF-8"'),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def create_app(
    pilot, config: ServeConfig, batcher: Batcher | None = None, tools_line: str | None = None, examples=None
):
    """The FastAPI app serving `pilot` (a GeoPilot, or the endpoint-backed one) under `config`'s limits, with the
    web demo (geopilot.serving.web) at /demo: `tools_line` its tool status line, `examples` its example images."""
    batcher = batcher or make_batcher(pilot, config)
    policy = UrlPolicy(config.allowed_url_hosts, config.url_timeout_s, config.max_body_bytes)

    @asynccontextmanager
    async def lifespan(app):
        yield
        await policy.aclose()
        batcher.close()

    app = FastAPI(title="GeoPilot", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.batcher, app.state.config = batcher, config
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    app.add_middleware(AuthGate, key=config.api_key)
    # outermost: a keyless server answers only to loopback Host names (it may only bind loopback)
    app.add_middleware(
        BrowserGate, hosts=answered_host_names(config.host, config.api_key), form_paths=(web_login.DEMO_PATH,)
    )

    @app.exception_handler(ServeError)
    async def serve_error(request, err: ServeError):
        return JSONResponse(
            err.body(), status_code=err.status, headers={"retry-after": "1"} if err.status == 503 else None
        )

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": config.model_name, "in_progress": batcher.admitted}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(config.model_name)]}

    @app.get("/v1/models/{name}")
    async def model(name: str):
        if name != config.model_name:
            raise ServeError(404, f"model {clipped(repr(name))} does not exist", code="model_not_found")
        return _model_card(name)

    import gradio as gr

    from geopilot.serving.web import build_demo

    demo = build_demo(pilot, config, batcher, tools_line, examples)
    gr.mount_gradio_app(app, demo, path=web_login.DEMO_PATH, max_file_size=config.max_body_bytes, footer_links=["api"])

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        deadline = time.monotonic() + config.request_timeout_s  # everything below happens inside it
        try:
            raw = await request.body()
        except ClientDisconnect:
            log.warning("client %s left while sending its request body; nothing was done", _peer(request))
            raise ServeError(499, "client closed the request", code="client_gone") from None
        body = parse_body(raw, config.max_text_chars)
        if body.model != config.model_name:
            raise ServeError(
                404,
                f"model {clipped(repr(body.model))} does not exist; this server has {config.model_name!r}",
                code="model_not_found",
            )
        _check_budget(batcher, body)
        slot = admit(batcher)  # counted (and /health shows it) from here: fetching an image URL is work too
        try:
            images = await image_sources(body, policy, deadline, config.max_images)
            conversation = await asyncio.to_thread(conversation_request, body, images, config, pilot)
            job = Job(
                conversation,
                generation_options(body, config),
                min(pick(body.geopilot.max_rounds, config.max_rounds), config.max_rounds),
                slot=slot,
            )
            started = time.time()
            if body.stream:
                return _stream(request, job, body, config, batcher, started, deadline)
            batcher.submit(job)
            result = await _wait(request, job, batcher, deadline, config.request_timeout_s)
        except BaseException:
            slot.release()  # idempotent: a submitted job has given it back already
            raise
        return await _completion(result, job, body, config, started)

    return app


def _peer(request: Request) -> str:
    client = request.client
    return f"{client.host}:{client.port}" if client else "?"


def _model_card(name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "geopilot"}


def _check_budget(batcher: Batcher, body: ChatCompletionRequest) -> None:
    """400 for a max_tokens the step scheduler's KV budget could never hold (it is not silently cut to fit)."""
    budget = getattr(batcher, "kv_budget_tokens", None)
    asked = pick(body.max_completion_tokens, body.max_tokens)
    if budget is not None and asked is not None and asked > budget:
        raise ServeError(
            400,
            f"max_tokens={asked} exceeds the server's KV budget of {budget} tokens (--kv-budget-tokens)",
            code="bad_request",
        )


def _give_up(batcher: Batcher, job: Job, future: asyncio.Future) -> None:
    """Cancel the job; the batch still ends it (with ToolCancelled, usually), so its outcome is read when it comes:
    an unread asyncio future logs "Future exception was never retrieved" with a traceback."""
    batcher.cancel(job)
    future.add_done_callback(lambda done: None if done.cancelled() else done.exception())


async def _wait(request, job: Job, batcher: Batcher, deadline: float, timeout_s: float):
    """The job's ChatResult; cancels it when the client leaves or the request runs past `deadline`."""
    future = asyncio.wrap_future(job.future)
    while True:
        done, _ = await asyncio.wait({future}, timeout=max(0.01, min(0.2, deadline - time.monotonic())))
        if done:
            if future.exception() is not None:
                raise job_error(future.exception())
            return future.result()
        if await request.is_disconnected():
            _give_up(batcher, job, future)
            raise ServeError(499, "client closed the request", code="client_gone")
        if time.monotonic() > deadline:
            _give_up(batcher, job, future)
            raise ServeError(504, f"the request took longer than {timeout_s:g} s", "server_error", code="timeout")


def _tool_calls(result) -> list[dict]:
    return [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": call.tool, "arguments": json.dumps(call.params, ensure_ascii=False)},
        }
        for i, call in enumerate(result.tool_calls)
    ]


def _visualization(job: Job, result) -> str:
    from geopilot.visualize import draw_outputs

    drawn = draw_outputs(job.request["image"].image, [c.output for c in result.tool_calls if c.output is not None])
    buffer = io.BytesIO()
    drawn.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


async def _extension(result, job: Job, body: ChatCompletionRequest) -> dict:
    extension = {"tool_calls": _tool_calls(result), "result": result.model_dump(mode="json")}
    if geojson := geojson_of(result):
        extension["geojson"] = geojson
    if body.geopilot.visualize:
        extension["visualization"] = await asyncio.to_thread(_visualization, job, result)
    return extension


def _usage(result) -> dict:
    prompt, generated = result.tokens.input, result.tokens.generated
    return {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}


def _message(result, body: ChatCompletionRequest) -> tuple[dict, str]:
    """The reply's message and finish_reason: a client-run plan's calls, or the answer (cut at `stop`)."""
    if result.outcome == "tool_calls":
        plan = result.messages[-1]
        return {"role": "assistant", "content": plan.reasoning or None, "tool_calls": tool_call_entries(plan)}, (
            "tool_calls"
        )
    return {"role": "assistant", "content": cut(result.answer, body.stops())}, "stop"


async def _completion(result, job: Job, body: ChatCompletionRequest, config: ServeConfig, started: float) -> dict:
    message, finish = _message(result, body)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(started),
        "model": config.model_name,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": _usage(result),
        "geopilot": await _extension(result, job, body),
    }


def _stream(
    request,
    job: Job,
    body: ChatCompletionRequest,
    config: ServeConfig,
    batcher: Batcher,
    started: float,
    deadline: float,
):
    """SSE chunks: the role, the answer as it is decoded (or a client-run plan's reasoning, then each call as
    OpenAI's tool-call deltas: id, type and name first, then the arguments), then a last chunk with finish_reason,
    `usage` and `geopilot` (and, with `stream_options.include_usage`, a `choices: []` usage chunk)."""
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue = asyncio.Queue()
    end = object()
    job.on_text = lambda piece: loop.call_soon_threadsafe(pieces.put_nowait, piece)
    batcher.submit(job)
    job.future.add_done_callback(lambda _: loop.call_soon_threadsafe(pieces.put_nowait, end))
    ident = f"chatcmpl-{uuid.uuid4().hex}"

    def chunk(delta: dict, finish: str | None = None, **extra) -> str:
        data = {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": int(started),
            "model": config.model_name,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra,
        }
        return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"

    async def events():
        sent, stops = "", StopFilter(body.stops())
        try:
            yield chunk({"role": "assistant", "content": ""})
            while True:
                try:
                    item = await asyncio.wait_for(pieces.get(), max(0.0, deadline - time.monotonic()))
                except TimeoutError:
                    batcher.cancel(job)
                    error = ServeError(
                        504,
                        f"the request took longer than {config.request_timeout_s:g} s",
                        "server_error",
                        code="timeout",
                    )
                    yield f"data: {json.dumps(error.body())}\n\n"
                    return
                if item is end:
                    break
                if piece := stops.feed(item):
                    sent += piece
                    yield chunk({"content": piece})
            if job.future.exception() is not None:
                yield f"data: {json.dumps(job_error(job.future.exception()).body())}\n\n"
                return
            result = job.future.result()
            message, finish = _message(result, body)
            answer = message["content"] or ""
            rest = answer[len(sent) :] if answer.startswith(sent) else ""
            if rest:
                yield chunk({"content": rest})
            for index, call in enumerate(message.get("tool_calls") or []):
                opening = {**call, "function": {"name": call["function"]["name"], "arguments": ""}}
                yield chunk({"tool_calls": [{"index": index, **opening}]})
                yield chunk(
                    {"tool_calls": [{"index": index, "function": {"arguments": call["function"]["arguments"]}}]}
                )
            yield chunk({}, finish, usage=_usage(result), geopilot=await _extension(result, job, body))
            if body.stream_options is not None and body.stream_options.include_usage:
                usage = {"id": ident, "object": "chat.completion.chunk", "created": int(started)}
                usage |= {"model": config.model_name, "choices": [], "usage": _usage(result)}
                yield f"data: {json.dumps(usage)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            if not job.future.done():  # the client left mid-stream: free the slot, stop decoding
                batcher.cancel(job)

    return StreamingResponse(events(), media_type="text/event-stream")
