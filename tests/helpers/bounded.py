"""Hostile-input checks of an in-process server: each request timed and its peak memory sampled, so a test can
bound both (generously: the machine is shared), and the refusal checked to be one short line."""

from __future__ import annotations

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
