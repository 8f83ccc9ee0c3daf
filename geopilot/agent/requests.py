"""A chat request checked and rendered before anything is generated: the image loaded, the history validated, the
query placed; every engine starts a chat here, so bad user input raises GeoPilotInputError the same way."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from geopilot.agent.client_tools import ClientTools
from geopilot.boxes import BoxCodec
from geopilot.errors import GeoPilotInputError, describe_validation_error
from geopilot.generation import GenerationOptions
from geopilot.image import check_same_size, infer_modality, load_image
from geopilot.loaded_image import LoadedImage
from geopilot.sample import (
    DEFAULT_MAX_IMAGES,
    IMAGE_PLACEHOLDER,
    MESSAGE_ROLES,
    AssistantMessage,
    Message,
    Modality,
    UserMessage,
    check_dialogue,
)

_HISTORY = TypeAdapter(list[Message])
DEFAULT_MAX_TOOL_CALLS = 8  # calls run per plan; the rest come back as `call_limit` errors


class ChatRequest(BaseModel):
    """One request of `chat_batch` (dicts with these keys work too)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    image: Any  # one image, or a list of several in order (before, after)
    query: str | None  # None: answer from the tool results the history ends with (client-run tools)
    history: Any = None  # checked by _check_history, which says what is wrong
    modality: Modality | None = None  # None: inferred from the image, and tool calls are not gated by it
    system: str | None = None  # replaces the Vicuna system prompt ("" drops it), as the chat template does
    client_tools: ClientTools | None = None  # set: plans with calls are returned (outcome "tool_calls"), not run
    bands: list[int] | None = None  # band numbers shown as R, G, B (or one, grey); None: geopilot.bands decides


class PreparedRequest:
    """A request checked and rendered: everything the loop needs, nothing left to fail on user input."""

    def __init__(
        self,
        images: list[LoadedImage],
        messages: list,
        question: str,
        prompt: list[int],
        declared: Modality | None,
        load_seconds: float,
        system: str | None = None,
        client_tools: ClientTools | None = None,
        registry=None,  # the tool registry: held to their param names, the plan's calls of known tools
        boxes: BoxCodec | None = None,  # the image's boxes in the model's convention (None: the trace's own)
    ):
        self.images, self.messages, self.question = images, messages, question
        self.image = images[0]  # the first: what one-image code (modality, prefix key, the result) reads
        self.prompt, self.load_seconds = prompt, load_seconds
        self.system, self.client_tools = system, client_tools
        self.constraint = None if client_tools is None else client_tools.constraint(registry)
        self.boxes = boxes
        self.gate = declared  # tool calls are checked against a declared modality only
        self.modality = declared or infer_modality(self.image)


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


def checked_request(
    request: ChatRequest, max_pixels: int, max_images: int = DEFAULT_MAX_IMAGES
) -> tuple[list[LoadedImage], list, float]:
    """A request's images (loaded, in order, one size), its conversation so far ending with the query (one image
    placeholder per image on the first user turn) or with the tool results to answer from, and the seconds loading
    took; bad input raises GeoPilotInputError. Every engine (in-process, `GeoPilot.from_endpoint`) starts a chat
    here."""
    if request.query is not None:
        if not isinstance(request.query, str) or not request.query.strip():
            raise GeoPilotInputError("the query is empty; ask a question about the image")
        if IMAGE_PLACEHOLDER in request.query:
            raise GeoPilotInputError(
                f"the query must not contain {IMAGE_PLACEHOLDER!r}; the image is passed separately"
            )
    if request.system is not None and IMAGE_PLACEHOLDER in request.system:
        raise GeoPilotInputError(f"the system prompt must not contain {IMAGE_PLACEHOLDER!r}")
    sources = list(request.image) if isinstance(request.image, (list, tuple)) else [request.image]
    if not sources or any(source is None for source in sources):
        raise GeoPilotInputError("no image given; pass a path, bytes, a PIL image or an array (or a list of them)")
    if len(sources) > max_images:
        raise GeoPilotInputError(f"{len(sources)} images, over the limit of {max_images} per request")
    start = time.perf_counter()
    images = [
        _loaded(source, number, len(sources), request.bands, max_pixels) for number, source in enumerate(sources, 1)
    ]
    check_same_size(images)
    load_seconds = time.perf_counter() - start
    if request.query is None:
        return images, _check_history(request.history, len(images), pending_tools=True), load_seconds
    messages = _check_history(request.history, len(images)) + [UserMessage(content=request.query.strip())]
    if len(messages) == 1:
        messages[0] = UserMessage(content=f"{IMAGE_PLACEHOLDER}\n" * len(images) + request.query.strip())
    return images, messages, load_seconds


def _loaded(source, number: int, count: int, bands: list[int] | None, max_pixels: int) -> LoadedImage:
    """One of a request's images loaded (an error names which of several it is)."""
    if isinstance(source, LoadedImage):
        if bands is not None and (source.bands is None or list(source.bands.bands) != list(bands)):
            raise GeoPilotInputError("bands= apply when GeoPilot loads the image: use load_image(..., bands=) instead")
        return source
    try:
        return load_image(source, max_pixels, bands=bands)
    except GeoPilotInputError as err:
        if count == 1:
            raise
        raise type(err)(f"image {number}: {err}") from None


def last_question(messages: list) -> UserMessage:
    """The user turn the conversation's last round answers (the tool turn quotes its question)."""
    return next(m for m in reversed(messages) if m.role == "user")


def to_chat_request(item: ChatRequest | dict, index: int | None = None) -> ChatRequest:
    """A ChatRequest or its dict -> ChatRequest; a bad dict raises GeoPilotInputError (naming `requests.<index>`)."""
    if isinstance(item, ChatRequest):
        return item
    try:
        return ChatRequest.model_validate(item)
    except ValidationError as err:
        where = "" if index is None else f"requests.{index}"
        raise GeoPilotInputError(describe_validation_error(err, under=where)) from None


def _check_history(history: list | None, image_count: int = 1, pending_tools: bool = False) -> list:
    """A chat history in the sample format (as `ChatResult.messages` gives it), or a clear error saying what is
    wrong. `pending_tools`: it ends with the tool results of its last plan, which the next turn answers from."""
    if pending_tools and not history:
        raise GeoPilotInputError("no query: pass one, or a history that ends with tool results to answer from")
    if history is None or history == []:
        return []
    if not isinstance(history, list):
        raise GeoPilotInputError(f"history must be a list of messages, got {type(history).__name__}")
    try:
        messages = _HISTORY.validate_python(history)
    except ValidationError as err:
        raise GeoPilotInputError(describe_validation_error(err, under="history", union_tags=MESSAGE_ROLES)) from None
    if pending_tools and messages[-1].role != "tool":
        raise GeoPilotInputError("no query: pass one, or a history that ends with tool results to answer from")
    try:  # tool results still to be answered: checked as if the answer were there
        check_dialogue(messages + ([AssistantMessage(value="")] if pending_tools else []), image_count=image_count)
    except ValueError as err:
        raise GeoPilotInputError(f"history: {str(err).replace('messages.', 'message ')}") from None
    return messages
