"""`DemoSettings.eval_batch_size`: cases per `GeoPilot.chat_batch` in the demo's evaluate and chain_eval phases (through
`run_benchmark`) and its worked examples; a bad value is refused, and the worked examples batched are the same
worked examples (slow: two passes of ten chats on the tiny model)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from geopilot.demo import pipeline
from geopilot.demo.settings import DemoSettings, Layout


def test_eval_batch_size_defaults_to_one_at_a_time_and_refuses_less_than_one():
    assert DemoSettings().eval_batch_size == 1 and DemoSettings(eval_batch_size=16).eval_batch_size == 16
    with pytest.raises(ValidationError, match="eval_batch_size"):
        DemoSettings(eval_batch_size=0)
    assert DemoSettings(eval_batch_size=4).fingerprint() != DemoSettings().fingerprint()  # never one folder


@pytest.mark.slow
def test_the_worked_examples_batched_are_the_worked_examples_one_at_a_time(tmp_path, tiny_model_dir):
    worked = {}
    for size in (1, 4):  # chunks of 4, 4 and 2 of the ten examples
        layout = Layout(tmp_path / str(size))
        layout.out.mkdir()
        layout.model.symlink_to(tiny_model_dir)
        settings = DemoSettings.preset(quick=True).model_copy(update={"eval_batch_size": size})
        seen = []
        worked[size] = pipeline.run_examples(
            layout, settings, lambda done, total, seen=seen: seen.append((done, total))
        )
        assert seen == [(i, 10) for i in range(1, 11)]
        assert sorted(p.name for p in layout.examples.iterdir()) == sorted(
            w["picture"] for w in worked[size]["examples"]
        )
    assert len(worked[1]["examples"]) == 10 and worked[4] == worked[1]
