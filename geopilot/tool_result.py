"""What one tool call comes back as (`ToolResult`), and the error of a call that cannot run (`ToolCallError`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from geopilot.tool_output import ToolOutput


class ToolCallError(ValueError):
    """A call that cannot run: `kind` is one of unknown_tool, invalid_params, wrong_modality, invalid_reference,
    repeated_call, missing_image (the chat has fewer images than the call reads)."""

    def __init__(self, kind: str, message: str):
        self.kind = kind
        super().__init__(message)


@dataclass
class ToolResult:
    """The outcome of one call. Exactly one of `output` and `error` is set; `error_kind` classifies failures."""

    tool: str
    params: dict[str, Any]
    output: ToolOutput | None = None
    error: str | None = None
    error_kind: str | None = (
        None  # unknown_tool | invalid_params | wrong_modality | timeout | tool_error | invalid_output
    )
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    def for_formatter(self) -> tuple[str, ToolOutput]:
        """The (name, output) pair `geopilot.wire.format_tool_turn` takes; a failure is `ToolOutput(error=...)`."""
        return (self.tool, self.output if self.output is not None else ToolOutput(error=str(self.error)))
