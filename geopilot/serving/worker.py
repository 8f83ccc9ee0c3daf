"""A FastChat 0.2.36 model worker that runs the whole GeoPilot agent loop (plan, tools, answer) per request.

    python -m fastchat.serve.controller --host 127.0.0.1 --port 21001
    geopilot serve --model DIR --controller http://127.0.0.1:21001 --port 21002
    python -m fastchat.serve.openai_api_server --host 127.0.0.1 --port 8000 \\
        --controller-address http://127.0.0.1:21001 --api-keys KEY

`GeoPilotWorker` is a `fastchat.serve.base_model_worker.BaseModelWorker`: FastChat's own code registers it with
the controller, sends heartbeats and serves the protocol routes (`/worker_generate_stream`, `/worker_generate`,
`/worker_get_status`, `/count_token`, `/worker_get_conv_template`, `/model_details`) from its module `app`. Images
arrive as base64 (`params["images"]`); URLs and paths are refused, nothing is fetched. Requests go through the same
`Batcher` as GeoPilot's own API, so concurrent requests share one `chat_batch`.

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
import uuid

from fastchat.constants import ErrorCode
from fastchat.conversation import IMAGE_PLACEHOLDER_STR, Conversation, SeparatorStyle
from fastchat.serve.base_model_worker import BaseModelWorker

from geopilot.errors import GeoPilotInputError
from geopilot.generation import GenerationOptions
from geopilot.serving.api import chat_request
from geopilot.serving.batcher import Batcher, Busy, Job
from geopilot.serving.config import ServeConfig
from geopilot.serving.security import ServeError, decode_base64_image

SEP, SEP2 = "\x1e", "\x1f"  # between a user turn and the next, after an assistant turn
ROLES = ("USER", "ASSISTANT")
_ERROR_CODES = {
    400: ErrorCode.VALIDATION_TYPE_ERROR,
    413: ErrorCode.PARAM_OUT_OF_RANGE,
    503: ErrorCode.ENGINE_OVERLOADED,
}


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


def parse_prompt(prompt: str) -> list[tuple[str, str, bool]]:
    """The prompt FastChat built with `geopilot_conversation()` -> `(role, text, has_image)` turns, without the
    trailing empty assistant turn. 400 for a prompt in any other shape."""
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
                IMAGE_PLACEHOLDER_STR in text,
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
        self.context_len = getattr(pilot, "context_length", None) or 4096

    def make_conv_template(self, conv_template: str | None = None, model_path: str | None = None) -> Conversation:
        return geopilot_conversation()

    def count_token(self, params):
        if self.tokenizer is None:  # an endpoint-backed pilot has no local tokenizer: a bound, not a count
            return {"count": len(params["prompt"]) // 4, "error_code": 0}
        return super().count_token(params)

    def _job(self, params: dict) -> Job:
        images = params.get("images") or []
        if len(images) != 1:
            raise ServeError(400, f"a conversation needs exactly one image, got {len(images)}")
        request = chat_request(
            parse_prompt(params["prompt"]), decode_base64_image(images[0]), self.config.max_image_pixels
        )
        temperature = float(params.get("temperature") or 0.0)
        options = GenerationOptions(
            max_new_tokens=min(
                int(params.get("max_new_tokens") or self.config.max_new_tokens), self.config.max_new_tokens
            ),
            do_sample=temperature > 1e-5,
            temperature=temperature if temperature > 1e-5 else 1.0,
            top_p=float(params.get("top_p") or 1.0) if temperature > 1e-5 else 1.0,
        )
        return Job(request, options, self.config.max_rounds)

    def _error(self, err: BaseException) -> dict:
        if isinstance(err, Busy):
            err = ServeError(503, f"server busy: {err}")
        elif isinstance(err, GeoPilotInputError):
            err = ServeError(400, str(err))
        elif not isinstance(err, ServeError):
            err = ServeError(500, f"internal error ({type(err).__name__})")
        return {"text": str(err), "error_code": int(_ERROR_CODES.get(err.status, ErrorCode.INTERNAL_ERROR))}

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
        try:
            job = self._job(params)
            self.batcher.submit(job)
            result = job.future.result(timeout=self.config.request_timeout_s)
        except Exception as err:  # noqa: BLE001 - every failure is an error reply; the worker keeps serving
            return self._error(err)
        return self._output(result)

    def generate_stream_gate(self, params: dict):
        """FastChat's stream: NUL-terminated JSON objects, each with the whole text so far."""
        import queue

        pieces: queue.Queue = queue.Queue()
        try:
            job = self._job(params)
            job.on_text = pieces.put
            self.batcher.submit(job)
        except Exception as err:  # noqa: BLE001
            yield json.dumps(self._error(err)).encode() + b"\0"
            return
        job.future.add_done_callback(lambda _: pieces.put(None))
        text = ""
        try:
            while (piece := pieces.get(timeout=self.config.request_timeout_s)) is not None:
                text += piece
                yield json.dumps({"text": text, "error_code": 0}).encode() + b"\0"
            if job.future.exception() is not None:
                yield json.dumps(self._error(job.future.exception())).encode() + b"\0"
                return
            yield json.dumps(self._output(job.future.result())).encode() + b"\0"
        except queue.Empty:
            yield json.dumps(self._error(ServeError(500, "the request timed out"))).encode() + b"\0"
        finally:
            if not job.future.done():
                self.batcher.cancel(job)


def serve_worker(pilot, config: ServeConfig, controller: str, host: str, port: int) -> None:
    """Register with the controller, heartbeat, and serve FastChat's worker app on host:port (blocks)."""
    import uvicorn
    from fastchat.serve import base_model_worker

    batcher = Batcher(pilot, config.max_batch, config.batch_wait_ms / 1000, config.max_concurrency)
    worker = GeoPilotWorker(pilot, config, controller.rstrip("/"), f"http://{host}:{port}", batcher)
    worker.init_heart_beat()
    try:
        uvicorn.run(base_model_worker.app, host=host, port=port, log_level="warning")
    finally:
        batcher.close()
