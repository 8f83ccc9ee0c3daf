"""A FastChat 0.2.36 model worker that runs the whole GeoPilot agent loop (plan, tools, answer) per request.

    python -m fastchat.serve.controller --host 127.0.0.1 --port 21001
    geopilot serve --model DIR --controller http://127.0.0.1:21001 --port 21002
    python -m fastchat.serve.openai_api_server --host 127.0.0.1 --port 8000 \\
        --controller-address http://127.0.0.1:21001 --api-keys KEY

`GeoPilotWorker` is a `fastchat.serve.base_model_worker.BaseModelWorker`: FastChat's own code registers it with
the controller, sends heartbeats and serves the protocol routes (`/worker_generate_stream`, `/worker_generate`,
`/worker_get_status`, `/count_token`, `/worker_get_conv_template`, `/model_details`) from its module `app`. Images
arrive as base64 (`params["images"]`, several in order: before, after); URLs and paths are refused, nothing is fetched. Requests go through the same
`Batcher` as GeoPilot's own API, so concurrent requests share one `chat_batch`.

Bad requests get FastChat's own error codes, never a 500: a body that is not a JSON object is HTTP 400 with
`error_code` 40001 (`WorkerBodies`, in front of FastChat's app); bad params (`WorkerParams`: no or non-string
prompt, `images: [5]`, temperature "hot", NaN top_p, max_new_tokens < 1) are 40001; a too-long prompt 40303; a
request past `--request-timeout` is cancelled and answered 50006 (FastChat's timeout code).

The worker hands FastChat a conversation template whose separators are ASCII control characters
(`SEP`, `SEP2`), so the prompt FastChat's API server builds splits back into turns exactly; the turns become a
GeoPilot request (image, question, history) and the answer is the generated text.

FastChat's worker protocol has no authentication (FastChat #3776, #3886): bind the worker and the controller to
loopback and expose only `openai_api_server` with `--api-keys`. FastChat 0.2.36's API server cannot stream under
pydantic 2 (its `.json(ensure_ascii=...)` calls; fixed upstream after the release, docs/serving.md); its
non-streaming path works, and this worker's `/worker_generate_stream` itself streams correctly.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

from fastchat.constants import ErrorCode
from fastchat.conversation import IMAGE_PLACEHOLDER_STR, Conversation, SeparatorStyle
from fastchat.serve.base_model_worker import BaseModelWorker
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from geopilot.errors import GeoPilotInputError, describe_validation_error
from geopilot.generation import GenerationOptions
from geopilot.network import BrowserGate, loopback_host_names
from geopilot.serving.batcher import Batcher, Busy, Job
from geopilot.serving.chat_request import MIN_TEMPERATURE, chat_request
from geopilot.serving.config import ServeConfig
from geopilot.serving.scheduler import make_batcher
from geopilot.serving.security import BodyLimit, ServeError, decode_base64_image, parse_json
from geopilot.serving.stops import cut

SEP, SEP2 = "\x1e", "\x1f"  # between a user turn and the next, after an assistant turn
ROLES = ("USER", "ASSISTANT")
_ERROR_CODES = {
    400: ErrorCode.VALIDATION_TYPE_ERROR,
    413: ErrorCode.PARAM_OUT_OF_RANGE,
    503: ErrorCode.ENGINE_OVERLOADED,
    504: ErrorCode.CONTROLLER_WORKER_TIMEOUT,
}
DEFAULT_CONTEXT = 4096  # only when the model's own config cannot be read (an endpoint pilot without a local dir)
BODY_ROUTES = {"/worker_generate_stream", "/worker_generate", "/worker_get_embeddings", "/count_token"}


class WorkerParams(BaseModel):
    """What this worker reads of the params FastChat's API server sends (the rest is allowed and ignored)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    prompt: StrictStr
    images: list[StrictStr] = []
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_new_tokens: int | None = Field(None, ge=1)
    stop: StrictStr | list[StrictStr] | None = None

    def stops(self) -> list[str]:
        return [s for s in ([self.stop] if isinstance(self.stop, str) else self.stop or []) if s]


def checked_params(params, max_text_chars: int) -> WorkerParams:
    if not isinstance(params, dict):
        raise ServeError(400, f"params must be a JSON object, got {type(params).__name__}")
    try:
        checked = WorkerParams.model_validate(params)
    except ValidationError as err:
        raise ServeError(400, describe_validation_error(err, source="params")) from None
    if len(checked.prompt) > max_text_chars:
        raise ServeError(
            400, f"the prompt has {len(checked.prompt):,} characters, over {max_text_chars:,}", code="long"
        )
    return checked


def context_length(pilot) -> int:
    """The model's context (max_position_embeddings of its text config): from the loaded model, or, for an
    endpoint-backed pilot, from the model directory's config.json."""
    config = getattr(getattr(pilot, "model", None), "config", None)
    if config is None and isinstance(getattr(pilot, "model", None), str):
        path = Path(pilot.model) / "config.json"
        try:
            config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        except (OSError, ValueError):
            config = None
    if isinstance(config, dict):
        text = config.get("text_config") or config
        value = text.get("max_position_embeddings")
    else:
        value = getattr(getattr(config, "text_config", config), "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else DEFAULT_CONTEXT


def geopilot_conversation() -> Conversation:
    return Conversation(
        name="geopilot",
        system_template="{system_message}",
        system_message="",
        roles=ROLES,
        sep_style=SeparatorStyle.ADD_COLON_TWO,
        sep=SEP,
        sep2=SEP2,
    )


def parse_prompt(prompt: str) -> list[tuple[str, str, int]]:
    """The prompt FastChat built with `geopilot_conversation()` -> `(role, text, images)` turns (`images`: how many
    image placeholders FastChat wrote into the turn), without the trailing empty assistant turn. 400 for a prompt in
    any other shape."""
    pieces = re.split(f"[{SEP}{SEP2}]", prompt)
    if len(pieces) < 3 or pieces[-1] != f"{ROLES[1]}:":
        raise ServeError(400, "the prompt is not in the worker's conversation format (ask the worker for its template)")
    turns = []
    for index, piece in enumerate(pieces[1:-1]):
        role = ROLES[index % 2]
        prefix = f"{role}: "
        if not piece.startswith(prefix):
            raise ServeError(400, f"turn {index} of the prompt should start with {prefix!r}")
        text = piece[len(prefix) :]
        turns.append(
            (
                "user" if role == ROLES[0] else "assistant",
                text.replace(IMAGE_PLACEHOLDER_STR, "").strip(),
                text.count(IMAGE_PLACEHOLDER_STR),
            )
        )
    return turns


class GeoPilotWorker(BaseModelWorker):
    """FastChat worker around a GeoPilot (or endpoint-backed) pilot; `serve()` registers and serves it."""

    def __init__(self, pilot, config: ServeConfig, controller_addr: str, worker_addr: str, batcher: Batcher):
        self.pilot, self.config, self.batcher = pilot, config, batcher
        super().__init__(
            controller_addr,
            worker_addr,
            uuid.uuid4().hex[:8],
            config.model_name,
            [config.model_name],
            config.max_concurrency,
            multimodal=True,
        )
        self.tokenizer = getattr(pilot, "tokenizer", None)
        self.context_len = context_length(pilot)

    def make_conv_template(self, conv_template: str | None = None, model_path: str | None = None) -> Conversation:
        return geopilot_conversation()

    def count_token(self, params):
        try:
            prompt = checked_params(params, 10**12).prompt
        except ServeError as err:
            return self._error(err)
        if self.tokenizer is None:  # an endpoint-backed pilot has no local tokenizer: a bound, not a count
            return {"count": len(prompt) // 4, "error_code": 0}
        return super().count_token({"prompt": prompt})

    def _job(self, params: dict) -> tuple[Job, list[str]]:
        checked = checked_params(params, self.config.max_text_chars)
        if not checked.images:
            raise ServeError(400, "a conversation needs an image, got none")
        if len(checked.images) > self.config.max_images:
            raise ServeError(400, f"{len(checked.images)} images, over this worker's limit of {self.config.max_images}")
        images = [decode_base64_image(image) for image in checked.images]  # in order: before, after
        request = chat_request(parse_prompt(checked.prompt), images, self.config.max_image_pixels)
        temperature = checked.temperature or 0.0
        sample = temperature >= MIN_TEMPERATURE
        options = GenerationOptions(
            max_new_tokens=min(checked.max_new_tokens or self.config.max_new_tokens, self.config.max_new_tokens),
            do_sample=sample,
            temperature=temperature if sample else 1.0,
            top_p=(checked.top_p or 1.0) if sample else 1.0,
        )
        return Job(request, options, self.config.max_rounds), checked.stops()

    def _error(self, err: BaseException) -> dict:
        if isinstance(err, Busy):
            err = ServeError(503, f"server busy: {err}")
        elif isinstance(err, GeoPilotInputError):
            err = ServeError(400, str(err))
        elif isinstance(err, TimeoutError):
            err = ServeError(504, f"the request took longer than {self.config.request_timeout_s:g} s")
        elif not isinstance(err, ServeError):
            err = ServeError(500, f"internal error ({type(err).__name__})")
        code = ErrorCode.CONTEXT_OVERFLOW if err.code == "long" else _ERROR_CODES.get(err.status)
        return {"text": str(err), "error_code": int(code or ErrorCode.INTERNAL_ERROR)}

    @staticmethod
    def _output(result, text: str | None = None, finish: str | None = "stop") -> dict:
        prompt, generated = result.tokens.input, result.tokens.generated
        return {
            "text": result.answer if text is None else text,
            "error_code": 0,
            "usage": {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated},
            "finish_reason": finish,
            "geopilot": result.model_dump(mode="json"),
        }

    def generate_gate(self, params: dict) -> dict:
        job = None
        try:
            job, stops = self._job(params)
            self.batcher.submit(job)
            result = job.future.result(timeout=self.config.request_timeout_s)
        except Exception as err:  # noqa: BLE001 - every failure is an error reply; the worker keeps serving
            if job is not None and not job.future.done():
                self.batcher.cancel(job)  # timed out: stop its work, free its slot
            return self._error(err)
        return self._output(result, cut(result.answer, stops))

    def generate_stream_gate(self, params: dict):
        """FastChat's stream: NUL-terminated JSON objects, each with the whole text so far."""
        import queue

        pieces: queue.Queue = queue.Queue()
        deadline = time.monotonic() + self.config.request_timeout_s
        try:
            job, stops = self._job(params)
            job.on_text = pieces.put
            self.batcher.submit(job)
        except Exception as err:  # noqa: BLE001
            yield json.dumps(self._error(err)).encode() + b"\0"
            return
        job.future.add_done_callback(lambda _: pieces.put(None))
        text, shown = "", ""
        try:
            while (piece := pieces.get(timeout=max(0.0, deadline - time.monotonic()))) is not None:
                text += piece
                if (now := cut(text, stops)) != shown:  # FastChat's stream: the whole text so far, each time
                    shown = now
                    yield json.dumps({"text": shown, "error_code": 0}).encode() + b"\0"
            if job.future.exception() is not None:
                yield json.dumps(self._error(job.future.exception())).encode() + b"\0"
                return
            result = job.future.result()
            yield json.dumps(self._output(result, cut(result.answer, stops))).encode() + b"\0"
        except queue.Empty:
            self.batcher.cancel(job)
            yield json.dumps(self._error(TimeoutError())).encode() + b"\0"
        finally:
            if not job.future.done():
                self.batcher.cancel(job)


def serve_worker(pilot, config: ServeConfig, controller: str, host: str, port: int) -> None:
    """Register with the controller, heartbeat, and serve FastChat's worker app on host:port (blocks)."""
    import uvicorn
    from fastchat.serve import base_model_worker

    batcher = make_batcher(pilot, config)
    worker = GeoPilotWorker(pilot, config, controller.rstrip("/"), f"http://{host}:{port}", batcher)
    worker.init_heart_beat()
    try:
        uvicorn.run(worker_app(base_model_worker.app, config), host=host, port=port, log_level="warning")
    finally:
        batcher.close()


def worker_app(app, config: ServeConfig):
    """FastChat's worker app behind `WorkerBodies`, behind the body limit (so what it reads is bounded), behind
    BrowserGate: the worker checks no key, so it answers only to its bind address and the loopback names (the
    controller reaches it by the address it registered; a DNS-rebound page gets 421)."""
    return BrowserGate(BodyLimit(WorkerBodies(app), config.max_body_bytes), loopback_host_names(config.host))


class WorkerBodies:
    """ASGI middleware: the routes FastChat reads params from get a JSON object or HTTP 400 with FastChat's 40001
    (FastChat's own `await request.json()` would answer bad JSON with a 500). The body is read here and replayed."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] not in BODY_ROUTES:
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        try:
            params = parse_json(raw, "the params")
            if not isinstance(params, dict):
                raise ServeError(400, f"the params must be a JSON object, got {type(params).__name__}")
        except ServeError as err:
            payload = json.dumps({"text": str(err), "error_code": int(ErrorCode.VALIDATION_TYPE_ERROR)}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
            await send({"type": "http.response.start", "status": 400, "headers": headers})
            await send({"type": "http.response.body", "body": payload})
            return
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": raw, "more_body": False}

        await self.app(scope, replay, send)
