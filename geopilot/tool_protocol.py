"""The tool protocol and the registry type: one definition serves inference, data_gen, evaluation and MCP.

A tool is anything with a name, a modality, a pydantic input model and `run(image, params) -> ToolOutput`.
`ToolRegistry.call` is the ONE dispatcher: it validates the call, runs it with a timeout, captures every
failure into the `ToolResult`, and never raises for anything a model (or an MCP client) sends.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ValidationError

from geopilot.image import LoadedImage
from geopilot.sample import Action
from geopilot.tool_output import ToolOutput

Modality = Literal["optical", "sar"]


@runtime_checkable
class Tool(Protocol):
    name: ClassVar[str] | str  # task-level name the model emits, e.g. "detect_objects"
    description: ClassVar[str] | str  # one sentence for the planner prompt and MCP
    modality: ClassVar[Modality] | Modality
    params_model: ClassVar[type[BaseModel]] | type[BaseModel]

    def run(self, image: LoadedImage, params: BaseModel) -> ToolOutput: ...


class ToolCallError(ValueError):
    """A call that cannot run: `kind` is one of unknown_tool, invalid_params, wrong_modality."""

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


def describe_params_error(err: ValidationError) -> str:
    parts = []
    for problem in err.errors():
        field = ".".join(str(p) for p in problem["loc"]) or "params"
        message = "unexpected parameter" if problem["type"] == "extra_forbidden" else problem["msg"]
        parts.append(f"{field}: {message}")
    return "; ".join(parts)


class ToolRegistry:
    """An explicit, ordered set of tools by name."""

    def __init__(self, tools: Iterable[Tool], timeout_s: float = 120.0):
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self._tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self._tools[tool.name] = tool
        self.timeout_s = timeout_s

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    def __iter__(self):
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> list[str]:
        return list(self._tools)

    def get(self, name: str) -> Tool:
        if name not in self._tools:
            raise ToolCallError("unknown_tool", f"unknown tool {name!r}; available: {', '.join(self._tools)}")
        return self._tools[name]

    def schemas(self) -> list[dict[str, Any]]:
        """Name, description, modality and JSON schema of every tool: the planner prompt, MCP and docs use this."""
        return [
            {
                "name": t.name,
                "description": t.description,
                "modality": t.modality,
                "input_schema": t.params_model.model_json_schema(),
            }
            for t in self._tools.values()
        ]

    def validate(self, action: Action, modality: Modality | None = None) -> tuple[Tool, BaseModel]:
        """Check a planned call against the registry; raises ToolCallError saying what is wrong."""
        tool = self.get(action.tool)
        if modality is not None and tool.modality != modality:
            raise ToolCallError(
                "wrong_modality", f"tool {tool.name!r} works on {tool.modality} images, but this image is {modality}"
            )
        try:
            params = tool.params_model.model_validate(action.params)
        except ValidationError as err:
            raise ToolCallError(
                "invalid_params", f"invalid params for {tool.name!r}: {describe_params_error(err)}"
            ) from None
        return tool, params

    def call(
        self, action: Action, image: LoadedImage, modality: Modality | None = None, timeout_s: float | None = None
    ) -> ToolResult:
        """Validate and run one call. Every failure becomes `ToolResult.error`; nothing is raised."""
        result = ToolResult(tool=action.tool, params=dict(action.params))
        start = time.perf_counter()
        try:
            tool, params = self.validate(action, modality)
        except ToolCallError as err:
            result.error, result.error_kind = str(err), err.kind
            return result
        timeout = self.timeout_s if timeout_s is None else timeout_s
        # A daemon-less single-use pool: a tool that hangs past its timeout is abandoned, the caller goes on.
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tool-{tool.name}")
        future = pool.submit(tool.run, image, params)
        try:
            output = future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            result.error, result.error_kind = f"tool {tool.name!r} timed out after {timeout:g} s", "timeout"
        except ValidationError as err:  # a backend built an out-of-range box, an empty label, ...
            result.error, result.error_kind = f"tool {tool.name!r} produced an invalid output: {err}", "invalid_output"
        except Exception as err:  # noqa: BLE001 - a tool's failure is data for the model, not a crash
            result.error, result.error_kind = f"tool {tool.name!r} failed: {type(err).__name__}: {err}", "tool_error"
        else:
            self._accept_output(result, tool.name, output)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            result.seconds = time.perf_counter() - start
        return result

    @staticmethod
    def _accept_output(result: ToolResult, name: str, output: object) -> None:
        """Re-validate what a backend returned (models are frozen but can be built with model_construct)."""
        if not isinstance(output, ToolOutput):
            result.error, result.error_kind = (
                f"tool {name!r} returned {type(output).__name__}, not ToolOutput",
                "invalid_output",
            )
            return
        try:
            result.output = ToolOutput.model_validate(output.model_dump())
        except ValidationError as err:
            result.error, result.error_kind = f"tool {name!r} produced an invalid output: {err}", "invalid_output"
