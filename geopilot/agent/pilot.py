"""`GeoPilot`: a tool registry, an engine, and the one loop that drives `AgentLoop` over the engine's turns.

    pilot = GeoPilot.from_pretrained("runs/geopilot", device="cuda", dtype="bfloat16")   # LocalEngine
    pilot = GeoPilot.from_endpoint("http://127.0.0.1:8001/v1", "runs/geopilot/export")   # HttpEngine (vLLM)
    result = pilot.chat("scene.png", "How many planes are on the apron?")

Client-run tools (`client_tools=ClientTools(...)`, what `geopilot serve` does for a request with `tools`): the chat
ends as `tool_calls` with the plan in `messages[-1]`; the caller runs the calls and continues with `query=None`
and a history ending with their results (`ToolMessage`s). With a `PrefixCache` (in process) that request
continues from the think turn's KV cache instead of re-prefilling it.

The chat's deadline (`chat_timeout_s`), the context check before each turn, the tool-call limits and the guidance
for a missing tool extra are the same whichever engine generates. So is the plan grammar: every think turn (and its
repair) is decoded inside the plan the registry allows (`geopilot.agent.plan_schema`: a token mask in process,
`response_format` over HTTP); `constrain_plans=False` is the one switch that turns it off (ablations).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from geopilot.agent.client_tools import ClientTools
from geopilot.agent.engine import Engine, LocalEngine, SessionFactory, TurnDeadline, TurnSession
from geopilot.agent.loop import AgentLoop, take_all
from geopilot.agent.prefix_cache import PrefixCache
from geopilot.agent.requests import (
    DEFAULT_MAX_IMAGES,
    DEFAULT_MAX_TOOL_CALLS,
    ChatRequest,
    PreparedRequest,
    checked_options,
    checked_request,
    checked_rounds,
    last_question,
    to_chat_request,
)
from geopilot.agent.results import ChatResult
from geopilot.agent.streaming import AnswerStream
from geopilot.cancellation import CancelToken, current_token
from geopilot.errors import GeoPilotError, GeoPilotInputError
from geopilot.generation import AnswerExtractor, GenerationOptions
from geopilot.image import DEFAULT_MAX_PIXELS
from geopilot.sample import Modality
from geopilot.tool_protocol import ToolRegistry
from geopilot.wire import question_text

DEFAULT_CHAT_TIMEOUT_S = 600.0  # a whole chat: tool calls get at most what is left, no turn starts after it
MIN_TURN_TOKENS = 16  # a turn with less room than this in the context is not started: the chat ends instead


class GeoPilot:
    """A tool registry and an engine. `GeoPilot(model, processor)` runs the model here (`session_factory` swaps the
    KV session: tests, benchmarks); `GeoPilot(engine=...)` any other engine."""

    def __init__(
        self,
        model=None,
        processor=None,
        tools: ToolRegistry | None = None,
        *,
        engine: Engine | None = None,
        tools_config: str | Path | None = None,
        tool_timeout_s: float | None = None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        session_factory: SessionFactory | None = None,
        max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS,
        chat_timeout_s: float | None = DEFAULT_CHAT_TIMEOUT_S,
        prefix_cache: PrefixCache | None = None,
        constrain_plans: bool = True,
        max_images: int = DEFAULT_MAX_IMAGES,
    ):
        if (engine is None) == (model is None):
            raise GeoPilotInputError("GeoPilot needs a model and processor, or an engine (one of the two)")
        for name, value in (("tool_timeout_s", tool_timeout_s), ("chat_timeout_s", chat_timeout_s)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
                raise GeoPilotInputError(f"{name} must be a number of seconds > 0 (or None), got {value!r}")
        if isinstance(max_tool_calls, bool) or not isinstance(max_tool_calls, int) or max_tool_calls < 1:
            raise GeoPilotInputError(f"max_tool_calls must be a whole number >= 1, got {max_tool_calls!r}")
        if isinstance(max_images, bool) or not isinstance(max_images, int) or max_images < 1:
            raise GeoPilotInputError(f"max_images must be a whole number >= 1, got {max_images!r}")
        self.max_images = max_images
        self.engine = engine if engine is not None else LocalEngine(model, processor, session_factory, prefix_cache)
        self.model, self.processor = model, processor
        self.tokenizer = getattr(self.engine, "tokenizer", None)
        self.max_tool_calls, self.chat_timeout_s = max_tool_calls, chat_timeout_s
        self._tools, self.tools_config = tools, tools_config
        self.tool_timeout_s, self.max_pixels = tool_timeout_s, max_pixels
        self.constrain_plans = bool(constrain_plans)
        if tools is not None:
            self._check_plan_schemas(tools)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        tools: ToolRegistry | None = None,
        device: str = "auto",
        dtype: str | None = None,
        tools_config: str | Path | None = None,
        adapter: str | Path | None = None,
        **kwargs,
    ) -> GeoPilot:
        """A saved model directory -> GeoPilot. `tools=None` builds the default registry (configs/tools.yaml) on first use.
        `adapter`: a LoRA adapter directory from training (export/adapter), applied over `path` as its base."""
        from geopilot.device import resolve_device
        from geopilot.model import load_model

        model, processor = load_model(path, device=str(resolve_device(device)), dtype=dtype, adapter=adapter)
        return cls(model, processor, tools, tools_config=tools_config, **kwargs)

    @classmethod
    def from_endpoint(
        cls,
        base_url: str,
        model: str,
        tools: ToolRegistry | None = None,
        *,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        max_parallel: int = 16,
        context_length: int | None = None,
        family: str | None = None,
        **kwargs,
    ) -> GeoPilot:
        """The same agent with its turns generated by an OpenAI-compatible server (e.g. `vllm serve DIR`,
        docs/serving.md); the tools run here. `family`: the served model's (`docs/models.md`; default: read from
        `model`'s config.json when it is a local folder, else llava)."""
        from geopilot.agent.http_engine import HttpEngine

        engine = HttpEngine(
            base_url,
            model,
            api_key=api_key,
            timeout_s=timeout_s,
            max_parallel=max_parallel,
            context_length=context_length,
            family=family,
        )
        return cls(tools=tools, engine=engine, **kwargs)

    @property
    def context_length(self) -> int | None:
        return self.engine.context_length

    @property
    def image_tokens(self) -> int:
        """Tokens one image takes in the prompt (0 where the server renders it)."""
        return getattr(self.engine, "image_tokens", 0)

    @property
    def tools(self) -> ToolRegistry:
        if self._tools is None:
            try:
                from geopilot.tools.registry import build_registry
            except ImportError as err:
                raise GeoPilotError(
                    f"the default tool registry needs geopilot.tools ({err}); pass tools=ToolRegistry([...])"
                ) from None
            self._tools = self._check_plan_schemas(build_registry(self.tools_config))
        return self._tools

    def _check_plan_schemas(self, registry: ToolRegistry) -> ToolRegistry:
        """A tool whose params schema the plan grammar cannot hold fails here, when the registry loads, naming it."""
        check = getattr(registry, "check_plan_schemas", None)
        if self.constrain_plans and check is not None:
            try:
                check()
            except ValueError as err:
                raise GeoPilotError(str(err)) from None
        return registry

    # -- public API ---------------------------------------------------------------------------------------------------

    def chat(
        self,
        image,
        query: str | None,
        history: list | None = None,
        max_rounds: int = 1,
        generation: GenerationOptions | dict | None = None,
        modality: Modality | None = None,
        stream: Callable[[str], None] | None = None,
        *,
        system: str | None = None,
        client_tools: ClientTools | None = None,
        bands: list[int] | None = None,
    ) -> ChatResult:
        """Answer `query` about `image` (path, bytes, PIL image, array or LoadedImage; or a list of them in order,
        e.g. `[before, after]`, at most `max_images`, one size); `stream` gets answer text as decoded.
        `modality` ("optical" or "sar") gates tool calls when given; None infers it from the image without gating.
        `system` replaces the Vicuna system prompt; `client_tools`: plans with calls are returned, not run (and
        `query=None` answers from the tool results the history ends with). `bands` (1-based, e.g. [4, 3, 2]) picks
        the bands shown as RGB; None: geopilot.bands decides."""
        request = _request(image, query, history, modality, system, client_tools, bands)
        prepared = self._prepare(to_chat_request(request))
        return self._run([prepared], checked_rounds(max_rounds), checked_options(generation), stream)[0]

    def chat_batch(
        self,
        requests: list[ChatRequest | dict],
        max_rounds: int = 1,
        generation: GenerationOptions | dict | None = None,
    ) -> list[ChatResult]:
        """Many requests in one batch (in process: left-padded, one KV cache; over HTTP: sent concurrently);
        results in request order. Each request may name its `bands`."""
        if not requests:
            return []
        prepared = [self._prepare(to_chat_request(r, i)) for i, r in enumerate(requests)]
        return self._run(prepared, checked_rounds(max_rounds), checked_options(generation), None)

    def chat_stream(
        self,
        image,
        query: str,
        history: list | None = None,
        max_rounds: int = 1,
        generation: GenerationOptions | dict | None = None,
        modality: Modality | None = None,
        *,
        system: str | None = None,
        client_tools: ClientTools | None = None,
        bands: list[int] | None = None,
    ) -> AnswerStream:
        """Like `chat`, as an iterator of answer text pieces; `.result` holds the ChatResult once it is exhausted.
        Input errors raise here, before any generation."""
        request = _request(image, query, history, modality, system, client_tools, bands)
        prepared = self._prepare(to_chat_request(request))
        options, max_rounds = checked_options(generation), checked_rounds(max_rounds)
        return AnswerStream(lambda on_text: self._run([prepared], max_rounds, options, on_text)[0])

    def prepare(self, request: ChatRequest | dict) -> PreparedRequest:
        """`request` checked, its image loaded and its prompt rendered (what `geopilot serve --scheduler step` runs)."""
        return self._prepare(to_chat_request(request))

    # -- the loop -----------------------------------------------------------------------------------------------------

    def _prepare(self, request: ChatRequest) -> PreparedRequest:
        images, messages, load_seconds = checked_request(request, self.max_pixels, self.max_images)
        prompt = self.engine.prompt_tokens(messages, request.system, images[0].image.size)
        limit = self.engine.context_length
        if limit is not None and len(prompt) >= limit:
            raise GeoPilotInputError(
                f"the prompt is {len(prompt)} tokens, over the model's context of {limit}; shorten the history"
                + (" or the tool results" if messages[-1].role == "tool" else "")
            )
        question = question_text(last_question(messages))
        registry = self.tools if request.client_tools is not None else None
        return PreparedRequest(
            images,
            messages,
            question,
            prompt,
            request.modality,
            load_seconds,
            request.system,
            request.client_tools,
            registry,
            self.engine.box_codec(images[0].image.size),  # the boxes in the model's convention for this image
        )

    def _run(
        self, prepared: list[PreparedRequest], max_rounds: int, options: GenerationOptions, stream
    ) -> list[ChatResult]:
        registry = self.tools
        token = current_token()
        started = time.perf_counter()
        deadline = None if self.chat_timeout_s is None else time.monotonic() + self.chat_timeout_s
        session = self.engine.open(prepared, options, deadline)
        dialogues = [
            AgentLoop(p, registry, max_rounds, self.tool_timeout_s, self.max_tool_calls, deadline) for p in prepared
        ]
        self._check_plan_room(dialogues, options)
        pending: dict[int, str | None] = dict.fromkeys(range(len(prepared)))
        while pending:
            room = self._turn_room(session, dialogues, pending, deadline)
            if not room:
                break
            rows = list(room)
            user_turns = None if all(pending[r] is None for r in rows) else [pending[r] for r in rows]
            boxes = prepared[rows[0]].boxes if len(rows) == 1 else None  # only a one-row turn streams
            on_text = AnswerExtractor(stream, boxes).feed if stream is not None else None
            if token is not None:  # the caller gave up (serving: every client gone or out of time): stop here
                token.check()
                if len(rows) == 1:  # a one-row turn also stops at its next decoded piece
                    on_text = _checking(token, on_text)
            shorten = min(room.values())  # one generate call for the batch: the tightest row sets the length
            plans = [dialogues[row].plan_constraint() if self.constrain_plans else None for row in rows]
            try:
                turns = session.generate(
                    rows, user_turns, on_text, shorten if shorten < options.max_new_tokens else None, plans=plans
                )
            except TurnDeadline as err:
                for row in rows:
                    dialogues[row].stop("deadline", f"{err} (chat_timeout_s={self.chat_timeout_s:g} s)")
                break
            pending = {}
            for row, next_text in zip(rows, take_all(dialogues, rows, turns), strict=True):
                if next_text is not None:
                    pending[row] = next_text
                else:
                    self._park(session, row, dialogues[row])
        for dialogue, request in zip(dialogues, prepared, strict=True):
            per_image = getattr(self.engine, "image_tokens_of", lambda size: 0)(request.image.image.size)
            image_tokens = per_image * len(request.images)
            dialogue.timings_and_tokens(session.encode_seconds, image_tokens, started)
            dialogue.result.describe_image(request.images)
        return [d.result for d in dialogues]

    def _check_plan_room(self, dialogues: list[AgentLoop], options: GenerationOptions) -> None:
        """A one-line GeoPilotInputError before anything is generated when `max_new_tokens` cannot hold any plan
        (an engine that counts tokens here says; a server counts its own)."""
        check = getattr(self.engine, "check_plan_room", None)
        if not self.constrain_plans or check is None:
            return
        for constraint in {d.plan_constraint() for d in dialogues} - {None}:
            check(constraint, options.max_new_tokens)

    def _park(self, session: TurnSession, row: int, dialogue: AgentLoop) -> None:
        """A think turn whose calls the client runs: keep its cache for the request that brings the results, when
        the cache holds what that request renders before the plan (no repair turn)."""
        park = getattr(session, "park", None)
        if park is None or dialogue.result.outcome != "tool_calls" or dialogue.repaired:
            return
        park(row, self.engine.prefix_key(dialogue.request, dialogue.messages), dialogue.messages[-1])

    def _turn_room(
        self, session: TurnSession, dialogues: list[AgentLoop], pending: dict[int, str | None], deadline: float | None
    ) -> dict[int, int]:
        """Tokens each pending row may generate next; rows past the deadline or without room are ended here."""
        context = self.engine.context_length
        room = {}
        for row, text in pending.items():
            dialogue = dialogues[row]
            if deadline is not None and time.monotonic() >= deadline:
                dialogue.stop("deadline", f"the chat ran past its deadline (chat_timeout_s={self.chat_timeout_s:g} s)")
                continue
            if context is None:  # the server alone knows its context; it cuts the turn short itself
                room[row] = 1 << 30
                continue
            left = context - dialogue.tokens_used() - (0 if text is None else session.user_turn_tokens(text))
            if left < MIN_TURN_TOKENS:
                dialogue.stop(
                    "context_limit",
                    f"the next turn does not fit in the model's context of {context} tokens "
                    f"({context - left} used, fewer than {MIN_TURN_TOKENS} left)",
                )
                continue
            room[row] = left
        return room


def _request(image, query, history, modality, system, client_tools, bands) -> dict:
    request = {"image": image, "query": query, "history": history, "modality": modality, "bands": bands}
    if system is not None:
        request["system"] = system
    if client_tools is not None:
        request["client_tools"] = client_tools
    return request


def _checking(token: CancelToken, on_text: Callable[[str], None] | None) -> Callable[[str], None]:
    def feed(piece: str) -> None:
        token.check()
        if on_text is not None:
            on_text(piece)

    return feed
