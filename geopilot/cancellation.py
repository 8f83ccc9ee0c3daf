"""Cooperative cancellation of a tool call: the token `ToolRegistry.call` hands to the work it runs in-process.

A timed-out in-process call cannot be killed (Python threads cannot be stopped from outside, and a CUDA kernel
cannot be interrupted at all), so the dispatcher sets the call's `CancelToken` and the work stops at its next
check: backends call `check_cancelled()` between tiles, batches or steps, and before publishing an artefact.
A check raises `ToolCancelled`, which the dispatcher turns into the call's timeout error. The token reaches the
work through a context variable, so no backend signature changes and code outside a tool call never sees one.

    with cancel_scope(token):      # ToolRegistry.call, in the worker thread
        tool.run(image, params)    # ... for tile in tiles: check_cancelled(); run(tile)

A chat reads the same token: `GeoPilot` checks the current one before each turn and, on a one-row turn, at each
decoded piece (the serving batcher runs a batch in a scope whose token is cancelled once every request is).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator


class ToolCancelled(Exception):  # noqa: N818 - it is not an error of the tool, the caller stopped it
    """Raised by `check_cancelled()` inside a call whose caller gave up on it (timeout or deadline)."""


class CancelToken:
    """Set once by the caller; read by the work between steps."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def cancel(self, reason: str = "cancelled") -> None:
        self.reason = reason
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise ToolCancelled(self.reason)


_CURRENT: contextvars.ContextVar[CancelToken | None] = contextvars.ContextVar("geopilot_cancel_token", default=None)


@contextlib.contextmanager
def cancel_scope(token: CancelToken) -> Iterator[CancelToken]:
    """Make `token` the one `check_cancelled()` reads in this thread (or task) for the duration."""
    reset = _CURRENT.set(token)
    try:
        yield token
    finally:
        _CURRENT.reset(reset)


def current_token() -> CancelToken | None:
    """The token of the enclosing `cancel_scope`, or None outside one."""
    return _CURRENT.get()


def check_cancelled() -> None:
    """Raise `ToolCancelled` if the current tool call was cancelled; a no-op outside a call."""
    token = _CURRENT.get()
    if token is not None:
        token.check()
