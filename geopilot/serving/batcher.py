"""Request batching: concurrent requests are collected for up to `batch_wait_ms` into one `chat_batch` call.

One thread owns the model. It takes the first waiting job, waits up to `wait_s` for more jobs with the same
decoding settings (up to `max_batch`), and runs them as ONE `chat_batch`: think turns batched, answers batched
(`GeoPilot.chat_batch`). A streaming job runs alone through `chat(stream=...)`, since its answer is sent as it is
decoded. If a batch is refused for one request's input, each job runs alone so only that one gets the error.

Admission is bounded: at most `max_pending` requests are admitted (being prepared, e.g. fetching their image, +
queued + running); `admit()` / `submit` raise `Busy` beyond that, which the API turns into 503. A job's
`cancel()` (its client left, or its request timed out) frees its slot at once and stops its work: a queued job is
skipped; a running batch whose jobs are all cancelled stops before its next turn, and a one-row turn (a lone
request, a stream) at its next decoded piece, so the requests behind it do not time out too. That reaches into
a `GeoPilot` through its `session_factory` (on the pilot or its engine), which the batcher wraps (`_Stoppable`).
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from geopilot.generation import GenerationOptions


class Busy(Exception):
    """Too many requests are admitted already."""


class Cancelled(Exception):
    """Raised inside a streaming chat whose client left; ends its generation."""


class Slot:
    """One admitted request's place in the batcher's count; `release()` (idempotent) gives it back."""

    def __init__(self, batcher: Batcher):
        self._batcher, self._held = batcher, True

    def release(self) -> None:
        with self._batcher._lock:
            if self._held:
                self._held = False
                self._batcher._admitted -= 1


@dataclass
class Job:
    request: dict[str, Any]  # a ChatRequest as a dict: image (LoadedImage), query, history, modality
    options: GenerationOptions
    max_rounds: int
    on_text: Callable[[str], None] | None = None  # set: stream the answer, run alone
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    cancelled: threading.Event = field(default_factory=threading.Event)
    slot: Slot | None = None  # admitted before submission (the API admits a request when it arrives)

    def key(self) -> tuple:
        return (self.options.model_dump_json(), self.max_rounds)

    def cancel(self) -> None:
        self.cancelled.set()


class Batcher:
    def __init__(self, pilot, max_batch: int = 8, wait_s: float = 0.01, max_pending: int = 64):
        self.pilot, self.max_batch, self.wait_s, self.max_pending = pilot, max_batch, wait_s, max_pending
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._held: list[Job] = []  # taken from the queue but not batchable with the current batch
        self._lock = threading.Lock()
        self._admitted = 0
        self.batches: list[int] = []  # size of every batch run (tests, benchmarks)
        self._running = threading.local()  # the jobs the model thread is running now (read by _Stoppable)
        # the session factory lives on the pilot, or on its engine (GeoPilot over a LocalEngine)
        for holder in (pilot, getattr(pilot, "engine", None)):
            if callable(getattr(holder, "session_factory", None)):
                holder.session_factory = _stoppable(holder.session_factory, self._stop_running)
                break
        self._thread = threading.Thread(target=self._loop, name="geopilot-batcher", daemon=True)
        self._thread.start()

    @property
    def admitted(self) -> int:
        return self._admitted

    def admit(self) -> Slot:
        """Count one more request in progress, or raise Busy at the limit."""
        with self._lock:
            if self._admitted >= self.max_pending:
                raise Busy(f"{self._admitted} requests are in progress (limit {self.max_pending}); retry shortly")
            self._admitted += 1
        return Slot(self)

    def submit(self, job: Job) -> concurrent.futures.Future:
        if job.slot is None:
            job.slot = self.admit()
        slot = job.slot
        job.future.add_done_callback(lambda _: slot.release())
        self._queue.put(job)
        return job.future

    def cancel(self, job: Job) -> None:
        """The client is gone or out of time: free the slot now; the work stops at the next chance."""
        job.cancel()
        if job.slot is not None:
            job.slot.release()

    def _stop_running(self) -> bool:
        jobs = getattr(self._running, "jobs", None)
        return bool(jobs) and all(job.cancelled.is_set() for job in jobs)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    # -- the model thread ---------------------------------------------------------------------------------------------

    def _next(self, timeout: float | None) -> Job | None:
        if self._held:
            return self._held.pop(0)
        return self._queue.get(timeout=timeout) if timeout is None or timeout > 0 else self._queue.get_nowait()

    def _loop(self) -> None:
        while True:
            first = self._next(None)
            if first is None:
                return
            if first.cancelled.is_set():
                continue
            if first.on_text is not None:
                self._run_stream(first)
                continue
            batch, deadline = [first], time.monotonic() + self.wait_s
            while len(batch) < self.max_batch:
                try:
                    job = self._next(deadline - time.monotonic())
                except queue.Empty:
                    break
                if job is None:
                    self._queue.put(None)
                    break
                if job.cancelled.is_set():
                    continue
                if job.on_text is None and job.key() == first.key():
                    batch.append(job)
                else:
                    self._held.append(job)
            self._run_batch(batch)

    def _run_batch(self, jobs: list[Job]) -> None:
        from geopilot.errors import GeoPilotInputError

        self.batches.append(len(jobs))
        outer, self._running.jobs = getattr(self._running, "jobs", None), jobs
        try:
            results = self.pilot.chat_batch([j.request for j in jobs], jobs[0].max_rounds, jobs[0].options)
        except GeoPilotInputError as err:
            self._running.jobs = outer
            if len(jobs) == 1:
                jobs[0].future.set_exception(err)
                return
            for job in jobs:  # find the request that is at fault; the others still get answers
                self._run_batch([job])
            return
        except BaseException as err:  # noqa: BLE001 - handed to every waiting request, the thread lives on
            for job in jobs:
                job.future.set_exception(err)
            return
        finally:
            self._running.jobs = outer
        for job, result in zip(jobs, results, strict=True):
            job.future.set_result(result)

    def _run_stream(self, job: Job) -> None:
        self.batches.append(1)

        def on_text(piece: str) -> None:
            if job.cancelled.is_set():
                raise Cancelled("the client went away")
            job.on_text(piece)

        request = job.request
        self._running.jobs = [job]
        try:
            result = self.pilot.chat(
                request["image"],
                request["query"],
                history=request.get("history"),
                max_rounds=job.max_rounds,
                generation=job.options,
                modality=request.get("modality"),
                stream=on_text,
            )
        except BaseException as err:  # noqa: BLE001 - Cancelled, input errors: the request's, not the thread's
            job.future.set_exception(err)
        else:
            job.future.set_result(result)
        finally:
            self._running.jobs = None


def _stoppable(factory: Callable, should_stop: Callable[[], bool]) -> Callable:
    if getattr(factory, "stoppable", False):  # already wrapped (a second Batcher on the same pilot)
        return factory

    def make(prompts, pixels, options):
        return _Stoppable(factory(prompts, pixels, options), should_stop)

    make.stoppable = True
    return make


class _Stoppable:
    """A generation session that raises Cancelled when the batcher's running jobs are all cancelled: before each
    turn, and, for a one-row turn, at each decoded piece (the session's `stream` hook, which it only honours for
    one row). Outside the batcher's thread `should_stop` is False and this is the session itself."""

    def __init__(self, session, should_stop: Callable[[], bool]):
        self._session, self._should_stop = session, should_stop

    def __getattr__(self, name: str):
        return getattr(self._session, name)

    def _check(self) -> None:
        if self._should_stop():
            raise Cancelled("every request of this batch was cancelled (timed out or gone)")

    def generate(self, rows, tails=None, stream=None, **kwargs):
        self._check()
        if stream is None and len(rows) == 1:
            stream = lambda piece: self._check()  # noqa: E731
        elif stream is not None:
            inner = stream

            def stream(piece: str) -> None:
                self._check()
                inner(piece)

        return self._session.generate(rows, tails, stream=stream, **kwargs)
