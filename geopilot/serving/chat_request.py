"""What a request asks GeoPilot to do, read from the wire: an OpenAI chat completion (`parse_body`,
`image_sources`, `conversation_request`, `generation_options`) or FastChat worker turns (`chat_request`) -> the
request dict `GeoPilot.chat_batch` takes, its image checked (413 over the pixel limit, 400 not an image) and loaded.
The API (geopilot.serving.api) and the FastChat worker (geopilot.serving.worker) both read requests here.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from geopilot.errors import GeoPilotInputError, ImageTooLargeError, describe_validation_error
from geopilot.generation import GenerationOptions
from geopilot.json_limits import check_depth
from geopilot.serving.config import ServeConfig
from geopilot.serving.protocol import (
    ChatCompletionRequest,
    check_history_calls,
    check_request_size,
    client_tools,
    images_of,
    read_dialogue,
    refuse_unsupported,
)
from geopilot.serving.security import ServeError, UrlPolicy, check_image, decode_data_url, parse_json

MIN_TEMPERATURE = 1e-5  # below it sampling is greedy (vLLM's and FastChat's rule); 1e-300 would overflow to inf/nan


def pick(value, default):
    return default if value is None else value


def parse_body(raw: bytes, max_text_chars: int) -> ChatCompletionRequest:
    value = parse_json(raw)
    try:
        check_depth(value, "the request body")
        body = ChatCompletionRequest.model_validate(value)
    except GeoPilotInputError as err:
        raise ServeError(400, str(err), code="bad_json") from None
    except ValidationError as err:
        raise ServeError(400, describe_validation_error(err, source="request"), code="bad_request") from None
    refuse_unsupported(body)
    check_request_size(body, max_text_chars)
    return body


async def image_sources(
    body: ChatCompletionRequest, policy: UrlPolicy, deadline: float, max_images: int
) -> list[bytes | str]:
    """The conversation's images in order (before, after): each the bytes fetched from its URL (awaited, inside the
    deadline), or the data URL itself (decoded in a worker thread with the rest). 400 for none or over `max_images`
    (before anything is fetched)."""
    urls = [url for m in body.messages for url in images_of(m.content)]
    if not urls:
        raise ServeError(400, "a conversation needs an image (an image_url part of its first user message)")
    if len(urls) > max_images:
        raise ServeError(
            400, f"{len(urls)} images (image_url parts), over this server's limit of {max_images}", code="bad_request"
        )
    return [url if url.strip().startswith("data:") else await policy.fetch(url, deadline) for url in urls]


def conversation_request(
    body: ChatCompletionRequest, images: list[bytes | str], config: ServeConfig, pilot
) -> dict[str, Any]:
    """The OpenAI messages and their images in order (bytes, or data URLs to decode) -> one chat request (images
    checked, one size): the sample-format history, the query (None: answer the tool results), the system prompt,
    client-run tools."""
    dialogue = read_dialogue(body)
    tools, system = client_tools(
        body, pilot.tools.names() if body.tools else [], config.allow_unknown_tools, dialogue.system
    )
    check_history_calls(dialogue, tools.names if tools is not None else tuple(pilot.tools.names()))
    data = [decode_data_url(image) if isinstance(image, str) else image for image in images]
    loaded = [load_request_image(one, config.max_image_pixels, body.geopilot.bands) for one in data]
    request = {
        "image": same_size(loaded) if len(loaded) > 1 else loaded[0],
        "query": dialogue.query,
        "history": dialogue.history or None,
        "modality": body.geopilot.modality,
    }
    if system is not None:
        request["system"] = system
    if tools is not None:
        request["client_tools"] = tools
    return request


def load_request_image(image: bytes, max_pixels: int, bands: list[int] | None = None):
    """The image checked (413 over `max_pixels`, from its header) and loaded with `bands` as RGB (400 when it is
    not one, or the bands are not in it)."""
    from geopilot.image import load_image

    check_image(image, max_pixels)
    try:
        return load_image(image, max_pixels, bands=bands)
    except ImageTooLargeError as err:
        raise ServeError(413, f"image_url: {err}", code="image_too_large") from None
    except GeoPilotInputError as err:
        raise ServeError(400, f"image_url: {err}", code="bad_image") from None


def same_size(images: list) -> list:
    """Several images of one conversation, checked to be one size (400 naming the sizes otherwise)."""
    from geopilot.image import check_same_size

    try:
        check_same_size(images)
    except GeoPilotInputError as err:
        raise ServeError(400, f"image_url: {err}", code="bad_image") from None
    return images


def chat_request(
    turns: list[tuple[str, str, int]], image: bytes | list[bytes], max_pixels: int, modality=None, bands=None
) -> dict[str, Any]:
    """`(role, text, images)` turns ending with the user's question (`images`: the turn's image count), and the
    image bytes (or several, in order) -> the request dict `GeoPilot.chat_batch` takes: each image checked (413 over
    `max_pixels`) and loaded, several of one size, the earlier turns as `history` (assistant turns as their
    answers). The FastChat worker uses it too."""
    from geopilot.sample import IMAGE_PLACEHOLDER

    if not turns or turns[-1][0] != "user":
        raise ServeError(400, "the last message must be the user's question", code="bad_request")
    if turns[-1][2] and len(turns) > 1:
        raise ServeError(400, "the image must be in the first user message of a conversation", code="bad_request")
    loaded = [load_request_image(one, max_pixels, bands) for one in (image if isinstance(image, list) else [image])]
    history = []
    for role, text, images in turns[:-1]:
        if role == "user":
            history.append({"role": "user", "content": f"{IMAGE_PLACEHOLDER}\n" * int(images) + text})
        else:
            history.append({"role": "assistant", "reasoning": "", "actions": [], "value": text})
    image_value = same_size(loaded) if len(loaded) > 1 else loaded[0]  # one image, or several in order
    return {"image": image_value, "query": turns[-1][1], "history": history or None, "modality": modality}


def generation_options(body: ChatCompletionRequest, config: ServeConfig) -> GenerationOptions:
    limit = pick(body.max_completion_tokens, pick(body.max_tokens, config.max_new_tokens))
    sample = (body.temperature or 0.0) >= MIN_TEMPERATURE  # absent, 0 or tiny: greedy
    return GenerationOptions(
        max_new_tokens=min(limit, config.max_new_tokens),
        min_new_tokens=min(pick(body.min_tokens, 0), config.max_new_tokens),
        do_sample=sample,
        temperature=body.temperature if sample else 1.0,
        top_p=pick(body.top_p, 1.0) if sample else 1.0,
        repetition_penalty=pick(body.repetition_penalty, 1.0),
        seed=body.seed,
    )
