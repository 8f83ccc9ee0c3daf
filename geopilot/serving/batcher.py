"""Request batching: concurrent requests are collected for up to `batch_wait_ms` into one `chat_batch` call.

One thread owns the model. It takes the first waiting job, waits up to `wait_s` for more jobs with the same
decoding settings (up to `max_batch`), and runs them as ONE `chat_batch`: think turns batched, answers batched
(`GeoPilot.chat_batch`). A streaming job runs alone through `chat(stream=...)`, since its answer is sent as it is
decoded; a seeded sampling request runs alone too, so its samples do not depend on its company. If a batch is
refused for one request's input, each job runs alone so only that one gets the error.

Admission is bounded: at most `max_pending` requests are admitted (being prepared, e.g. fetching their image, +
queued + running); `admit()` / `submit` raise `Busy` beyond that, which the API turns into 503. A job's
`cancel()` (its client left, or its request timed out) frees its slot at once and stops its work: a queued job is
skipped; a running batch whose jobs are all cancelled stops before its next turn, and a one-row turn (a lone
request, a stream) at its next decoded piece, so the requests behind it do not time out too. The batch runs in a
`geopilot.cancellation.cancel_scope` whose token reads "every job cancelled"; `GeoPilot` checks it between turns.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from geopilot.cancellation import CancelToken, ToolCancelled, cancel_scope
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

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    # -- the model thread ---------------------------------------------------------------------------------------------

    def _next(self) -> Job | None:
        return self._held.pop(0) if self._held else self._queue.get()

    def _loop(self) -> None:
        while True:
            first = self._next()
            if first is None:
                return
            if first.cancelled.is_set():
                continue
            if first.on_text is not None:
                self._run_stream(first)
                continue
            if first.options.seed is not None and first.options.do_sample:  # its samples must not depend on company
                self._run_batch([first])
                continue
            batch, deadline = [first], time.monotonic() + self.wait_s
            held, self._held = self._held, []
            for job in held:  # each set-aside job is looked at once per batch (a loop over them would spin)
                if not job.cancelled.is_set():
                    (batch if len(batch) < self.max_batch and _joins(first, job) else self._held).append(job)
            while len(batch) < self.max_batch:
                try:
                    job = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if job is None:
                    self._queue.put(None)
                    break
                if not job.cancelled.is_set():
                    (batch if _joins(first, job) else self._held).append(job)
            self._run_batch(batch)

    def _run_batch(self, jobs: list[Job]) -> None:
        from geopilot.errors import GeoPilotInputError

        self.batches.append(len(jobs))
        try:
            with cancel_scope(JobsCancelled(jobs)):
                results = self.pilot.chat_batch([j.request for j in jobs], jobs[0].max_rounds, jobs[0].options)
        except GeoPilotInputError as err:
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
        for job, result in zip(jobs, results, strict=True):
            job.future.set_result(result)

    def _run_stream(self, job: Job) -> None:
        self.batches.append(1)

        def on_text(piece: str) -> None:
            if job.cancelled.is_set():
                raise Cancelled("the client went away")
            job.on_text(piece)

        request = job.request
        try:
            with cancel_scope(JobsCancelled([job])):
                result = self.pilot.chat(
                    request["image"],
                    request["query"],
                    history=request.get("history"),
                    max_rounds=job.max_rounds,
                    generation=job.options,
                    modality=request.get("modality"),
                    stream=on_text,
                    **{key: request[key] for key in ("system", "client_tools") if key in request},
                )
        except BaseException as err:  # noqa: BLE001 - Cancelled, input errors: the request's, not the thread's
            job.future.set_exception(err)
        else:
            job.future.set_result(result)


def _joins(first: Job, job: Job) -> bool:
    return job.on_text is None and job.key() == first.key()


class JobsCancelled(CancelToken):
    """Cancelled once every job of the running batch is (its clients gone or out of time)."""

    def __init__(self, jobs: list[Job]):
        super().__init__()
        self.jobs = jobs
        self.reason = "every request of this batch was cancelled (timed out or gone)"

    @property
    def cancelled(self) -> bool:
        return all(job.cancelled.is_set() for job in self.jobs)

    def check(self) -> None:
        if self.cancelled:
            raise ToolCancelled(self.reason)
