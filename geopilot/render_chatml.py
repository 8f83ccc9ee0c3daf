"""Rendering for a LLaVA model on a ChatML language model (SmolLM2-135M-Instruct): `CHATML_TEMPLATE`, segment by segment.

    [<|im_start|>system\\n{system}<|im_end|>\\n] <|im_start|>user\\n | <image> x N | \\n{question} |
    <|im_end|>\\n<|im_start|>assistant\\n | {json}<|im_end|> | \\n<|im_start|>user\\n{tool turn}<|im_end|>\\n ...

The turn text is the wire format's (`geopilot.wire.chat_turns`), as in the Vicuna renderer (`geopilot.render`);
only the delimiters differ, and they are the tokenizer's special tokens. Labels cover `{json}<|im_end|>` of each
assistant turn; the newline after it is the next turn's (generation stops at `<|im_end|>`, the tokenizer's EOS).
"""

from __future__ import annotations

from geopilot.chat_template import IM_END, IM_START
from geopilot.errors import SampleError
from geopilot.render import IGNORE_INDEX, Rendered
from geopilot.sample import IMAGE_PLACEHOLDER
from geopilot.tokenizer import IMAGE_TOKEN, encode_text
from geopilot.wire import SYSTEM_PROMPT


def _special(tokenizer, token: str) -> list[int]:
    return tokenizer.convert_tokens_to_ids([token])


def _message_open(tokenizer, role: str) -> list[int]:
    return _special(tokenizer, IM_START) + encode_text(tokenizer, role + "\n")


def _user_close(tokenizer) -> list[int]:
    """`<|im_end|>\\n<|im_start|>assistant\\n`: a user turn always hands over to the assistant (the generation prompt)."""
    return _special(tokenizer, IM_END) + encode_text(tokenizer, "\n") + _message_open(tokenizer, "assistant")


def _system_ids(tokenizer, system: str) -> list[int]:
    if not system:
        return []
    return (
        _message_open(tokenizer, "system")
        + encode_text(tokenizer, system)
        + _special(tokenizer, IM_END)
        + (encode_text(tokenizer, "\n"))
    )


def render_turns(
    turns: list[tuple[str, str]],
    tokenizer,
    num_image_tokens: int,
    sample_id: str | None = None,
    system: str = SYSTEM_PROMPT,
) -> Rendered:
    """`[(role, text)]` from `geopilot.wire.chat_turns` -> ids + labels, as `CHATML_TEMPLATE` renders them."""
    image_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    ids: list[int] = _system_ids(tokenizer, system)
    labels: list[int] = [IGNORE_INDEX] * len(ids)
    for index, (role, text) in enumerate(turns):
        if role == "assistant":
            piece = encode_text(tokenizer, text) + _special(tokenizer, IM_END)
            newline = encode_text(tokenizer, "\n")
            ids += piece + newline
            labels += piece + [IGNORE_INDEX] * len(newline)
            continue
        first, *after_images = text.split(IMAGE_PLACEHOLDER)
        if after_images and index != 0:
            raise SampleError(f"{IMAGE_PLACEHOLDER!r} may appear only in the first user turn", sample_id=sample_id)
        piece = _message_open(tokenizer, "user") + encode_text(tokenizer, first)
        for chunk in after_images:
            piece += [image_id] * num_image_tokens + encode_text(tokenizer, chunk)
        piece += _user_close(tokenizer)
        ids += piece
        labels += [IGNORE_INDEX] * len(piece)
    return Rendered(ids, labels)


def render_text(turns: list[tuple[str, str]], tokenizer, system: str = SYSTEM_PROMPT) -> str:
    """The same conversation as one string (`<image>` once per image): the prefix cache's key."""
    return tokenizer.decode(render_turns(turns, tokenizer, 1, system=system).input_ids)


def tail_ids(tokenizer, text: str) -> list[int]:
    """A later user turn (tool outputs, a repair request) after a generated `...<|im_end|>`."""
    return (
        encode_text(tokenizer, "\n")
        + _message_open(tokenizer, "user")
        + encode_text(tokenizer, text)
        + (_user_close(tokenizer))
    )


def assistant_ids(tokenizer, text: str) -> list[int]:
    """An assistant turn as the renderer writes it: `{json}<|im_end|>`."""
    return encode_text(tokenizer, text) + _special(tokenizer, IM_END)
