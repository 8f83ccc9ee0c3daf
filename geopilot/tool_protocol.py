"""The tool protocol and the registry type: one definition serves inference, data_gen, evaluation and MCP.

A tool is anything with a name, a modality, a pydantic input model and `run(image, params) -> ToolOutput`.
`ToolRegistry.call` is the ONE dispatcher: it validates the call, runs it with a timeout, captures every
failure into the `ToolResult`, and never raises for anything a model (or an MCP client) sends.

A timeout ends the work, by the tool's optional `isolation` attribute:
- "thread" (the default; cheap tools, image-free tools, the annotation backend, every GPU backend): the call runs in
  a worker thread under a `CancelToken` (`geopilot.cancellation`). On timeout the token is set and the dispatcher
  waits up to `cancel_grace_s` for the work to reach its next `check_cancelled()` (backends check between tiles,
  batches and steps, and before publishing an artefact), so when the timeout is reported the work has stopped and
  no artefact of it is left. Outputs of a call that finished during that grace are dropped, artefacts included.
  On a GPU this is the only mode: a CUDA kernel cannot be interrupted and a process that has initialised CUDA
  cannot be forked, so the overrun is bounded by one tile or batch.
- "process" (CPU only, for a backend that has no cancellation points): the call runs in a forked child process,
  which is killed on timeout. Refused with a clear error in a process that has initialised CUDA.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ValidationError

from geopilot.cancellation import CancelToken, ToolCancelled, cancel_scope
from geopilot.errors import describe_validation_error
from geopilot.image import LoadedImage
from geopilot.sample import Action, Modality
from geopilot.tool_output import ToolOutput


@runtime_checkable
class Tool(Protocol):
    name: ClassVar[str] | str  # task-level name the model emits, e.g. "detect_objects"
    description: ClassVar[str] | str  # one sentence for the planner prompt and MCP
    modality: ClassVar[Modality | None] | Modality | None  # None: the tool reads no image (e.g. indicator rasters)
    params_model: ClassVar[type[BaseModel]] | type[BaseModel]

    def run(self, image: LoadedImage, params: BaseModel) -> ToolOutput: ...

    # Optional: `isolation: Isolation = "thread"` (module docstring); read with getattr, so a plain tool needs none.


Isolation = Literal["thread", "process"]
CANCEL_GRACE_S = 1.0  # after a timeout, how long the dispatcher waits for in-process work to stop


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


UNEXPECTED_PARAMETER = "unexpected parameter"  # how an extra key in a tool call's params is described


class ToolRegistry:
    """An explicit, ordered set of tools by name."""

    def __init__(self, tools: Iterable[Tool], timeout_s: float = 120.0, cancel_grace_s: float = CANCEL_GRACE_S):
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self._tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self._tools[tool.name] = tool
        self.timeout_s, self.cancel_grace_s = timeout_s, cancel_grace_s

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
                **({"data_schema": data_model.model_json_schema()} if (data_model := _data_model(t)) else {}),
            }
            for t in self._tools.values()
        ]

    def validate(self, action: Action, modality: Modality | None = None) -> tuple[Tool, BaseModel]:
        """Check a planned call against the registry; raises ToolCallError saying what is wrong."""
        tool = self.get(action.tool)
        if modality is not None and tool.modality is not None and tool.modality != modality:
            raise ToolCallError(
                "wrong_modality", f"tool {tool.name!r} works on {tool.modality} images, but this image is {modality}"
            )
        try:
            params = tool.params_model.model_validate(action.params)
        except ValidationError as err:
            raise ToolCallError(
                "invalid_params",
                f"invalid params for {tool.name!r}: {describe_validation_error(err, unknown_key=UNEXPECTED_PARAMETER)}",
            ) from None
        return tool, params

    def call(
        self,
        action: Action,
        image: LoadedImage | None,
        modality: Modality | None = None,
        timeout_s: float | None = None,
    ) -> ToolResult:
        """Validate and run one call. Every failure becomes `ToolResult.error`; nothing is raised.

        A timeout ends the work (module docstring of `geopilot.cancellation`, and `Tool.isolation`): an in-process
        call is cancelled and waited for up to `cancel_grace_s`, a process-isolated one is killed."""
        result = ToolResult(tool=action.tool, params=dict(action.params))
        start = time.perf_counter()
        try:
            tool, params = self.validate(action, modality)
        except ToolCallError as err:
            result.error, result.error_kind = str(err), err.kind
            return result
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            if timeout <= 0:
                raise _TimedOut(f"tool {tool.name!r} was not run: no time left (timeout {timeout:g} s)")
            run = _run_in_process if getattr(tool, "isolation", "thread") == "process" else _run_in_thread
            output = run(tool, image, params, timeout, self.cancel_grace_s)
        except _TimedOut as err:
            result.error, result.error_kind = str(err), "timeout"
        except ValidationError as err:  # a backend built an out-of-range box, an empty label, ...
            result.error = f"tool {tool.name!r} produced an invalid output: {describe_validation_error(err)}"
            result.error_kind = "invalid_output"
        except _ToolFailed as err:
            result.error, result.error_kind = str(err), err.kind
        except Exception as err:  # noqa: BLE001 - a tool's failure is data for the model, not a crash
            result.error, result.error_kind = f"tool {tool.name!r} failed: {type(err).__name__}: {err}", "tool_error"
        else:
            self._accept_output(result, tool, output)
        finally:
            result.seconds = time.perf_counter() - start
        return result

    @staticmethod
    def _accept_output(result: ToolResult, tool: Tool, output: object) -> None:
        """Re-validate what a backend returned (models are frozen but can be built with model_construct)."""
        name = tool.name
        if not isinstance(output, ToolOutput):
            result.error, result.error_kind = (
                f"tool {name!r} returned {type(output).__name__}, not ToolOutput",
                "invalid_output",
            )
            return
        try:
            result.output = ToolOutput.model_validate(output.model_dump())
            if (data_model := _data_model(tool)) is not None and result.output.data is not None:
                data_model.model_validate(result.output.data)
        except ValidationError as err:
            result.output = None
            result.error = f"tool {name!r} produced an invalid output: {describe_validation_error(err)}"
            result.error_kind = "invalid_output"


def _data_model(tool: Tool) -> type[BaseModel] | None:
    """The schema a tool declares for `ToolOutput.data` (optional: `data_model` next to `params_model`)."""
    return getattr(tool, "data_model", None)


class _TimedOut(Exception):  # noqa: N818 - internal signal of ToolRegistry.call
    pass


class _ToolFailed(Exception):  # noqa: N818 - a failure reported by a worker process, already one line
    def __init__(self, message: str, kind: str = "tool_error"):
        self.kind = kind
        super().__init__(message)


def _discard_artifacts(output: object) -> None:
    """Remove the files a call published after its caller had given up on it."""
    for artifact in getattr(output, "artifacts", None) or []:
        try:
            os.unlink(artifact.path)
        except OSError:
            pass


def _run_in_thread(tool: Tool, image: LoadedImage | None, params: BaseModel, timeout: float, grace: float) -> object:
    """Run in a daemon thread under a cancel token; on timeout cancel it and wait (up to `grace`) for it to stop."""
    token, done, box = CancelToken(), threading.Event(), {}

    def work() -> None:
        with cancel_scope(token):
            try:
                box["output"] = tool.run(image, params)
            except BaseException as err:  # noqa: BLE001 - handed to the caller's thread
                box["error"] = err
            finally:
                done.set()

    threading.Thread(target=work, name=f"tool-{tool.name}", daemon=True).start()
    if not done.wait(timeout):
        token.cancel(f"timed out after {timeout:g} s")
        stopped = done.wait(grace)
        _discard_artifacts(box.get("output"))
        raise _TimedOut(
            f"tool {tool.name!r} timed out after {timeout:g} s"
            + ("" if stopped else f" (it did not stop within {grace:g} s: the backend has no cancellation point)")
        )
    if "error" in box:
        if isinstance(box["error"], ToolCancelled):  # cancelled from inside (a nested deadline): still a timeout
            raise _TimedOut(f"tool {tool.name!r} was cancelled: {box['error']}")
        raise box["error"]
    return box["output"]


def _child_main(tool: Tool, image: LoadedImage | None, params: BaseModel, conn) -> None:
    """The forked worker: run the call, send ("ok", output) or ("error", kind, message) back."""
    try:
        message = ("ok", tool.run(image, params))
    except ValidationError as err:
        problem = describe_validation_error(err)
        message = ("error", "invalid_output", f"tool {tool.name!r} produced an invalid output: {problem}")
    except BaseException as err:  # noqa: BLE001 - reported to the parent as the call's failure
        message = ("error", "tool_error", f"tool {tool.name!r} failed: {type(err).__name__}: {err}")
    try:
        conn.send(message)
    except Exception as err:  # noqa: BLE001 - e.g. an output that does not pickle
        conn.send(("error", "tool_error", f"tool {tool.name!r} failed: its output cannot be sent back: {err}"))
    conn.close()


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def _run_in_process(tool: Tool, image: LoadedImage | None, params: BaseModel, timeout: float, grace: float) -> object:
    """Run in a forked child (it inherits the loaded model, nothing is pickled on the way in); kill it on timeout."""
    if _cuda_initialised() or "fork" not in multiprocessing.get_all_start_methods():
        raise _ToolFailed(
            f"tool {tool.name!r} has isolation 'process', which needs fork and no CUDA in this process; "
            "use isolation 'thread' (cooperative cancellation) on GPU"
        )
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    worker = context.Process(target=_child_main, args=(tool, image, params, send), daemon=True)
    worker.start()
    send.close()
    try:
        if not receive.poll(timeout):
            raise _TimedOut(f"tool {tool.name!r} timed out after {timeout:g} s (its worker process was stopped)")
        try:
            message = receive.recv()
        except EOFError:
            worker.join(grace)
            raise _ToolFailed(
                f"tool {tool.name!r} failed: its worker process died (exit code {worker.exitcode})"
            ) from None
    finally:
        if worker.is_alive():
            worker.kill()
        worker.join()
        receive.close()
    if message[0] == "ok":
        return message[1]
    raise _ToolFailed(message[2], message[1])
