"""The one sample format (docs/design.md §3), shared by data_gen, training, evaluation and inference.

A sample is one JSON object per JSONL line. `load_samples` streams a file and either rejects the first bad
line (default) or skips and counts bad lines; every error names the sample id, the line and the field.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from geopilot.errors import SampleError, validation_problems
from geopilot.tool_output import ToolOutput

IMAGE_PLACEHOLDER = "<image>"  # where the image goes in a user turn; also the token the tokenizer adds
Modality = Literal["optical", "sar"]  # the one definition: samples, records, tools and the agent use it


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Action(_Strict):
    """One tool call the model plans: a task-level tool name and its parameters."""

    tool: str = Field(min_length=1)
    params: dict[str, Any] = {}


class UserMessage(_Strict):
    role: Literal["user"] = "user"
    content: str


class AssistantMessage(_Strict):
    """Every assistant turn is `{reasoning, actions, value}`: a think turn (actions) or an answer (value)."""

    role: Literal["assistant"] = "assistant"
    reasoning: str = ""
    actions: list[Action] = []
    value: str | None = None


class ToolMessage(_Strict):
    role: Literal["tool"] = "tool"
    name: str = Field(min_length=1)
    content: ToolOutput


Message = Annotated[UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]
DEFAULT_MAX_IMAGES = 4  # images per chat request by default (GeoPilot, `chat`, `serve`): each costs its tokens
MESSAGE_ROLES = ("user", "assistant", "tool")  # the tags of the Message union


class Sample(_Strict):
    id: str = Field(min_length=1)
    image: str | None = None  # relative to the folder of the JSONL file, or absolute
    images: list[str] | None = Field(
        default=None, min_length=2
    )  # several, in order (before, after); never with `image`
    modality: Modality = "optical"
    source: str = ""
    ability: str = ""
    difficulty: Literal["easy", "medium", "hard"] | None = None
    messages: list[Message] = Field(min_length=2)

    @model_validator(mode="after")
    def _well_formed_dialogue(self) -> Sample:
        if self.image is not None and self.images is not None:
            raise ValueError("images: a sample has either `image` (one) or `images` (several), not both")
        check_dialogue(self.messages, image_count=len(self.image_names))
        return self

    @property
    def image_names(self) -> list[str]:
        """The sample's images in order, as written: [] without one, [image], or images."""
        if self.images is not None:
            return list(self.images)
        return [] if self.image is None else [self.image]

    def image_path(self, base_dir: str | Path) -> Path | None:
        """The one image's path; a several-image sample answers with its first (use `image_paths` for all)."""
        paths = self.image_paths(base_dir)
        return paths[0] if paths else None

    def image_paths(self, base_dir: str | Path) -> list[Path]:
        return [path if path.is_absolute() else Path(base_dir) / path for path in map(Path, self.image_names)]

    def to_json(self) -> str:
        data = self.model_dump(mode="json", exclude_none=False)
        if data["images"] is None:  # one-image and text-only samples keep the format they always had
            del data["images"]
        return json.dumps(data, ensure_ascii=False)


def check_dialogue(messages: list, image_count: int) -> None:
    """The turn grammar: (user, assistant[actions], tool*, assistant)* ... ending in an answer turn.

    The first user turn holds one `<image>` per image, in the images' order; no other turn holds one.
    Raises ValueError naming the message index; used for samples and for chat histories alike.
    """
    if not messages or messages[0].role != "user":
        raise ValueError("messages.0: a dialogue starts with a user turn")
    pending: list[str] = []  # tool names the last think turn asked for, not yet answered
    previous = None
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        if message.role == "user":
            if pending:
                raise ValueError(f"{where}: expected a tool turn for {pending[0]!r} before the next user turn")
            if previous is not None and previous.role == "user":
                raise ValueError(f"{where}: two user turns in a row")
            placeholders = message.content.count(IMAGE_PLACEHOLDER)
            expected = image_count if index == 0 else 0
            if placeholders != expected:
                if index == 0 and image_count == 1 and placeholders == 0:
                    raise ValueError(f"{where}.content: the first user turn must contain {IMAGE_PLACEHOLDER!r}")
                if index == 0 and image_count == 1:
                    raise ValueError(f"{where}.content: {IMAGE_PLACEHOLDER!r} appears more than once")
                if index == 0 and image_count > 1:
                    raise ValueError(
                        f"{where}.content: {image_count} images need {image_count} {IMAGE_PLACEHOLDER!r}, found {placeholders}"
                    )
                raise ValueError(
                    f"{where}.content: {IMAGE_PLACEHOLDER!r} may appear only in the first user turn of a sample with an image"
                )
        elif message.role == "assistant":
            if previous is None or previous.role == "assistant" or pending:
                raise ValueError(f"{where}: an assistant turn must follow a user turn or the tool turns it asked for")
            pending = [action.tool for action in message.actions]
        else:  # tool
            if not pending:
                raise ValueError(f"{where}: a tool turn must follow an assistant turn that called a tool")
            if message.name != pending[0]:
                raise ValueError(f"{where}.name: expected output of {pending[0]!r}, got {message.name!r}")
            pending.pop(0)
        previous = message
    last = messages[-1]
    if last.role != "assistant" or last.actions or last.value is None:
        raise ValueError(f"messages.{len(messages) - 1}: a dialogue ends with an answer turn (actions [] and a value)")


def parse_sample(data: Any, line: int | None = None) -> Sample:
    sample_id = data.get("id") if isinstance(data, dict) else None
    if not isinstance(data, dict):
        raise SampleError(f"a sample is a JSON object, got {type(data).__name__}", line=line)
    try:
        return Sample.model_validate(data)
    except ValidationError as err:
        field_name, message = validation_problems(err, union_tags=MESSAGE_ROLES)[0]
        raise SampleError(
            message, sample_id=sample_id if isinstance(sample_id, str) else None, line=line, field=field_name or None
        ) from None


@dataclass
class LoadReport:
    """What a lenient load skipped, by cause (`on_error="skip"`)."""

    loaded: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)
    causes: Counter = field(default_factory=Counter)


def load_samples(
    path: str | Path, on_error: Literal["raise", "skip"] = "raise", report: LoadReport | None = None
) -> Iterator[Sample]:
    """Stream samples from a JSONL file (blank lines are ignored)."""
    path = Path(path)
    if not path.is_file():
        raise SampleError(f"data file not found: {path}")
    report = report if report is not None else LoadReport()
    with path.open("rb") as handle:  # decoded line by line: one bad line is that line's problem, not the file's
        for line_number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise SampleError(f"not valid UTF-8 (byte {err.start + 1} of the line)", line=line_number) from None
                try:
                    data = json.loads(line)
                except json.JSONDecodeError as err:
                    raise SampleError(f"not valid JSON ({err.msg} at column {err.colno})", line=line_number) from None
                sample = parse_sample(data, line=line_number)
            except SampleError as err:
                if on_error == "raise":
                    raise SampleError(f"{path}: {err}") from None
                report.skipped += 1
                report.errors.append(str(err))
                report.causes[err.field or "json"] += 1
                continue
            report.loaded += 1
            yield sample


def write_samples(samples: list[Sample], path: str | Path) -> None:
    with Path(path).open("w", encoding="utf-8") as handle:
        for sample in samples:
            handle.write(sample.to_json() + "\n")
