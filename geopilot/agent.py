"""The agent loop (paper Algorithm 1, DESIGN §7): `GeoPilot.from_pretrained(dir).chat(image, query) -> ChatResult`.

One chat: load and encode the image once; generate the think turn; parse it (`geopilot.plan_parser`); validate
each call against the registry (unknown tool, invalid params, wrong modality); run the calls (per-call timeout,
failures captured by `ToolRegistry.call`); feed the outputs back through THE formatter (`wire.format_tool_turn`)
on the same KV cache (`geopilot.generation.KVSession`); generate the answer. A plan that cannot be parsed or
validated gets ONE repair turn (`wire.format_repair_turn`); if the repaired reply is still unparsable its text is
the answer, and if its calls are still invalid they run as failed calls the model answers from, with the error
recorded either way. Nothing the model emits makes `chat` raise; bad user input raises GeoPilotInputError.

Modality: a caller who declares `modality="optical"|"sar"` gets every call checked against it (a SAR tool on a
declared optical image is a `wrong_modality` problem). Undeclared (`modality=None`, the default), the modality is
inferred from the pixels (`geopilot.image.infer_modality`: no colour -> SAR) and reported in
`ChatResult.modality`, but no call is rejected for it: a heuristic must not veto a correct tool choice.

    pilot = GeoPilot.from_pretrained("runs/geopilot", device="cuda", dtype="bfloat16")
    result = pilot.chat("scene.png", "How many planes are on the apron?")
    print(result.answer, result.timings)

Another engine runs the same loop through this module's public seam: `to_chat_request`, `checked_rounds`,
`checked_options`, `checked_request`, `PreparedRequest` and `AgentLoop` (fed one generated turn at a time);
`geopilot.serving.endpoint` generates the turns on an OpenAI-compatible server with them.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, computed_field

from geopilot.errors import GeoPilotError, GeoPilotInputError, describe_validation_error
from geopilot.generation import AnswerExtractor, GenerationOptions, KVSession, Turn
from geopilot.image import DEFAULT_MAX_PIXELS, LoadedImage, infer_modality, load_image
from geopilot.plan_parser import PlanParseError, parse_plan
from geopilot.sample import (
    IMAGE_PLACEHOLDER,
    MESSAGE_ROLES,
    Action,
    AssistantMessage,
    Message,
    Modality,
    ToolMessage,
    UserMessage,
    check_dialogue,
)
from geopilot.tool_output import ToolOutput
from geopilot.tool_protocol import ToolCallError, ToolRegistry, ToolResult
from geopilot.wire import format_repair_turn, format_tool_turn

Outcome = Literal["direct", "tools", "unparsable", "round_limit", "context_limit", "deadline"]
DEFAULT_MAX_TOOL_CALLS = 8  # calls run per plan; the rest come back as `call_limit` errors
DEFAULT_CHAT_TIMEOUT_S = 600.0  # a whole chat: tool calls get at most what is left, no turn starts after it
MIN_TURN_TOKENS = 16  # a turn with less room than this in the context is not started: the chat ends instead
TurnKind = Literal["think", "repair", "answer"]
_HISTORY = TypeAdapter(list[Message])
MAX_CONCURRENT_DIALOGUES = 8  # rows of a batch whose tool calls run at the same time


class TurnRecord(BaseModel):
    """One generated assistant turn: its text, how it parsed, and what validation found."""

    kind: TurnKind  # think: the first turn; repair: the reply to a repair request; answer: the reply to tool outputs
    text: str
    parse: Literal["strict", "recovered", "llava_plus", "failed"]
    parse_error: str | None = None
    plan: AssistantMessage | None = None
    problems: list[str] = []  # validation errors of the plan's calls
    tool_round: int | None = None  # the round (ToolCallRecord.round) in which this turn's calls ran
    finished: bool = True  # False: cut off at max_new_tokens
    new_input_tokens: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0


class ToolCallRecord(BaseModel):
    """A `ToolResult` (its fields, error kinds included) and the tool round it ran in."""

    round: int
    tool: str
    params: dict[str, Any]
    output: ToolOutput | None = None
    error: str | None = None
    error_kind: str | None = None
    seconds: float = 0.0


class TokenCounts(BaseModel):
    prompt: int = 0  # the first prefill, image tokens included
    image: int = 0
    input: int = 0  # every token prefilled, over all turns (with KV reuse: prompt + the new user turns)
    generated: int = 0


class Timings(BaseModel):
    """Seconds per stage. In `chat_batch` the generation stages are those of the shared batch calls."""

    image_load: float = 0.0
    encode: float = 0.0  # image preprocessing + vision tower + projector
    think: float = 0.0
    repair: float = 0.0
    tools: float = 0.0
    answer: float = 0.0
    total: float = 0.0


class ChatResult(BaseModel):
    answer: str
    outcome: Outcome  # direct: answered without tools; tools: answered from tool outputs; unparsable: the raw
    # text of a reply that never parsed; round_limit: the model still asked for tools after max_rounds;
    # context_limit: the next turn would not fit in the model's context (a turn that fits partly is shortened);
    # deadline: the chat's time (chat_timeout_s) ran out before the next turn. `error` says which, with numbers.
    # `error` is also set when every tool call of the answer failed.
    error: str | None = None  # the unresolved problem behind a fallback answer (None when all went well)
    repaired: bool = False  # a repair turn was needed
    turns: list[TurnRecord] = []
    tool_calls: list[ToolCallRecord] = []
    tokens: TokenCounts = TokenCounts()
    timings: Timings = Timings()
    messages: list[Message] = []  # this exchange in the sample format: pass it as `history=` to continue
    modality: Modality = "optical"  # the image's modality: as declared, or inferred from the pixels
    modality_source: Literal["declared", "inferred"] = "declared"  # only a declared modality gates tool calls

    @computed_field
    @property
    def plans(self) -> list[AssistantMessage]:
        return [turn.plan for turn in self.turns if turn.plan is not None]


class ChatRequest(BaseModel):
    """One request of `chat_batch` (dicts with these keys work too)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    image: Any
    query: str
    history: Any = None  # checked by _check_history, which says what is wrong
    modality: Modality | None = None  # None: inferred from the image, and tool calls are not gated by it


class PreparedRequest:
    """A request checked and rendered: everything the loop needs, nothing left to fail on user input."""

    def __init__(
        self,
        image: LoadedImage,
        messages: list,
        question: str,
        prompt: list[int],
        declared: Modality | None,
        load_seconds: float,
    ):
        self.image, self.messages, self.question = image, messages, question
        self.prompt, self.load_seconds = prompt, load_seconds
        self.gate = declared  # tool calls are checked against a declared modality only
        self.modality = declared or infer_modality(image)


class AgentLoop:
    """The loop for one request, fed one generated turn at a time; says what the model reads next."""

    def __init__(
        self,
        request: PreparedRequest,
        registry: ToolRegistry,
        max_rounds: int,
        tool_timeout_s: float | None,
        max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS,
        deadline: float | None = None,  # time.monotonic() after which nothing new starts
    ):
        self.request, self.registry = request, registry
        self.max_rounds, self.tool_timeout_s = max_rounds, tool_timeout_s
        self.max_tool_calls, self.deadline = max_tool_calls, deadline
        self.turns: list[TurnRecord] = []
        self.tool_calls: list[ToolCallRecord] = []
        self.messages: list = list(request.messages)
        self.rounds, self.repaired, self.next_kind = 0, False, "think"
        self.unresolved: str | None = None  # invalid calls that still ran (as errors) after a failed repair
        self.result: ChatResult | None = None

    def take(self, turn: Turn) -> str | None:
        """Record a generated turn; return the text of the next user turn, or None when the dialogue is over."""
        record = TurnRecord(
            kind=self.next_kind,
            text=turn.text,
            parse="failed",
            finished=turn.finished,
            new_input_tokens=turn.new_input_tokens,
            generated_tokens=len(turn.token_ids),
            seconds=turn.seconds,
        )
        self.turns.append(record)
        try:
            parsed = parse_plan(turn.text)
        except PlanParseError as err:
            record.parse_error = str(err) + ("" if turn.finished else " (the reply was cut off at max_new_tokens)")
            if not self.repaired:
                return self._repair(record.parse_error)
            return self._finish(turn.text.strip(), "unparsable", record.parse_error)
        plan = record.plan = parsed.plan
        record.parse = parsed.method
        if not plan.actions:
            self.messages.append(plan)
            return self._finish(plan.value or "", "tools" if self.rounds else "direct")
        if self.rounds >= self.max_rounds:
            wanted = ", ".join(a.tool for a in plan.actions)
            answer = plan.value or ""
            self.messages.append(AssistantMessage(reasoning=plan.reasoning, value=answer))
            return self._finish(
                answer,
                "round_limit",
                f"the model asked for {wanted} after {self.rounds} tool round(s) (max_rounds={self.max_rounds})",
            )
        record.problems = [self._problem(action) for action in plan.actions]
        record.problems = [p for p in record.problems if p]
        if record.problems and not self.repaired:
            return self._repair("; ".join(record.problems))
        return self._run_tools(plan, record)

    def _problem(self, action: Action) -> str | None:
        try:
            self.registry.validate(action, self.request.gate)
        except ToolCallError as err:
            return f"{err.kind}: {err}"
        except Exception as err:  # noqa: BLE001 - a tool's own params model misbehaving is still the call's problem
            return f"invalid_params: {type(err).__name__}: {err}"
        return None

    def tokens_used(self) -> int:
        """Context positions this conversation fills so far (each generated turn also holds its </s>)."""
        later_inputs = sum(t.new_input_tokens for t in self.turns[1:])
        return len(self.request.prompt) + later_inputs + sum(t.generated_tokens + 1 for t in self.turns)

    def stop(self, outcome: Outcome, error: str) -> None:
        """End before the next turn (context full, or the deadline passed); the last plan's value is the answer."""
        last = next((t.plan for t in reversed(self.turns) if t.plan is not None), None)
        self._finish((last.value or "") if last is not None else "", outcome, error)

    def _call(self, action: Action) -> ToolResult:
        timeout = self.tool_timeout_s if self.tool_timeout_s is not None else self.registry.timeout_s
        if self.deadline is not None:  # never past the chat's deadline (0 left: the call is reported, not run)
            timeout = max(0.0, min(timeout, self.deadline - time.monotonic()))
        try:
            return self.registry.call(action, self.request.image, self.request.gate, timeout)
        except Exception as err:  # noqa: BLE001 - ToolRegistry.call captures failures; this guards other registries
            return ToolResult(
                action.tool, dict(action.params), error=f"{type(err).__name__}: {err}", error_kind="tool_error"
            )

    def _run_tools(self, plan: AssistantMessage, record: TurnRecord) -> str:
        """Run every call (after a failed repair, invalid ones come back as errors the model answers from)."""
        self.rounds += 1
        record.tool_round = self.rounds
        results = [self._call(action) for action in plan.actions[: self.max_tool_calls]]
        results += [
            ToolResult(
                action.tool,
                dict(action.params),
                error=f"not run: the plan has {len(plan.actions)} calls, more than max_tool_calls={self.max_tool_calls}",
                error_kind="call_limit",
            )
            for action in plan.actions[self.max_tool_calls :]
        ]
        self.messages.append(plan)
        for result in results:
            self.tool_calls.append(ToolCallRecord(round=self.rounds, **vars(result)))
            self.messages.append(ToolMessage(name=result.tool, content=result.for_formatter()[1]))
        if record.problems:
            self.unresolved = "; ".join(record.problems)
        self.next_kind = "answer"
        return format_tool_turn([r.for_formatter() for r in results], self.request.question)

    def _repair(self, problem: str) -> str:
        self.repaired, self.next_kind = True, "repair"
        return format_repair_turn(problem, self.request.question)

    def _finish(self, answer: str, outcome: Outcome, error: str | None = None) -> None:
        if outcome == "unparsable":
            self.messages.append(AssistantMessage(value=answer))
        error = error or self.unresolved
        answered_from = [c for c in self.tool_calls if c.round == self.rounds]
        if error is None and outcome == "tools" and answered_from and all(c.error for c in answered_from):
            error = "every tool call failed: " + "; ".join(f"{c.tool}: {c.error}" for c in answered_from)
        self.result = ChatResult(
            answer=answer,
            outcome=outcome,
            error=error,
            repaired=self.repaired,
            turns=self.turns,
            tool_calls=self.tool_calls,
            messages=self.messages,
            modality=self.request.modality,
            modality_source="inferred" if self.request.gate is None else "declared",
        )
        return None

    def timings_and_tokens(self, encode_seconds: float, image_tokens: int, started: float) -> None:
        result = self.result
        stage = {"think": 0.0, "repair": 0.0, "answer": 0.0}
        for turn in self.turns:
            stage[turn.kind] += turn.seconds
        result.timings = Timings(
            image_load=self.request.load_seconds,
            encode=encode_seconds,
            tools=sum(c.seconds for c in self.tool_calls),
            total=time.perf_counter() - started + self.request.load_seconds,
            **stage,
        )
        result.tokens = TokenCounts(
            prompt=self.turns[0].new_input_tokens if self.turns else 0,
            image=image_tokens,
            input=sum(t.new_input_tokens for t in self.turns),
            generated=sum(t.generated_tokens for t in self.turns),
        )


SessionFactory = Callable[[list[list[int]], Any, GenerationOptions], Any]


class GeoPilot:
    """A loaded model + processor + tool registry. `session_factory` swaps the generator (tests, benchmarks)."""

    def __init__(
        self,
        model,
        processor,
        tools: ToolRegistry | None = None,
        *,
        tools_config: str | Path | None = None,
        tool_timeout_s: float | None = None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        session_factory: SessionFactory | None = None,
        max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS,
        chat_timeout_s: float | None = DEFAULT_CHAT_TIMEOUT_S,
    ):
        from geopilot.model import num_image_tokens

        for name, value in (("tool_timeout_s", tool_timeout_s), ("chat_timeout_s", chat_timeout_s)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
                raise GeoPilotInputError(f"{name} must be a number of seconds > 0 (or None), got {value!r}")
        if isinstance(max_tool_calls, bool) or not isinstance(max_tool_calls, int) or max_tool_calls < 1:
            raise GeoPilotInputError(f"max_tool_calls must be a whole number >= 1, got {max_tool_calls!r}")
        self.max_tool_calls, self.chat_timeout_s = max_tool_calls, chat_timeout_s

        self.model, self.processor, self.tokenizer = model, processor, processor.tokenizer
        self.image_tokens = num_image_tokens(model.config)
        self._tools, self.tools_config = tools, tools_config
        self.tool_timeout_s, self.max_pixels = tool_timeout_s, max_pixels
        self.session_factory = session_factory or (
            lambda prompts, pixels, options: KVSession(model, self.tokenizer, prompts, pixels, options)
        )

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        tools: ToolRegistry | None = None,
        device: str = "auto",
        dtype: str | None = None,
        tools_config: str | Path | None = None,
        **kwargs,
    ) -> GeoPilot:
        """A saved model directory -> GeoPilot. `tools=None` builds the default registry (configs/tools.yaml) on first use."""
        from geopilot.device import resolve_device
        from geopilot.model import load_model

        model, processor = load_model(path, device=str(resolve_device(device)), dtype=dtype)
        return cls(model, processor, tools, tools_config=tools_config, **kwargs)

    @staticmethod
    def from_endpoint(base_url: str, model: str, tools: ToolRegistry | None = None, **kwargs):
        """The same agent loop with the think and answer turns generated by an OpenAI-compatible server (e.g.
        `vllm serve DIR`, docs/serving.md); the tools run here. Returns an `EndpointPilot` with chat / chat_batch /
        chat_stream."""
        from geopilot.serving.endpoint import EndpointPilot

        return EndpointPilot(base_url, model, tools, **kwargs)

    @property
    def tools(self) -> ToolRegistry:
        if self._tools is None:
            try:
                from geopilot.tools.registry import build_registry
            except ImportError as err:
                raise GeoPilotError(
                    f"the default tool registry needs geopilot.tools ({err}); pass tools=ToolRegistry([...])"
                ) from None
            self._tools = build_registry(self.tools_config)
        return self._tools

    # -- public API ---------------------------------------------------------------------------------------------------

    def chat(
        self,
        image,
        query: str,
        history: list | None = None,
        max_rounds: int = 1,
        generation: GenerationOptions | dict | None = None,
        modality: Modality | None = None,
        stream: Callable[[str], None] | None = None,
    ) -> ChatResult:
        """Answer `query` about `image` (path, bytes, PIL image, array or LoadedImage); `stream` gets answer text as decoded.
        `modality` ("optical" or "sar") gates tool calls when given; None infers it from the image without gating."""
        request = {"image": image, "query": query, "history": history, "modality": modality}
        prepared = self._prepare(to_chat_request(request))
        return self._run([prepared], checked_rounds(max_rounds), checked_options(generation), stream)[0]

    def chat_batch(
        self,
        requests: list[ChatRequest | dict],
        max_rounds: int = 1,
        generation: GenerationOptions | dict | None = None,
    ) -> list[ChatResult]:
        """Many requests in one batch (left-padded, one KV cache); results in request order."""
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
    ) -> AnswerStream:
        """Like `chat`, as an iterator of answer text pieces; `.result` holds the ChatResult once it is exhausted.
        Input errors raise here, before any generation."""
        request = {"image": image, "query": query, "history": history, "modality": modality}
        prepared = self._prepare(to_chat_request(request))
        options, max_rounds = checked_options(generation), checked_rounds(max_rounds)
        return AnswerStream(lambda on_text: self._run([prepared], max_rounds, options, on_text)[0])

    # -- internals ----------------------------------------------------------------------------------------------------

    def _prepare(self, request: ChatRequest) -> PreparedRequest:
        from geopilot.render import render_turns
        from geopilot.wire import chat_turns, question_text

        image, messages, load_seconds = checked_request(request, self.max_pixels)
        prompt = render_turns(chat_turns(messages), self.tokenizer, self.image_tokens).input_ids
        limit = self.model.config.text_config.max_position_embeddings
        if len(prompt) >= limit:
            raise GeoPilotInputError(
                f"the prompt is {len(prompt)} tokens, over the model's context of {limit}; shorten the history"
            )
        return PreparedRequest(image, messages, question_text(messages[-1]), prompt, request.modality, load_seconds)

    def _run(
        self, prepared: list[PreparedRequest], max_rounds: int, options: GenerationOptions, stream
    ) -> list[ChatResult]:
        from geopilot.batch import pixel_values
        from geopilot.render import user_turn_text
        from geopilot.tokenizer import encode_text

        registry = self.tools
        started = time.perf_counter()
        pixels = pixel_values(self.processor, [p.image.image for p in prepared])
        preprocess_seconds = time.perf_counter() - started
        session = self.session_factory([p.prompt for p in prepared], pixels, options)
        deadline = None if self.chat_timeout_s is None else time.monotonic() + self.chat_timeout_s
        dialogues = [
            AgentLoop(p, registry, max_rounds, self.tool_timeout_s, self.max_tool_calls, deadline) for p in prepared
        ]
        context = self.model.config.text_config.max_position_embeddings
        pending: dict[int, list[int] | None] = dict.fromkeys(range(len(prepared)))
        while pending:
            room = self._turn_room(dialogues, pending, context, deadline)
            if not room:
                break
            rows = list(room)
            tails = None if all(pending[r] is None for r in rows) else [pending[r] for r in rows]
            on_text = AnswerExtractor(stream).feed if stream is not None else None
            shorten = min(room.values())  # one generate call for the batch: the tightest row sets the length
            limit = {"max_new_tokens": shorten} if shorten < options.max_new_tokens else {}
            turns = session.generate(rows, tails, stream=on_text, **limit)
            pending = {}
            for row, next_text in zip(rows, _take_all(dialogues, rows, turns), strict=True):
                if next_text is not None:
                    pending[row] = encode_text(self.tokenizer, user_turn_text(next_text, first=False))
        encode_seconds = preprocess_seconds + session.encode_seconds
        for dialogue in dialogues:
            dialogue.timings_and_tokens(encode_seconds, self.image_tokens, started)
        return [d.result for d in dialogues]

    def _turn_room(
        self, dialogues: list[AgentLoop], pending: dict[int, list[int] | None], context: int, deadline: float | None
    ) -> dict[int, int]:
        """Tokens each pending row may generate next; rows past the deadline or without room are ended here."""
        room = {}
        for row, tail in pending.items():
            dialogue = dialogues[row]
            if deadline is not None and time.monotonic() >= deadline:
                dialogue.stop("deadline", f"the chat ran past its deadline (chat_timeout_s={self.chat_timeout_s:g} s)")
                continue
            left = context - dialogue.tokens_used() - len(tail or [])
            if left < MIN_TURN_TOKENS:
                dialogue.stop(
                    "context_limit",
                    f"the next turn does not fit in the model's context of {context} tokens "
                    f"({context - left} used, fewer than {MIN_TURN_TOKENS} left)",
                )
                continue
            room[row] = left
        return room


def _take_all(dialogues: list[AgentLoop], rows: list[int], turns: list[Turn]) -> list[str | None]:
    """Feed each row its generated turn; the tool calls of different rows (requests) run concurrently, so one
    request's slow tool does not hold up the others' (the calls of one plan still run in order)."""
    if len(rows) == 1:
        return [dialogues[rows[0]].take(turns[0])]
    with ThreadPoolExecutor(
        max_workers=min(len(rows), MAX_CONCURRENT_DIALOGUES), thread_name_prefix="dialogue"
    ) as pool:
        return list(pool.map(lambda row, turn: dialogues[row].take(turn), rows, turns))


class AnswerStream:
    """An iterator over answer text pieces, run in a worker thread; `.result` is the ChatResult at the end."""

    _END = object()

    def __init__(self, run: Callable[[Callable[[str], None]], ChatResult]):
        self.result: ChatResult | None = None
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, args=(run,), daemon=True)
        self._thread.start()

    def _work(self, run) -> None:
        try:
            self.result = run(self._queue.put)
        except BaseException as err:  # noqa: BLE001 - re-raised in the consumer's thread
            self._error = err
        finally:
            self._queue.put(self._END)

    def __iter__(self) -> Iterator[str]:
        while (item := self._queue.get()) is not self._END:
            yield item
        self._thread.join()
        if self._error is not None:
            raise self._error


def checked_options(generation: GenerationOptions | dict | None) -> GenerationOptions:
    """`generation=` of a chat call (None, a dict or GenerationOptions) -> GenerationOptions; bad keys raise
    GeoPilotInputError."""
    if generation is None:
        return GenerationOptions()
    if isinstance(generation, GenerationOptions):
        return generation
    from geopilot.config import build_config

    return build_config(GenerationOptions, dict(generation), source="generation")


def checked_rounds(max_rounds: int) -> int:
    """`max_rounds=` of a chat call, checked to be a whole number >= 0."""
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 0:
        raise GeoPilotInputError(f"max_rounds must be a whole number >= 0, got {max_rounds!r}")
    return max_rounds


def checked_request(request: ChatRequest, max_pixels: int) -> tuple[LoadedImage, list, float]:
    """A request's image (loaded), its conversation so far ending with the query (the image placeholder on the
    first user turn), and the seconds loading took; bad input raises GeoPilotInputError. Every engine (in-process,
    `GeoPilot.from_endpoint`) starts a chat here."""
    if not isinstance(request.query, str) or not request.query.strip():
        raise GeoPilotInputError("the query is empty; ask a question about the image")
    if IMAGE_PLACEHOLDER in request.query:
        raise GeoPilotInputError(f"the query must not contain {IMAGE_PLACEHOLDER!r}; the image is passed separately")
    if request.image is None:
        raise GeoPilotInputError("no image given; pass a path, bytes, a PIL image or an array")
    start = time.perf_counter()
    image = request.image if isinstance(request.image, LoadedImage) else load_image(request.image, max_pixels)
    load_seconds = time.perf_counter() - start
    messages = _check_history(request.history) + [UserMessage(content=request.query.strip())]
    if len(messages) == 1:
        messages[0] = UserMessage(content=f"{IMAGE_PLACEHOLDER}\n{request.query.strip()}")
    return image, messages, load_seconds


def to_chat_request(item: ChatRequest | dict, index: int | None = None) -> ChatRequest:
    """A ChatRequest or its dict -> ChatRequest; a bad dict raises GeoPilotInputError (naming `requests.<index>`)."""
    if isinstance(item, ChatRequest):
        return item
    try:
        return ChatRequest.model_validate(item)
    except ValidationError as err:
        where = "" if index is None else f"requests.{index}"
        raise GeoPilotInputError(describe_validation_error(err, under=where)) from None


def _check_history(history: list | None) -> list:
    """A chat history in the sample format (as `ChatResult.messages` gives it), or a clear error saying what is wrong."""
    if history is None or history == []:
        return []
    if not isinstance(history, list):
        raise GeoPilotInputError(f"history must be a list of messages, got {type(history).__name__}")
    try:
        messages = _HISTORY.validate_python(history)
    except ValidationError as err:
        raise GeoPilotInputError(describe_validation_error(err, under="history", union_tags=MESSAGE_ROLES)) from None
    try:
        check_dialogue(messages, has_image=True)
    except ValueError as err:
        raise GeoPilotInputError(f"history: {str(err).replace('messages.', 'message ')}") from None
    return messages


__all__ = ["AnswerStream", "ChatRequest", "ChatResult", "GeoPilot", "GenerationOptions", "ToolCallRecord", "TurnRecord"]
