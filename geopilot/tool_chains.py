"""Chains (docs/chains.md): inside a chat a call may name an earlier call's output instead of the chat's image,
`"image": "input:K"` (the chat's image K, numbered from 1 in the order given: a several-image chat's second is
`input:2`), `"image": "result:N"` (the image artefact of call N, numbered from 1 in call order over the chat's rounds) or, for a
tool with an `objects` param, `"objects": "result:N"` (call N's detections). `ChatCalls` holds the chat's results;
the registry resolves a reference only against it (never a path, never another chat), checks it exists, ran in an
earlier round, succeeded and has the right kind, and stamps the output's `computed_on`. A call repeating an earlier
successful call of an earlier round on the same input is refused as `repeated_call` (no cycles).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import BaseModel, Field, StringConstraints

from geopilot.errors import echo
from geopilot.tool_output import INPUT_IMAGE, Detection
from geopilot.tool_result import ToolCallError, ToolResult

RESULT_REFERENCE = re.compile(r"result:([1-9][0-9]{0,5})")
INPUT_REFERENCE = re.compile(r"input:([1-9][0-9]{0,2})")  # the chat's image K, from 1 in the order given
# param name -> the kind of earlier output it names: an image artefact, or a detection result's objects
REFERENCE_PARAMS: dict[str, str] = {"image": "image", "objects": "objects"}
REFERENCE_HELP = {
    "image": "omit to use the chat's (first) image; 'input:K' runs on the chat's image K (from 1, in the order "
    "given: 'input:2' is the second, the 'after' image of a pair); 'result:N' runs on the image artefact of this "
    "chat's call N (calls are numbered from 1 in order, e.g. the restored image of remove_clouds)",
    "objects": "'result:N': the objects that this chat's detection call N found",
}


REFERENCE_SCHEMA = {"type": "string", "pattern": "^" + RESULT_REFERENCE.pattern + "$"}  # its JSON schema spelling
INPUT_SCHEMA = {"type": "string", "pattern": "^" + INPUT_REFERENCE.pattern + "$"}
IMAGE_REFERENCE_SCHEMA = {"type": "string", "pattern": f"^({RESULT_REFERENCE.pattern}|{INPUT_REFERENCE.pattern})$"}

# The params field of a tool that reads several images (`image_count` > 1), naming which of the chat's images it
# reads, in order; omitted: images 1..image_count. The registry resolves it; the tool reads `images=` only.
InputImages = Annotated[
    list[Annotated[str, StringConstraints(pattern=INPUT_SCHEMA["pattern"])]] | None,
    Field(
        default=None,
        description="the chat's images this call reads, in order, as 'input:K' (K from 1); omit for 1, 2, ...",
        examples=[["input:1", "input:2"]],
    ),
]


def check_reference(value: str | None) -> str | None:
    """The one spelling of a reference (a pydantic AfterValidator of every reference param); the message names no
    input, so a path or a URL is refused without echoing it."""
    if value is not None and not RESULT_REFERENCE.fullmatch(value):
        raise ValueError("must be 'result:N', N the number of an earlier call of this chat (paths are not accepted)")
    return value


def check_image_reference(value: str | None) -> str | None:
    """`image`'s spelling: 'input:K' or 'result:N' (an AfterValidator; names no input, as `check_reference`)."""
    if value is not None and not (RESULT_REFERENCE.fullmatch(value) or INPUT_REFERENCE.fullmatch(value)):
        raise ValueError(
            "must be 'result:N' (the image of this chat's call N) or 'input:K' (the chat's image K, from 1); "
            "paths are not accepted"
        )
    return value


def input_number(reference: str) -> int | None:
    """K of an 'input:K' reference, else None."""
    match = INPUT_REFERENCE.fullmatch(reference)
    return int(match.group(1)) if match else None


def params_key(tool: str, params: BaseModel) -> str:
    return tool + json.dumps(params.model_dump(mode="json"), sort_keys=True)


class ChatCalls:
    """The calls of one chat, numbered 1, 2, ... in call order over its rounds (= `ChatResult.tool_calls`): the only
    thing `result:N` can name. A round's results become readable when it closes, so a call reads earlier rounds."""

    def __init__(self):
        self.done: list[tuple[ToolResult, str | None]] = []  # (result, params key) of closed rounds
        self.pending: list[tuple[ToolResult, str | None]] = []

    def record(self, result: ToolResult, key: str | None = None) -> None:
        self.pending.append((result, key))

    def close_round(self) -> None:
        self.done += self.pending
        self.pending = []

    def repeat_of(self, key: str) -> int | None:
        """The number of an earlier round's successful call with the same tool, params and input, if any (a cycle;
        the calls of one plan are one batch, limited by max_tool_calls instead)."""
        for number, (result, seen) in enumerate(self.done, start=1):
            if seen == key and result.ok:
                return number
        return None

    def resolve(self, field: str, reference: str) -> ToolResult:
        """The result `reference` names for param `field`; ToolCallError("invalid_reference") saying what is wrong."""
        number = int(RESULT_REFERENCE.fullmatch(reference).group(1))
        made = len(self.done) + len(self.pending)
        if number > made:
            raise ToolCallError(
                "invalid_reference",
                f"{field} {echo(reference)}: this chat has made {made} call(s), there is no call {number}",
            )
        if number > len(self.done):
            raise ToolCallError(
                "invalid_reference",
                f"{field} {echo(reference)}: call {number} runs in this round; plan the call that reads it in the next round",
            )
        result = self.done[number - 1][0]
        if not result.ok:
            raise ToolCallError(
                "invalid_reference",
                f"{field} {echo(reference)}: call {number} ({result.tool}) failed, it has no output to use",
            )
        kind = REFERENCE_PARAMS[field]
        output = result.output
        if kind == "image" and not any(a.kind == "image" for a in output.artifacts):
            raise ToolCallError(
                "invalid_reference",
                f"{field} {echo(reference)}: call {number} ({result.tool}) produced no image (only an image artefact, "
                "e.g. remove_clouds' restored image, can be an image)",
            )
        if kind == "objects" and (output.segments or output.roads is not None or output.artifacts):
            raise ToolCallError(
                "invalid_reference",
                f"{field} {echo(reference)}: call {number} ({result.tool}) is not a detection, it has no objects to use",
            )
        return result


@dataclass
class ResolvedInputs:
    """What a call's references named: the image to run on (the chat's images `inputs`, by number, or an earlier
    call's image artefact), and objects for an `objects` param."""

    computed_on: str = INPUT_IMAGE
    image_path: str | None = None
    objects: list[Detection] | None = None
    inputs: list[int] = field(default_factory=lambda: [1])
