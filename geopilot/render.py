"""Rendering: a sample -> token ids + labels, built by tokenising segments and concatenating.

Labels cover exactly the assistant turns (` {json}</s>`), everything else is -100. Because the ids are built
piece by piece, the loss mask is right by construction: there is no search for separators afterwards (the LLaVA
"tokenization mismatch" that silently zeroes samples cannot happen). Segment boundaries, per docs/design.md §3:

    <s> | ␣SYSTEM USER: | <image> x N | \n | <image> x N | \n{question} ASSISTANT: | ␣{json}</s> | USER: ... | ...

(one `<image> x N` run per image of the sample, in order; N image tokens each.)

The space that opens the first segment is the SentencePiece prefix space: Vicuna's tokenizer reads the whole
prompt `A chat ...` as `<s> ▁A ▁chat ...`, so the first segment is written with it (LLaVA-1.5's initialisation
sees its own prompt), while every later segment is tokenised without one (segment-safe, `check_segment_safe`).
`render_text` is the same conversation as one string; `geopilot.chat_template.CHAT_TEMPLATE` renders that same
string from HF messages, and tests check text, ids and assistant masks agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from geopilot.boxes import BoxCodec
from geopilot.errors import SampleError
from geopilot.sample import IMAGE_PLACEHOLDER, Sample
from geopilot.tokenizer import IMAGE_TOKEN, encode_text
from geopilot.wire import ASSISTANT_ROLE, SYSTEM_PROMPT, USER_ROLE, chat_turns

IGNORE_INDEX = -100


@dataclass
class Rendered:
    input_ids: list[int]
    labels: list[int]

    @property
    def num_trained(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE_INDEX)

    def trained_spans(self) -> list[tuple[int, int]]:
        """[start, end) of each contiguous run of labelled tokens."""
        spans, start = [], None
        for i, label in enumerate(self.labels + [IGNORE_INDEX]):
            if label != IGNORE_INDEX and start is None:
                start = i
            elif label == IGNORE_INDEX and start is not None:
                spans.append((start, i))
                start = None
        return spans


def user_turn_text(content: str, first: bool, system: str = SYSTEM_PROMPT) -> str:
    """One user segment; the first opens with the prefix space and the system prompt (an empty `system` drops it)."""
    prefix = " " + (system + " " if system else "") if first else ""
    return f"{prefix}{USER_ROLE} {content} {ASSISTANT_ROLE}"


def wire_segments(turns: list[tuple[str, str]], system: str = SYSTEM_PROMPT) -> list[tuple[str, str]]:
    """`[(role, text)]` from `geopilot.wire.chat_turns` -> the text of each segment, in order (BOS and EOS aside)."""
    return [
        (role, " " + text if role == "assistant" else user_turn_text(text, first=index == 0, system=system))
        for index, (role, text) in enumerate(turns)
    ]


def render_text(turns: list[tuple[str, str]], tokenizer, system: str = SYSTEM_PROMPT) -> str:
    """The whole conversation as one string, exactly as `CHAT_TEMPLATE` renders it: `<image>` once per image,
    BOS and EOS as the tokenizer's text; a conversation ending with a user turn ends with the generation prompt."""
    return tokenizer.bos_token + "".join(
        text + (tokenizer.eos_token if role == "assistant" else "") for role, text in wire_segments(turns, system)
    )


def render_turns(
    turns: list[tuple[str, str]],
    tokenizer,
    num_image_tokens: int,
    sample_id: str | None = None,
    system: str = SYSTEM_PROMPT,
) -> Rendered:
    """`[(role, text)]` from `geopilot.wire.chat_turns` -> ids + labels. A conversation that ends with a user turn
    ends with `ASSISTANT:`, which is exactly the generation prompt."""
    image_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    ids: list[int] = [tokenizer.bos_token_id]
    labels: list[int] = [IGNORE_INDEX]
    for index, (role, text) in enumerate(wire_segments(turns, system)):
        if role == "assistant":
            piece = encode_text(tokenizer, text) + [tokenizer.eos_token_id]
            ids += piece
            labels += piece
            continue
        first, *after_images = text.split(IMAGE_PLACEHOLDER)
        if after_images and index != 0:
            raise SampleError(f"{IMAGE_PLACEHOLDER!r} may appear only in the first user turn", sample_id=sample_id)
        piece = encode_text(tokenizer, first)
        for chunk in after_images:
            piece += [image_id] * num_image_tokens + encode_text(tokenizer, chunk)
        ids += piece
        labels += [IGNORE_INDEX] * len(piece)
    return Rendered(ids, labels)


def tail_ids(tokenizer, text: str) -> list[int]:
    """A later user turn (tool outputs, a repair request) after a generated `...</s>`: `USER: {text} ASSISTANT:`."""
    return encode_text(tokenizer, user_turn_text(text, first=False))


def assistant_ids(tokenizer, text: str) -> list[int]:
    """An assistant turn as the renderer writes it: ` {json}</s>`."""
    return encode_text(tokenizer, " " + text) + [tokenizer.eos_token_id]


def render_sample(
    sample: Sample,
    tokenizer,
    num_image_tokens: int,
    max_length: int | None = None,
    boxes: BoxCodec | None = None,
) -> Rendered:
    """A validated sample -> ids + labels. Too long for `max_length` is an error: cutting would drop an
    assistant turn (a sample always ends with one), and a sample is never trained with its answer cut away.
    `boxes`: the family's box codec (LLaVA has none: the trace's boxes as they are)."""
    turns = chat_turns(sample.messages, boxes=boxes)
    count = num_image_tokens if sample.image_names else 0  # each image of a sample the same (they share one size)
    rendered = render_turns(turns, tokenizer, count, sample.id)
    return check_rendered(rendered, sample, max_length)


def check_rendered(rendered: Rendered, sample: Sample, max_length: int | None) -> Rendered:
    """Every family's renderer ends here: an image placeholder without an image, too long for `max_length` or
    nothing trained is an error."""
    if not sample.image_names and any(
        IMAGE_PLACEHOLDER in getattr(m, "content", "") for m in sample.messages if m.role == "user"
    ):
        raise SampleError(
            "text contains the image placeholder but the sample has no image", sample_id=sample.id, field="image"
        )
    if max_length is not None and len(rendered.input_ids) > max_length:
        spans = rendered.trained_spans()
        cut = sum(1 for start, end in spans if end > max_length)
        raise SampleError(
            f"{len(rendered.input_ids)} tokens exceed max_length {max_length}; truncating would cut {cut} of its "
            f"{len(spans)} assistant turn(s), so it is not trained (raise max_length or shorten the sample)",
            sample_id=sample.id,
            field="messages",
        )
    if rendered.num_trained == 0:  # cannot happen for a valid sample; kept as the invariant's last guard
        raise SampleError("renders with zero trained tokens", sample_id=sample.id, field="messages")
    return rendered
