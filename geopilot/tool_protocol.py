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

Chains (docs/chains.md): inside a chat a call may name an earlier call's output instead of the chat's image,
`"image": "result:N"` (the image artefact of call N, numbered from 1 in call order over the chat's rounds) or, for a
tool with an `objects` param, `"objects": "result:N"` (call N's detections). `ChatCalls` holds the chat's results;
the registry resolves a reference only against it (never a path, never another chat), checks it exists, ran in an
earlier round, succeeded and has the right kind, and stamps the output's `computed_on`. A call repeating an earlier
successful call of an earlier round on the same input is refused as `repeated_call` (no cycles).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ValidationError

from geopilot.cancellation import CancelToken, ToolCancelled, cancel_scope
from geopilot.errors import describe_validation_error, echo
from geopilot.image import LoadedImage
from geopilot.sample import Action, Modality
from geopilot.tool_output import INPUT_IMAGE, Detection, ToolOutput


@runtime_checkable
class Tool(Protocol):
    name: ClassVar[str] | str  # task-level name the model emits, e.g. "detect_objects"
    description: ClassVar[str] | str  # one sentence for the planner prompt and MCP
    modality: ClassVar[Modality | None] | Modality | None  # None: the tool reads no image (e.g. indicator rasters)
    params_model: ClassVar[type[BaseModel]] | type[BaseModel]

    def run(self, image: LoadedImage, params: BaseModel) -> ToolOutput: ...

    # Optional: `isolation: Isolation = "thread"` (module docstring); read with getattr, so a plain tool needs none.
    # A tool whose params have an `objects` reference is run as `run(image, params, objects=[Detection, ...])`.


Isolation = Literal["thread", "process"]
CANCEL_GRACE_S = 1.0  # after a timeout, how long the dispatcher waits for in-process work to stop


class ToolCallError(ValueError):
    """A call that cannot run: `kind` is one of unknown_tool, invalid_params, wrong_modality, invalid_reference,
    repeated_call."""

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

# -- chains: references to earlier results of the same chat ------------------------------------------------------

RESULT_REFERENCE = re.compile(r"result:([1-9][0-9]{0,5})")
# param name -> the kind of earlier output it names: an image artefact, or a detection result's objects
REFERENCE_PARAMS: dict[str, str] = {"image": "image", "objects": "objects"}
REFERENCE_HELP = {
    "image": "omit to use the chat's image; 'result:N' runs on the image artefact of this chat's call N "
    "(calls are numbered from 1 in order, e.g. the restored image of remove_clouds)",
    "objects": "'result:N': the objects that this chat's detection call N found",
}


def check_reference(value: str | None) -> str | None:
    """The one spelling of a reference (a pydantic AfterValidator of every reference param); the message names no
    input, so a path or a URL is refused without echoing it."""
    if value is not None and not RESULT_REFERENCE.fullmatch(value):
        raise ValueError("must be 'result:N', N the number of an earlier call of this chat (paths are not accepted)")
    return value


def _params_key(tool: str, params: BaseModel) -> str:
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
    """What a call's references named: the image to run on, and objects for an `objects` param."""

    computed_on: str = INPUT_IMAGE
    image_path: str | None = None
    objects: list[Detection] | None = None


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
            raise ToolCallError("unknown_tool", f"unknown tool {echo(name)}; available: {', '.join(self._tools)}")
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

    def validate(
        self, action: Action, modality: Modality | None = None, calls: ChatCalls | None = None
    ) -> tuple[Tool, BaseModel]:
        """Check a planned call against the registry, and its `result:N` references against the chat's `calls`;
        raises ToolCallError saying what is wrong."""
        tool, params = self._checked_params(action, modality)
        self.resolve(tool, params, calls)
        return tool, params

    def resolve(self, tool: Tool, params: BaseModel, calls: ChatCalls | None) -> ResolvedInputs:
        """What the call's references name (module docstring), or ToolCallError; a repeat of an earlier successful
        call of the chat on the same input is `repeated_call`."""
        resolved = ResolvedInputs()
        for field, kind in REFERENCE_PARAMS.items():
            reference = getattr(params, field, None)
            if reference is None:
                continue
            if calls is None:
                raise ToolCallError(
                    "invalid_reference",
                    f"{field} {echo(reference)} names an earlier call of a chat; this call is in none",
                )
            output = calls.resolve(field, reference).output
            if kind == "image":
                resolved.computed_on = reference
                resolved.image_path = next(a.path for a in output.artifacts if a.kind == "image")
            else:
                resolved.objects = list(output.detections)
        if calls is not None and (number := calls.repeat_of(_params_key(tool.name, params))) is not None:
            raise ToolCallError(
                "repeated_call",
                f"{tool.name} already ran with these params on the same image (call {number}); use its output above",
            )
        return resolved

    def params_key(self, action: Action) -> str | None:
        """The identity of a call for `repeated_call` (tool + validated params, references included)."""
        try:
            tool, params = self._checked_params(action, None)
        except ToolCallError:
            return None
        return _params_key(tool.name, params)

    def _checked_params(self, action: Action, modality: Modality | None) -> tuple[Tool, BaseModel]:
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
        calls: ChatCalls | None = None,
    ) -> ToolResult:
        """Validate and run one call (its references resolved against the chat's `calls`). Every failure becomes
        `ToolResult.error`; nothing is raised. The caller records the result in `calls`.

        A timeout ends the work (module docstring of `geopilot.cancellation`, and `Tool.isolation`): an in-process
        call is cancelled and waited for up to `cancel_grace_s`, a process-isolated one is killed."""
        result = ToolResult(tool=action.tool, params=dict(action.params))
        start = time.perf_counter()
        try:
            tool, params = self._checked_params(action, modality)
            inputs = self.resolve(tool, params, calls)
            if inputs.image_path is not None:
                image = _artifact_image(inputs)
        except ToolCallError as err:
            result.error, result.error_kind = str(err), err.kind
            return result
        timeout = self.timeout_s if timeout_s is None else timeout_s
        extra = {} if inputs.objects is None else {"objects": inputs.objects}
        try:
            if timeout <= 0:
                raise _TimedOut(f"tool {tool.name!r} was not run: no time left (timeout {timeout:g} s)")
            run = _run_in_process if getattr(tool, "isolation", "thread") == "process" else _run_in_thread
            output = run(tool, image, params, timeout, self.cancel_grace_s, extra)
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
            if result.output is not None:  # which image it read: the registry says, never the backend
                result.output = result.output.model_copy(update={"computed_on": inputs.computed_on})
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


def _artifact_image(inputs: ResolvedInputs) -> LoadedImage:
    """The image artefact a reference names (a file a tool of this chat wrote), loaded like any input image."""
    from geopilot.image import load_image

    try:
        return load_image(inputs.image_path)
    except Exception as err:  # noqa: BLE001 - pruned or unreadable: the reference is unusable, said without the path
        raise ToolCallError(
            "invalid_reference",
            f"image {echo(inputs.computed_on)}: its file can no longer be read ({type(err).__name__})",
        ) from None


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


def _run_in_thread(
    tool: Tool, image: LoadedImage | None, params: BaseModel, timeout: float, grace: float, extra: dict
) -> object:
    """Run in a daemon thread under a cancel token; on timeout cancel it and wait (up to `grace`) for it to stop."""
    token, done, box = CancelToken(), threading.Event(), {}

    def work() -> None:
        with cancel_scope(token):
            try:
                box["output"] = tool.run(image, params, **extra)
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


def _child_main(tool: Tool, image: LoadedImage | None, params: BaseModel, extra: dict, conn) -> None:
    """The forked worker: run the call, send ("ok", output) or ("error", kind, message) back."""
    try:
        message = ("ok", tool.run(image, params, **extra))
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


def _run_in_process(
    tool: Tool, image: LoadedImage | None, params: BaseModel, timeout: float, grace: float, extra: dict
) -> object:
    """Run in a forked child (it inherits the loaded model, nothing is pickled on the way in); kill it on timeout."""
    if _cuda_initialised() or "fork" not in multiprocessing.get_all_start_methods():
        raise _ToolFailed(
            f"tool {tool.name!r} has isolation 'process', which needs fork and no CUDA in this process; "
            "use isolation 'thread' (cooperative cancellation) on GPU"
        )
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    worker = context.Process(target=_child_main, args=(tool, image, params, extra, send), daemon=True)
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
