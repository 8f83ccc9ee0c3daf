"""Concurrent requests are collected into one chat_batch; a bad request in a batch fails alone."""

from __future__ import annotations

import threading

import numpy as np

from geopilot.generation import GenerationOptions
from geopilot.serving.batcher import Batcher, Busy, Job


def _job(query: str, image=None) -> Job:
    image = np.zeros((8, 8, 3), dtype=np.uint8) if image is None else image
    return Job({"image": image, "query": query, "history": None, "modality": None}, GenerationOptions(), 1)


def test_concurrent_requests_share_one_chat_batch(scripted_pilot):
    pilot = scripted_pilot(delay_s=0.05)
    calls = []
    original = pilot.chat_batch

    def recording(requests, *args, **kwargs):
        calls.append(len(requests))
        return original(requests, *args, **kwargs)

    pilot.chat_batch = recording
    batcher = Batcher(pilot, max_batch=8, wait_s=0.3, max_pending=16)
    try:
        jobs = [_job("TOOL: planes?" if i % 2 else "what?") for i in range(6)]
        start = threading.Barrier(len(jobs))

        def send(job):
            start.wait()
            batcher.submit(job)

        threads = [threading.Thread(target=send, args=(job,)) for job in jobs]
        for thread in threads:
            thread.start()
        results = [job.future.result(timeout=60) for job in jobs]
        assert sum(calls) == 6 and max(calls) > 1  # batched, every request answered once
        assert [r.outcome for r in results] == ["direct", "tools"] * 3
    finally:
        batcher.close()


def test_a_bad_request_fails_alone_and_the_limit_gives_busy(scripted_pilot):
    batcher = Batcher(scripted_pilot(delay_s=0.2), max_batch=4, wait_s=0.2, max_pending=3)
    try:
        good, bad, other = _job("what?"), _job("   "), _job("TOOL: planes?")
        for job in (good, bad, other):
            batcher.submit(job)
        try:
            batcher.submit(_job("one too many"))
            raise AssertionError("a fourth job was admitted")
        except Busy:
            pass
        assert good.future.result(timeout=60).outcome == "direct"
        assert other.future.result(timeout=60).outcome == "tools"
        assert "empty" in str(bad.future.exception(timeout=60))
        assert batcher.admitted == 0
    finally:
        batcher.close()


def test_tools_of_different_requests_run_concurrently(scripted_pilot):
    import time

    pilot = scripted_pilot()
    image = np.zeros((8, 8, 3), dtype=np.uint8)
    start = time.perf_counter()
    results = pilot.chat_batch([{"image": image, "query": f"SLOW {i}"} for i in range(4)])
    wall = time.perf_counter() - start
    assert [r.outcome for r in results] == ["tools"] * 4 and all(r.tool_calls[0].error is None for r in results)
    assert wall < 4 * 0.6  # four 0.6 s tool calls, one per request, overlapped


def test_jobs_with_different_settings_run_in_their_own_batches_without_stalling(scripted_pilot):
    # jobs set aside for another key were once re-read in a loop that never ended while the batch was not full
    batcher = Batcher(scripted_pilot(delay_s=0.05), max_batch=4, wait_s=0.05, max_pending=16)
    try:
        blocker = _job("what?")
        batcher.submit(blocker)  # holds the model thread while the others queue up
        jobs = [_job("what?") for _ in range(6)]
        for i, job in enumerate(jobs):
            job.options = GenerationOptions(max_new_tokens=32 + i % 3)
            batcher.submit(job)
        assert all(job.future.result(timeout=10).outcome == "direct" for job in [blocker, *jobs])
        assert sorted(batcher.batches[1:]) == [2, 2, 2]  # one batch per setting, each with both of its jobs
    finally:
        batcher.close()
