"""Hostile-input checks of an in-process server: each request timed and its peak memory sampled, so a test can
bound both (generously: the machine is shared), and the refusal checked to be one short line."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import psutil

MAX_SECONDS = 20.0  # per hostile request, on a loaded 2-core machine
MAX_RSS_GROWTH = 768 * 2**20  # the process's peak RSS over its RSS before the request
MAX_MESSAGE_CHARS = 1000  # a refusal's message: one line, never the input whole


@dataclass
class Measured:
    value: object
    seconds: float
    rss_growth: int  # bytes: the highest RSS sampled while it ran, minus the RSS before


def measured(call, interval_s: float = 0.005) -> Measured:
    """Run `call()` while a thread samples this process's RSS every `interval_s`."""
    process = psutil.Process()
    before = process.memory_info().rss
    peak, done = [before], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(interval_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    try:
        value = call()
    finally:
        seconds = time.monotonic() - started
        done.set()
        sampler.join()
    return Measured(value, seconds, max(peak[0], process.memory_info().rss) - before)


def assert_bounded(case: str, result: Measured) -> None:
    assert result.seconds < MAX_SECONDS, f"{case}: {result.seconds:.1f} s"
    assert result.rss_growth < MAX_RSS_GROWTH, f"{case}: +{result.rss_growth / 2**20:.0f} MB RSS"


def assert_one_line(case: str, message: str) -> None:
    assert message and "\n" not in message and "Traceback" not in message, f"{case}: {message[:300]!r}"
    assert len(message) <= MAX_MESSAGE_CHARS, f"{case}: a message of {len(message):,} characters"


class ServerLog(logging.Handler):
    """What an in-process server logs while it is attached: uvicorn's loggers (which do not propagate to the root)
    and every other (geopilot's) through the root logger. `tracebacks()`: the records that carry one."""

    LOGGERS = ("", "uvicorn")

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> ServerLog:
        for name in self.LOGGERS:
            logging.getLogger(name).addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        for name in self.LOGGERS:
            logging.getLogger(name).removeHandler(self)

    def tracebacks(self, settle_s: float = 0.2) -> list[str]:
        """The records with a traceback, after `settle_s` (uvicorn logs a failure after its 500 has gone out)."""
        time.sleep(settle_s)
        return [self.format(r) for r in self.records if r.exc_info or "Traceback" in r.getMessage()]
