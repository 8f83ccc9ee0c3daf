"""What generates the assistant turns: an `Engine` opens a `TurnSession` over a batch of prepared requests, and the
session generates the next turn of the rows still talking, given the user turn (tool outputs, a repair request)
each row reads first. `GeoPilot` runs its one loop over either engine:

- `LocalEngine`: the model in this process, one KV cache for the batch (`geopilot.generation.KVSession`): later
  turns prefill only the new user turn.
- `HttpEngine` (`geopilot.agent.http_engine`): an OpenAI-compatible server (vLLM, `geopilot serve`) renders and
  generates each turn from the whole conversation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from geopilot.agent.requests import PreparedRequest
from geopilot.generation import GenerationOptions, KVSession, Turn

TextSink = Callable[[str], None]
SessionFactory = Callable[[list[list[int]], Any, GenerationOptions], Any]  # (prompts, pixel values, options)


class TurnDeadline(Exception):
    """A turn the engine gave up on because the chat's deadline came first; the chat ends as `deadline`."""


class TurnSession(Protocol):
    encode_seconds: float  # image preprocessing + encoding (0 where the server does it)

    def user_turn_tokens(self, text: str) -> int:
        """Context positions the user turn `text` takes (an upper bound where the engine cannot count)."""

    def generate(
        self, rows: list[int], user_turns: list[str] | None, stream: TextSink | None, max_new_tokens: int | None
    ) -> list[Turn]:
        """The next turn of each of `rows` (ordered, a subset of the live rows); `user_turns` is None on the first
        turn, else the text each row reads first. `stream` gets text pieces of a one-row turn."""


class Engine(Protocol):
    context_length: int | None  # the model's context in tokens; None: unknown here (the server enforces its own)

    def prompt_tokens(self, messages: list) -> list[int]:
        """The first prompt's token ids (empty where the server renders it); used for the context check."""

    def open(self, requests: list[PreparedRequest], options: GenerationOptions, deadline: float | None) -> TurnSession:
        """A session over `requests`; `deadline` (time.monotonic) bounds any wait on the engine."""


class LocalEngine:
    """The model and processor in this process. `session_factory` swaps the KV session (tests, benchmarks)."""

    def __init__(self, model, processor, session_factory: SessionFactory | None = None):
        from geopilot.model import num_image_tokens

        self.model, self.processor, self.tokenizer = model, processor, processor.tokenizer
        self.image_tokens = num_image_tokens(model.config)
        self.session_factory = session_factory or (
            lambda prompts, pixels, options: KVSession(model, self.tokenizer, prompts, pixels, options)
        )

    @property
    def context_length(self) -> int:
        return self.model.config.text_config.max_position_embeddings

    def prompt_tokens(self, messages: list) -> list[int]:
        from geopilot.render import render_turns
        from geopilot.wire import chat_turns

        return render_turns(chat_turns(messages), self.tokenizer, self.image_tokens).input_ids

    def open(self, requests: list[PreparedRequest], options: GenerationOptions, deadline: float | None) -> LocalSession:
        from geopilot.batch import pixel_values

        started = time.perf_counter()
        pixels = pixel_values(self.processor, [r.image.image for r in requests])
        preprocess_seconds = time.perf_counter() - started
        session = self.session_factory([r.prompt for r in requests], pixels, options)
        return LocalSession(session, self.tokenizer, preprocess_seconds)


class LocalSession:
    """A KV session behind the text interface: user turns are encoded here (once each) as the template writes them."""

    def __init__(self, session, tokenizer, preprocess_seconds: float):
        self.session, self.tokenizer, self.preprocess_seconds = session, tokenizer, preprocess_seconds
        self._encoded: dict[str, list[int]] = {}

    @property
    def encode_seconds(self) -> float:
        return self.preprocess_seconds + self.session.encode_seconds

    def _ids(self, text: str) -> list[int]:
        from geopilot.render import user_turn_text
        from geopilot.tokenizer import encode_text

        if text not in self._encoded:
            self._encoded[text] = encode_text(self.tokenizer, user_turn_text(text, first=False))
        return self._encoded[text]

    def user_turn_tokens(self, text: str) -> int:
        return len(self._ids(text))

    def generate(
        self, rows: list[int], user_turns: list[str] | None, stream: TextSink | None, max_new_tokens: int | None
    ) -> list[Turn]:
        tails = None if user_turns is None else [self._ids(text) for text in user_turns]
        self._encoded.clear()
        limit = {} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}
        return self.session.generate(rows, tails, stream=stream, **limit)
