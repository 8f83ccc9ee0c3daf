"""Rendering: a sample -> token ids + labels, built by tokenising segments and concatenating.

Labels cover exactly the assistant turns (` {json}</s>`), everything else is -100. Because the ids are built
piece by piece, the loss mask is right by construction: there is no search for separators afterwards (the LLaVA
"tokenization mismatch" that silently zeroes samples cannot happen). Segment boundaries, per DESIGN §3:

    <s> | SYSTEM USER: <image-prefix> | <image> x N | <rest of question> ASSISTANT: | ␣{json}</s> | USER: ... ASSISTANT: | ...

`CHAT_TEMPLATE` is the same rendering in Jinja (with `{% generation %}` around assistant turns) for
`apply_chat_template`; a test checks the two agree token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

from geopilot.errors import SampleError
from geopilot.sample import IMAGE_PLACEHOLDER, Sample
from geopilot.tokenizer import IMAGE_TOKEN, encode_text
from geopilot.wire import ASSISTANT_ROLE, SYSTEM_PROMPT, USER_ROLE, chat_turns

IGNORE_INDEX = -100

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] in ['user', 'tool'] %}"
    "{% if loop.first %}" + SYSTEM_PROMPT + " {% endif %}"
    "USER: "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}"
    + IMAGE_TOKEN
    + "\n{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    " ASSISTANT:"
    "{% else %}"
    "{% generation %} {{ message['content'] }}{{ eos_token }}{% endgeneration %}"
    "{% endif %}"
    "{% endfor %}"
)


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


def user_turn_text(content: str, first: bool) -> str:
    prefix = SYSTEM_PROMPT + " " if first else ""
    return f"{prefix}{USER_ROLE} {content} {ASSISTANT_ROLE}"


def render_turns(
    turns: list[tuple[str, str]], tokenizer, num_image_tokens: int, sample_id: str | None = None
) -> Rendered:
    """`[(role, text)]` from `geopilot.wire.chat_turns` -> ids + labels. A conversation that ends with a user turn
    ends with `ASSISTANT:`, which is exactly the generation prompt."""
    image_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    ids: list[int] = [tokenizer.bos_token_id]
    labels: list[int] = [IGNORE_INDEX]
    for index, (role, text) in enumerate(turns):
        if role == "assistant":
            piece = encode_text(tokenizer, " " + text) + [tokenizer.eos_token_id]
            ids += piece
            labels += piece
            continue
        rendered = user_turn_text(text, first=index == 0)
        before, marker, after = rendered.partition(IMAGE_PLACEHOLDER)
        piece = encode_text(tokenizer, before)
        if marker:
            if index != 0:
                raise SampleError(f"{IMAGE_PLACEHOLDER!r} may appear only in the first user turn", sample_id=sample_id)
            piece += [image_id] * num_image_tokens + encode_text(tokenizer, after)
        ids += piece
        labels += [IGNORE_INDEX] * len(piece)
    return Rendered(ids, labels)


def render_sample(sample: Sample, tokenizer, num_image_tokens: int, max_length: int | None = None) -> Rendered:
    """A validated sample -> ids + labels. Too long for `max_length` is an error: cutting would drop an
    assistant turn (a sample always ends with one), and a sample is never trained with its answer cut away."""
    if sample.image is None and any(
        IMAGE_PLACEHOLDER in getattr(m, "content", "") for m in sample.messages if m.role == "user"
    ):
        raise SampleError(
            "text contains the image placeholder but the sample has no image", sample_id=sample.id, field="image"
        )
    rendered = render_turns(chat_turns(sample.messages), tokenizer, num_image_tokens if sample.image else 0, sample.id)
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
