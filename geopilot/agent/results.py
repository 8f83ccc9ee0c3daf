"""What a chat returns: the answer, how it ended, every generated turn and tool call, token counts and timings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, computed_field

from geopilot.sample import AssistantMessage, Message, Modality
from geopilot.tool_output import ToolOutput

if TYPE_CHECKING:
    from geopilot.loaded_image import LoadedImage

Outcome = Literal["direct", "tools", "tool_calls", "unparsable", "round_limit", "context_limit", "deadline"]
TurnKind = Literal["think", "repair", "answer"]


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
    # tool_calls: client-run tools: the last plan's calls (`messages[-1].actions`) are the caller's to run.
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
    bands: list[int] | None = None  # the image's bands shown as R, G, B (one: grey), 1-based (geopilot.bands)
    bands_reason: str | None = None  # why those: explicit, colour interpretation, band names, ...
    image_notes: list[str] = []  # said once: a guessed band choice, no CRS (pixel outputs only), ...

    def describe_image(self, images: list[LoadedImage]) -> None:
        """Report which bands of the (first) image were shown and why, and every image's notes (a later image's
        said as `image K: ...`)."""
        first = images[0]
        if first.bands is not None:
            self.bands, self.bands_reason = list(first.bands.bands), first.bands.reason
        self.image_notes = list(first.notes) + [
            f"image {number}: {note}" for number, image in enumerate(images[1:], start=2) for note in image.notes
        ]

    @computed_field
    @property
    def plans(self) -> list[AssistantMessage]:
        return [turn.plan for turn in self.turns if turn.plan is not None]
