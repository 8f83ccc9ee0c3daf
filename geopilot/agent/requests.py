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
from geopilot.image import infer_modality, load_image
from geopilot.loaded_image import LoadedImage
from geopilot.sample import (
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

    image: Any
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
        image: LoadedImage,
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
        self.image, self.messages, self.question = image, messages, question
        self.prompt, self.load_seconds = prompt, load_seconds
        self.system, self.client_tools = system, client_tools
        self.constraint = None if client_tools is None else client_tools.constraint(registry)
        self.boxes = boxes
        self.gate = declared  # tool calls are checked against a declared modality only
        self.modality = declared or infer_modality(image)


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
    first user turn) or with the tool results to answer from, and the seconds loading took; bad input raises
    GeoPilotInputError. Every engine (in-process, `GeoPilot.from_endpoint`) starts a chat here."""
    if request.query is not None:
        if not isinstance(request.query, str) or not request.query.strip():
            raise GeoPilotInputError("the query is empty; ask a question about the image")
        if IMAGE_PLACEHOLDER in request.query:
            raise GeoPilotInputError(
                f"the query must not contain {IMAGE_PLACEHOLDER!r}; the image is passed separately"
            )
    if request.system is not None and IMAGE_PLACEHOLDER in request.system:
        raise GeoPilotInputError(f"the system prompt must not contain {IMAGE_PLACEHOLDER!r}")
    if request.image is None:
        raise GeoPilotInputError("no image given; pass a path, bytes, a PIL image or an array")
    start = time.perf_counter()
    if isinstance(request.image, LoadedImage):
        image = request.image
        if request.bands is not None and (image.bands is None or list(image.bands.bands) != list(request.bands)):
            raise GeoPilotInputError("bands= apply when GeoPilot loads the image: use load_image(..., bands=) instead")
    else:
        image = load_image(request.image, max_pixels, bands=request.bands)
    load_seconds = time.perf_counter() - start
    if request.query is None:
        return image, _check_history(request.history, pending_tools=True), load_seconds
    messages = _check_history(request.history) + [UserMessage(content=request.query.strip())]
    if len(messages) == 1:
        messages[0] = UserMessage(content=f"{IMAGE_PLACEHOLDER}\n{request.query.strip()}")
    return image, messages, load_seconds


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


def _check_history(history: list | None, pending_tools: bool = False) -> list:
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
        check_dialogue(messages + ([AssistantMessage(value="")] if pending_tools else []), image_count=1)
    except ValueError as err:
        raise GeoPilotInputError(f"history: {str(err).replace('messages.', 'message ')}") from None
    return messages
