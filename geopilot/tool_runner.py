"""How a tool call runs so that its timeout ends the work (`ToolRegistry.call` picks by `Tool.isolation`).

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
from typing import TYPE_CHECKING

from pydantic import BaseModel, ValidationError

from geopilot.cancellation import CancelToken, ToolCancelled, cancel_scope
from geopilot.errors import describe_validation_error
from geopilot.loaded_image import LoadedImage

if TYPE_CHECKING:
    from geopilot.tool_protocol import Tool

CANCEL_GRACE_S = 1.0  # after a timeout, how long the dispatcher waits for in-process work to stop


class TimedOut(Exception):  # noqa: N818 - the signal ToolRegistry.call reports as a timeout
    pass


class ToolFailed(Exception):  # noqa: N818 - a failure reported by a worker process, already one line
    def __init__(self, message: str, kind: str = "tool_error"):
        self.kind = kind
        super().__init__(message)


def discard_artifacts(output: object) -> None:
    """Remove the files a call published after its caller had given up on it."""
    for artifact in getattr(output, "artifacts", None) or []:
        try:
            os.unlink(artifact.path)
        except OSError:
            pass


def run_in_thread(
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
        discard_artifacts(box.get("output"))
        raise TimedOut(
            f"tool {tool.name!r} timed out after {timeout:g} s"
            + ("" if stopped else f" (it did not stop within {grace:g} s: the backend has no cancellation point)")
        )
    if "error" in box:
        if isinstance(box["error"], ToolCancelled):  # cancelled from inside (a nested deadline): still a timeout
            raise TimedOut(f"tool {tool.name!r} was cancelled: {box['error']}")
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


def run_in_process(
    tool: Tool, image: LoadedImage | None, params: BaseModel, timeout: float, grace: float, extra: dict
) -> object:
    """Run in a forked child (it inherits the loaded model, nothing is pickled on the way in); kill it on timeout."""
    if _cuda_initialised() or "fork" not in multiprocessing.get_all_start_methods():
        raise ToolFailed(
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
            raise TimedOut(f"tool {tool.name!r} timed out after {timeout:g} s (its worker process was stopped)")
        try:
            message = receive.recv()
        except EOFError:
            worker.join(grace)
            raise ToolFailed(
                f"tool {tool.name!r} failed: its worker process died (exit code {worker.exitcode})"
            ) from None
    finally:
        if worker.is_alive():
            worker.kill()
        worker.join()
        receive.close()
    if message[0] == "ok":
        return message[1]
    raise ToolFailed(message[2], message[1])
