"""Client-run tools (the OpenAI tool protocol, `geopilot serve` with `tools`): the think turn's plan is handed to
the caller instead of being run here, and the caller's results come back as tool messages.

`ClientTools` is what a request declares: the tool names, which of them this registry does not know (allowed
only when the server says so; their params are not checked here), `tool_choice` and `parallel_tool_calls`.
`tool_output(text)` reads a result the client sends back into the canonical `ToolOutput`, so THE formatter
(`geopilot.wire.format_tool_turn`) writes the tool turn exactly as for a call run here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from pydantic import ValidationError

from geopilot.agent.plan_schema import PlanConstraint
from geopilot.sample import Action
from geopilot.tool_output import ToolOutput
from geopilot.tool_protocol import ToolRegistry
from geopilot.tool_result import ToolCallError

ToolChoice = Literal["none", "auto", "required"]


@dataclass(frozen=True)
class ClientTools:
    names: tuple[str, ...]  # the tools the client declared, in its order
    unknown: tuple[str, ...] = ()  # declared but not in the registry (untrained; only the name is checked)
    choice: str = "auto"  # "none" | "auto" | "required" | the name of the one function to call
    parallel: bool = True  # False: at most one call per plan
    schemas: tuple[tuple[str, str], ...] = ()  # unknown tools' declared params schemas (JSON text, checked)

    def constraint(self, registry: ToolRegistry | None = None) -> PlanConstraint:
        """tool_choice as a PlanConstraint; with `registry`, a known tool's params are held to its own schema."""
        limit = None if self.parallel else 1
        known = [] if registry is None else [n for n in self.names if n in registry and n not in self.unknown]
        params = tuple((n, registry.plan_params(n)) for n in known) + self.schemas
        if self.choice == "none":
            return PlanConstraint(self.names, 0, 0, params)
        if self.choice == "auto":
            return PlanConstraint(self.names, 0, limit, params)
        if self.choice == "required":
            return PlanConstraint(self.names, 1, limit, params)
        return PlanConstraint((self.choice,), 1, limit, params)

    def validate(self, action: Action, registry: ToolRegistry, modality) -> None:
        """Raises ToolCallError for a call the client did not offer, or invalid params of a known tool."""
        if action.tool not in self.names:
            raise ToolCallError(
                "unknown_tool", f"unknown tool {action.tool!r}; the tools offered are {', '.join(self.names)}"
            )
        if action.tool not in self.unknown:
            registry.validate(action, modality)


def tool_output(text: str) -> ToolOutput:
    """A client's tool result -> ToolOutput: the canonical output's JSON (what `geopilot mcp` returns) as is; any
    other JSON object as `data`; anything else as `message` (an MCP error is one line of text)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return ToolOutput(message=text)
    if isinstance(value, dict):
        try:
            return ToolOutput.model_validate(value)
        except ValidationError:
            return ToolOutput(data=value)
    return ToolOutput(message=text)
