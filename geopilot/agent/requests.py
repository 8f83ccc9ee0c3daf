"""A chat request checked and rendered before anything is generated: the image loaded, the history validated, the
query placed; every engine starts a chat here, so bad user input raises GeoPilotInputError the same way."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from geopilot.errors import GeoPilotInputError, describe_validation_error
from geopilot.generation import GenerationOptions
from geopilot.image import LoadedImage, infer_modality, load_image
from geopilot.sample import IMAGE_PLACEHOLDER, MESSAGE_ROLES, Message, Modality, UserMessage, check_dialogue

_HISTORY = TypeAdapter(list[Message])
DEFAULT_MAX_TOOL_CALLS = 8  # calls run per plan; the rest come back as `call_limit` errors


class ChatRequest(BaseModel):
    """One request of `chat_batch` (dicts with these keys work too)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    image: Any
    query: str
    history: Any = None  # checked by _check_history, which says what is wrong
    modality: Modality | None = None  # None: inferred from the image, and tool calls are not gated by it
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
    ):
        self.image, self.messages, self.question = image, messages, question
        self.prompt, self.load_seconds = prompt, load_seconds
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
    first user turn), and the seconds loading took; bad input raises GeoPilotInputError. Every engine (in-process,
    `GeoPilot.from_endpoint`) starts a chat here."""
    if not isinstance(request.query, str) or not request.query.strip():
        raise GeoPilotInputError("the query is empty; ask a question about the image")
    if IMAGE_PLACEHOLDER in request.query:
        raise GeoPilotInputError(f"the query must not contain {IMAGE_PLACEHOLDER!r}; the image is passed separately")
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
