"""The per-step scheduler (`--scheduler step`) on the tiny model: greedy results equal the unbatched server's, a
short request that arrives late finishes first, a cancelled request leaves at the next step, the KV budget holds."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
from helpers.scripted import Detector
from helpers.serving import KEY, MODEL, image_message, serving

from geopilot.generation import GenerationOptions
from geopilot.serving.batcher import Batcher, Job
from geopilot.serving.scheduler import StepScheduler, make_batcher
from geopilot.tool_protocol import ToolRegistry


@pytest.fixture
def pilot(tiny):
    from geopilot.agent import GeoPilot

    return GeoPilot(tiny[0], tiny[1], ToolRegistry([Detector(boxes=2)]))


def _job(i: int, max_new_tokens: int, min_new_tokens: int = 0) -> Job:
    image = np.random.default_rng(i).integers(0, 255, (16, 16, 3), dtype=np.uint8)
    request = {"image": image, "query": f"what is in image {i}?", "history": None, "modality": None}
    return Job(request, GenerationOptions(max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens), 1)


def _until(condition, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.001)


def _same(a, b) -> None:
    assert (a.answer, a.outcome, a.error) == (b.answer, b.outcome, b.error)
    assert [(t.kind, t.text, t.finished, t.new_input_tokens) for t in a.turns] == [
        (t.kind, t.text, t.finished, t.new_input_tokens) for t in b.turns
    ]
    assert a.tokens == b.tokens


def test_every_request_of_a_mixed_batch_equals_the_unbatched_server(pilot):
    _equals_the_unbatched_server(pilot, [24, 128, 32, 48])  # from the shortest the plan grammar allows


def test_a_qwen2_5_vl_mixed_batch_equals_the_unbatched_server(qwen_dir):
    from geopilot.agent import GeoPilot
    from geopilot.model import load_model
    from geopilot.serving.config import ServeConfig

    qwen = GeoPilot(*load_model(qwen_dir), ToolRegistry([Detector(boxes=2)]))
    batcher = make_batcher(qwen, ServeConfig(model_name=MODEL))
    batcher.close()
    assert type(batcher) is StepScheduler  # its family module allows it (STEPPABLE)
    _equals_the_unbatched_server(qwen, [32, 96, 48])  # each row decodes with its own rope delta


def _equals_the_unbatched_server(pilot, lengths: list[int]) -> None:
    unbatched = Batcher(pilot, max_batch=1)
    step = StepScheduler(pilot, kv_budget_tokens=100_000)
    try:
        reference = [unbatched.submit(_job(i, n)).result(timeout=120) for i, n in enumerate(lengths)]
        futures = [step.submit(_job(i, n)) for i, n in enumerate(lengths)]
        results = [f.result(timeout=120) for f in futures]
    finally:
        unbatched.close()
        step.close()
    for a, b in zip(reference, results, strict=True):
        _same(a, b)
    assert max(step.steps) > 1  # rows really were decoded together
    assert len(set(step.steps)) > 1  # and left the batch as their turns ended


def test_a_request_arriving_while_a_long_one_decodes_finishes_first(pilot):
    step = StepScheduler(pilot, kv_budget_tokens=100_000)
    try:
        long = step.submit(_job(0, 150, min_new_tokens=150))
        _until(lambda: len(step.steps) >= 5)  # the long one is decoding
        short = step.submit(_job(1, 24))
        short.result(timeout=120)
        assert not long.done()
        assert long.result(timeout=120).turns[0].text
    finally:
        step.close()


def test_a_cancelled_request_frees_its_rows_at_the_next_step(pilot):
    step = StepScheduler(pilot, kv_budget_tokens=100_000)
    try:
        doomed, other = _job(0, 300, min_new_tokens=300), _job(1, 64)
        step.submit(doomed)
        kept = step.submit(other)
        _until(lambda: len(step.steps) >= 3)
        row = next(r for r in step.rows if r.job is doomed)
        at_cancel = len(step.steps)
        step.cancel(doomed)
        assert step.admitted <= 1  # its slot is free at once
        result = kept.result(timeout=120)
        assert doomed.future.cancelled()
        # the step running at the cancel may still hold it; every later one decodes the other request alone
        assert step.steps[at_cancel + 1 :] and all(rows == 1 for rows in step.steps[at_cancel + 1 :])
        assert row not in step.rows and row not in step._batch and row.cache is None  # its KV went with it
    finally:
        step.close()
    unbatched = Batcher(pilot, max_batch=1)
    try:
        _same(unbatched.submit(_job(1, 64)).result(timeout=120), result)  # the other request is unaffected
    finally:
        unbatched.close()


def test_a_streamed_request_decodes_as_a_row_and_streams_what_the_unbatched_server_streams(tiny):
    from geopilot.agent import GeoPilot

    pilot = GeoPilot(tiny[0], tiny[1], ToolRegistry([]))  # no tools: the think turn is the answer, streamed
    runs = []
    for batcher in (Batcher(pilot, max_batch=1), StepScheduler(pilot, kv_budget_tokens=100_000)):
        pieces: list[str] = []
        streamed, others = _job(0, 96), [_job(1, 128, min_new_tokens=128), _job(2, 64)]
        streamed.on_text = pieces.append
        try:
            futures = [batcher.submit(job) for job in (others[0], streamed, others[1])]
            runs.append(([f.result(timeout=120) for f in futures], pieces))
        finally:
            batcher.close()
    (reference, reference_pieces), (results, pieces) = runs
    for a, b in zip(reference, results, strict=True):
        _same(a, b)
    assert pieces and pieces == reference_pieces and "".join(pieces) == results[1].answer
    assert max(batcher.steps) == 3  # the streamed request decoded beside the other two


def test_requests_past_the_kv_budget_wait_in_the_queue(pilot):
    first = _job(0, 32)
    step = StepScheduler(pilot, kv_budget_tokens=len(pilot.prepare(first.request).prompt) + 200)
    try:
        futures = [step.submit(first), step.submit(_job(1, 32)), step.submit(_job(2, 32))]
        assert all(f.result(timeout=120).turns for f in futures)  # none dropped
        assert max(step.steps) == 1  # one request's reservation fills the budget: the others waited
    finally:
        step.close()


def test_the_server_refuses_max_tokens_above_the_kv_budget(pilot):
    from geopilot.serving.api import create_app
    from geopilot.serving.config import ServeConfig

    config = ServeConfig(model_name=MODEL, api_key=KEY, scheduler="step", kv_budget_tokens=4096)
    app = create_app(pilot, config)
    assert isinstance(app.state.batcher, StepScheduler)
    with serving(app) as url:
        headers = {"authorization": f"Bearer {KEY}"}
        body = {"model": MODEL, "messages": image_message("what is here?"), "max_tokens": 1_000_000}
        refused = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert refused.status_code == 400 and "4096" in refused.json()["error"]["message"]
        body["max_tokens"] = 32
        answered = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert answered.status_code == 200, answered.text


def test_static_is_kept_behind_the_flag_and_for_engines_it_cannot_drive(pilot, scripted_pilot):
    from geopilot.serving.config import ServeConfig

    step = make_batcher(pilot, ServeConfig(model_name=MODEL))
    step.close()
    assert type(step) is StepScheduler  # the default where it can drive the model
    for config, engine_pilot in [
        (ServeConfig(model_name=MODEL, scheduler="static"), pilot),
        (ServeConfig(model_name=MODEL, max_batch=1), pilot),
        (ServeConfig(model_name=MODEL), scripted_pilot()),  # a custom session factory: not the model's KV
    ]:
        batcher = make_batcher(engine_pilot, config)
        try:
            assert type(batcher) is Batcher
        finally:
            batcher.close()


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl"])
def test_a_two_image_request_equals_the_unbatched_server(family, pilot, qwen_dir):
    """Two images (before, after) in a step-scheduled batch beside one-image rows: the same turns as the static
    path, and twice the image tokens (Qwen2.5-VL: two grid rows and their rope positions)."""
    from geopilot.agent import GeoPilot
    from geopilot.model import load_model

    if family == "qwen2_5_vl":
        pilot = GeoPilot(*load_model(qwen_dir), ToolRegistry([Detector(boxes=2)]))
    pair = _job(7, 32)
    pair.request["image"] = [pair.request["image"], np.random.default_rng(8).integers(0, 255, (16, 16, 3), np.uint8)]
    jobs = lambda: [_job(0, 24), Job(dict(pair.request), pair.options, 1), _job(1, 48)]  # noqa: E731
    unbatched = Batcher(pilot, max_batch=1)
    step = StepScheduler(pilot, kv_budget_tokens=100_000)
    try:
        reference = [unbatched.submit(job).result(timeout=120) for job in jobs()]
        results = [future.result(timeout=120) for future in [step.submit(job) for job in jobs()]]
    finally:
        unbatched.close()
        step.close()
    for a, b in zip(reference, results, strict=True):
        _same(a, b)
    assert results[1].tokens.image == 2 * results[0].tokens.image
    assert results[1].messages[0].content.startswith("<image>\n<image>\n")
