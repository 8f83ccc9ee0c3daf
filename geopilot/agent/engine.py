"""What generates the assistant turns: an `Engine` opens a `TurnSession` over a batch of prepared requests, and the
session generates the next turn of the rows still talking, given the user turn (tool outputs, a repair request)
each row reads first. `GeoPilot` runs its one loop over either engine:

- `LocalEngine`: the model in this process, one KV cache for the batch (`geopilot.generation.KVSession`): later
  turns prefill only the new user turn. With a `PrefixCache`, a think turn whose calls a client runs is parked
  (image and prompt; the plan is re-encoded as the template renders it, so a hit continues exactly as a
  re-prefill would), and the request bringing their results continues from it (`geopilot.agent.prefix_cache`); the
  rows given a plan constraint are decoded inside its grammar (`geopilot.agent.plan_schema.PlanLogits`).
- `HttpEngine` (`geopilot.agent.http_engine`): an OpenAI-compatible server (vLLM, `geopilot serve`) renders and
  generates each turn from the whole conversation; a plan constraint goes as the request's `response_format`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from geopilot.agent.plan_schema import PlanConstraint, PlanGrammars, PlanLogits
from geopilot.agent.prefix_cache import PrefixCache, prefix_key
from geopilot.agent.requests import PreparedRequest
from geopilot.boxes import BoxCodec
from geopilot.families import family_of_model
from geopilot.generation import GenerationOptions, KVSession, Turn

TextSink = Callable[[str], None]
# (prompts, pixel values, options, **the family's other image inputs: Qwen2.5-VL's image_grid_thw)
SessionFactory = Callable[..., Any]


class TurnDeadline(Exception):
    """A turn the engine gave up on because the chat's deadline came first; the chat ends as `deadline`."""


class TurnSession(Protocol):
    encode_seconds: float  # image preprocessing + encoding (0 where the server does it)

    def user_turn_tokens(self, text: str) -> int:
        """Context positions the user turn `text` takes (an upper bound where the engine cannot count)."""

    def generate(
        self,
        rows: list[int],
        user_turns: list[str] | None,
        stream: TextSink | None,
        max_new_tokens: int | None,
        plans: list[PlanConstraint | None] | None = None,
    ) -> list[Turn]:
        """The next turn of each of `rows` (ordered, a subset of the live rows); `user_turns` is None on the first
        turn, else the text each row reads first. `stream` gets text pieces of a one-row turn. `plans[i]`: the
        grammar row i's turn is decoded in (None: free)."""


class Engine(Protocol):
    context_length: int | None  # the model's context in tokens; None: unknown here (the server enforces its own)

    def prompt_tokens(
        self, messages: list, system: str | None = None, image_size: tuple[int, int] = (0, 0)
    ) -> list[int]:
        """The first prompt's token ids (empty where the server renders it) for an image of `image_size` (width,
        height); used for the context check."""

    def box_codec(self, image_size: tuple[int, int]) -> BoxCodec | None:
        """How the model reads and writes the boxes of an image of `image_size` (width, height): its family's
        convention (`geopilot.boxes`; None: the trace's normalised boxes as they are)."""

    def open(self, requests: list[PreparedRequest], options: GenerationOptions, deadline: float | None) -> TurnSession:
        """A session over `requests`; `deadline` (time.monotonic) bounds any wait on the engine."""


class LocalEngine:
    """The model and processor in this process. `session_factory` swaps the KV session (tests, benchmarks);
    `prefix_cache` keeps the think turns of client-run tools for the requests that bring their results."""

    def __init__(self, model, processor, session_factory: SessionFactory | None = None, prefix_cache=None):
        self.model, self.processor, self.tokenizer = model, processor, processor.tokenizer
        self.family = family_of_model(model)
        self._grammars: PlanGrammars | None = None
        self.prefix_cache: PrefixCache | None = prefix_cache
        self.default_sessions = session_factory is None  # KVSession: a per-step scheduler may drive the model itself
        self.session_factory = session_factory or (
            lambda prompts, pixels, options, **images: KVSession(
                model, self.tokenizer, prompts, pixels, options, **images
            )
        )

    @property
    def context_length(self) -> int:
        return self.model.config.text_config.max_position_embeddings

    @property
    def image_tokens(self) -> int:
        """Tokens one image takes in the prompt: LLaVA's fixed count; under a native-resolution family, a 448 px
        square's (`image_tokens_of` gives a given size's)."""
        return self.image_tokens_of((448, 448))

    @property
    def grammars(self) -> PlanGrammars:
        """The plan grammars of this tokenizer over the model's whole vocabulary (built on first use)."""
        if self._grammars is None:
            vocab = self.model.config.text_config.vocab_size
            self._grammars = PlanGrammars.of(self.tokenizer, vocab, self.family.BOX_SCHEMA)
        return self._grammars

    def check_plan_room(self, constraint: PlanConstraint, max_new_tokens: int) -> None:
        self.grammars.check_room(constraint, max_new_tokens)

    def image_tokens_of(self, image_size: tuple[int, int]) -> int:
        return self.family.image_token_count(self.processor, *image_size)

    def box_codec(self, image_size: tuple[int, int]) -> BoxCodec | None:
        return self.family.box_codec(self.processor, *image_size)

    def prompt_tokens(
        self, messages: list, system: str | None = None, image_size: tuple[int, int] = (0, 0)
    ) -> list[int]:
        tokens, boxes = self.image_tokens_of(image_size), self.box_codec(image_size)
        return self.family.prompt_ids(messages, self.tokenizer, tokens, system, boxes)

    def prefix_key(self, request: PreparedRequest, messages: list) -> str:
        """The prefix cache's key of `messages` (ending with a plan) on `request`'s image and system prompt."""
        rendered = self.family.prompt_text(messages, self.tokenizer, request.system, request.boxes)
        return prefix_key(request.image, request.system, rendered)

    def open(self, requests: list[PreparedRequest], options: GenerationOptions, deadline: float | None):
        from geopilot.wire import chat_turns

        resumed: dict[int, LocalSession] = {}
        for index, request in enumerate(requests):
            if self.prefix_cache is None or request.messages[-1].role != "tool":
                continue
            plan_at = max(i for i, m in enumerate(request.messages) if m.role == "assistant")
            parked = self.prefix_cache.take(self.prefix_key(request, request.messages[: plan_at + 1]))
            if parked is not None:  # continue the parked think turn: prefill only the plan and the tool turn
                session, plan_ids = parked
                session.generation_config = options.generation_config(self.tokenizer)
                session.lookup_tokens = options.prompt_lookup_tokens
                tool_turn = chat_turns(request.messages, boxes=request.boxes)[-1][1]
                resumed[index] = LocalSession(session, self, 0.0, [request], first_turn=(plan_ids, tool_turn))
        fresh = [i for i in range(len(requests)) if i not in resumed]
        groups: list[tuple[LocalSession, list[int]]] = []
        if fresh:
            started = time.perf_counter()
            pictures = [image.image for i in fresh for image in requests[i].images]  # each row's, in order
            images = self.family.image_inputs(self.processor, pictures)
            preprocess_seconds = time.perf_counter() - started
            pixels = images.pop("pixel_values")
            if len(pictures) > len(fresh):  # several images in a row: the session splits them per row
                images["image_counts"] = [len(requests[i].images) for i in fresh]
            session = self.session_factory([requests[i].prompt for i in fresh], pixels, options, **images)
            groups.append((LocalSession(session, self, preprocess_seconds, [requests[i] for i in fresh]), fresh))
        if not resumed:
            return groups[0][0]
        return RowGroups(groups + [(session, [index]) for index, session in resumed.items()])


class LocalSession:
    """A KV session behind the text interface: user turns are encoded here (once each) as the template writes them;
    constrained rows (client-run tools) decode inside the plan grammar. `first_turn`: what a resumed session
    reads before its first generated turn (the plan's ids, then the user turn's text)."""

    def __init__(
        self,
        session,
        engine: LocalEngine,
        preprocess_seconds: float,
        requests: list[PreparedRequest],
        first_turn: tuple[list[int], str] | None = None,
    ):
        self.session, self.engine, self.tokenizer = session, engine, engine.tokenizer
        self.preprocess_seconds, self.requests, self.first_turn = preprocess_seconds, requests, first_turn
        self.base_processor = getattr(session, "logits_processor", None)
        self._encoded: dict[str, list[int]] = {}

    @property
    def encode_seconds(self) -> float:
        return self.preprocess_seconds + self.session.encode_seconds

    def _ids(self, text: str) -> list[int]:
        if text not in self._encoded:
            self._encoded[text] = self.engine.family.tail_ids(self.tokenizer, text)
        return self._encoded[text]

    def user_turn_tokens(self, text: str) -> int:
        return len(self._ids(text))

    def generate(
        self,
        rows: list[int],
        user_turns: list[str] | None,
        stream: TextSink | None,
        max_new_tokens: int | None,
        plans: list[PlanConstraint | None] | None = None,
    ) -> list[Turn]:
        lead: list[int] = []
        if user_turns is None and self.first_turn is not None:
            (lead, text), self.first_turn = self.first_turn, None
            user_turns = [text] * len(rows)
        tails = None if user_turns is None else [lead + self._ids(text) for text in user_turns]
        self._encoded.clear()
        limit = {} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}
        self._constrain(plans or [None] * len(rows), max_new_tokens)
        return self.session.generate(rows, tails, stream=stream, **limit)

    def _constrain(self, plans: list[PlanConstraint | None], max_new_tokens: int | None) -> None:
        """Steer this turn's constrained rows with a fresh PlanLogits (the session's own processors kept)."""
        config = getattr(self.session, "generation_config", None)
        if all(c is None for c in plans) or config is None:
            if config is not None:
                self.session.logits_processor = self.base_processor
            return
        from transformers import LogitsProcessorList

        limit = min(config.max_new_tokens, max_new_tokens or config.max_new_tokens)
        steering = PlanLogits(self.engine.grammars, plans, limit)
        self.session.logits_processor = LogitsProcessorList([*(self.base_processor or []), steering])

    def park(self, row: int, key: str, plan) -> bool:
        """Keep `row`'s cache in the engine's prefix cache under `key`, without its last turn: that turn comes back
        as `plan` rendered (the tokens a re-prefill reads, not the ones the grammar happened to decode: a hit then
        answers exactly as a miss). False where there is none to keep."""
        from geopilot.wire import assistant_json

        cache, fork = self.engine.prefix_cache, getattr(self.session, "fork", None)
        if cache is None or fork is None:
            return False
        twin = fork(row)
        twin.rewind()
        text = assistant_json(plan, self.requests[row].boxes)  # the plan as the model wrote it (its box convention)
        cache.park(key, (twin, self.engine.family.assistant_ids(self.tokenizer, text)))
        return True


class RowGroups:
    """Sessions side by side: the fresh rows of a batch share one, each resumed row has its own. `groups` pairs a
    session with the batch rows it holds (its row i is batch row `rows[i]`)."""

    def __init__(self, groups: list[tuple[LocalSession, list[int]]]):
        self.groups = groups

    @property
    def encode_seconds(self) -> float:
        return sum(session.encode_seconds for session, _ in self.groups)

    def user_turn_tokens(self, text: str) -> int:
        return self.groups[0][0].user_turn_tokens(text)

    def generate(self, rows, user_turns, stream, max_new_tokens, plans=None) -> list[Turn]:
        turns: dict[int, Turn] = {}
        for session, members in self.groups:
            mine = [row for row in rows if row in members]
            if not mine:
                continue
            texts = None if user_turns is None else [user_turns[rows.index(row)] for row in mine]
            local = [members.index(row) for row in mine]
            grammars = None if plans is None else [plans[rows.index(row)] for row in mine]
            out = session.generate(local, texts, stream if len(rows) == 1 else None, max_new_tokens, grammars)
            turns.update(zip(mine, out, strict=True))
        return [turns[row] for row in rows]

    def park(self, row: int, key: str, plan) -> bool:
        session, members = next((s, m) for s, m in self.groups if row in m)
        return session.park(members.index(row), key, plan)
