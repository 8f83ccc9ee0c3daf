"""The `geopilot` lmms-eval model class in process on the tiny model: `until` and `max_new_tokens` honoured, batches
answered in request order, a GeoPilot task's doc answered with the whole run, bad `--model_args` refused. Needs
lmms-eval (the `lmms` extra; .ci/run runs this file with .venv-lmms's python)."""

from __future__ import annotations

import json

import pytest
from PIL import Image

pytest.importorskip("lmms_eval")

from lmms_eval.api.instance import Instance  # noqa: E402

from geopilot.errors import GeoPilotInputError  # noqa: E402
from geopilot.eval.lmms_docs import RECORD_KEY, REQUEST_KEY  # noqa: E402
from geopilot.eval.lmms_model import GeoPilotLMMS, manifest  # noqa: E402

pytestmark = pytest.mark.slow
TASK = "any_task"


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    lmm = GeoPilotLMMS(pretrained=str(tiny_model_dir), agentic="false", device="cpu", batch_size=2)
    colours = ["red", "green", "blue"]
    docs = [{"picture": Image.new("RGB", (32, 32), c)} for c in colours]
    lmm.task_dict = {TASK: {"test": docs}}
    return lmm


def requests(gen_kwargs: dict, ids=(0, 1, 2)) -> list[Instance]:
    def visual(doc):
        return [doc["picture"]]

    metadata = {"task": TASK, "doc_id": 0, "repeats": 1}
    return [
        Instance("generate_until", ("Describe the scene.", dict(gen_kwargs), visual, i, TASK, "test"), i, metadata)
        for i in ids
    ]


def test_the_manifest_names_this_class():
    assert manifest().model_id == "geopilot"
    assert manifest().simple_class_path == "geopilot.eval.lmms_model.GeoPilotLMMS"


def test_until_and_max_new_tokens_are_honoured_in_batches(model):
    long = model.generate_until(requests({"max_new_tokens": 24}))
    assert len(long) == 3 and all(isinstance(r, str) for r in long)
    short = model.generate_until(requests({"max_new_tokens": 3}))
    assert all(lg.startswith(s.rstrip("\ufffd")) for s, lg in zip(short, long, strict=True))  # greedy: a prefix
    assert sum(map(len, short)) < sum(map(len, long))
    text = next(r for r in long if len(r.strip()) > 4).strip()
    stop = text[2:4]
    cut = model.generate_until(requests({"max_new_tokens": 24, "until": [stop]}))
    assert [r.find(stop) for r in cut] == [-1, -1, -1]
    assert cut == [r[: r.find(stop)] if stop in r else r for r in long]


def test_a_batch_keeps_request_order(model):
    together = model.generate_until(requests({"max_new_tokens": 6}, ids=(2, 0, 1)))
    alone = [model.generate_until(requests({"max_new_tokens": 6}, ids=(i,)))[0] for i in (2, 0, 1)]
    assert len(together) == 3 and all(isinstance(r, str) for r in together)
    assert together[2] == alone[2]  # id 1 is the last batch's only row: its reply lands in its request's place


def test_bad_model_args_are_refused_with_the_path(tmp_path, tiny_model_dir):
    with pytest.raises(GeoPilotInputError, match=f"pretrained={tmp_path}: not a GeoPilot export"):
        GeoPilotLMMS(pretrained=str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(GeoPilotInputError, match=f"pretrained={tmp_path}: not a GeoPilot export"):
        GeoPilotLMMS(pretrained=str(tmp_path), device="cpu")
    with pytest.raises(GeoPilotInputError, match="unknown for geopilot: colour"):
        GeoPilotLMMS(pretrained=str(tiny_model_dir), colour="red")
    with pytest.raises(GeoPilotInputError, match="agentic='maybe'"):
        GeoPilotLMMS(pretrained=str(tiny_model_dir), agentic="maybe", device="cpu")


def test_an_agentic_run_answers_a_geopilot_doc_with_the_whole_record(tiny_model_dir, tmp_path):
    image = tmp_path / "scene.png"
    Image.new("RGB", (32, 32), "grey").save(image)
    lmm = GeoPilotLMMS(pretrained=str(tiny_model_dir), device="cpu")
    request = {"image": str(image), "query": "Is there a ship?", "modality": "optical"}
    lmm.task_dict = {TASK: {"test": [{REQUEST_KEY: json.dumps(request), "id": "q1"}]}}
    reply = lmm.generate_until(requests({"max_new_tokens": 6, "until": ["e"]}, ids=(0,)))[0]
    record = json.loads(reply)[RECORD_KEY]  # not cut at "e": a run is not text
    assert record["id"] == "q1" and {"answer", "outcome", "tool_calls"} <= set(record)


def test_every_visual_of_a_generic_doc_reaches_the_model(tiny_model_dir, caplog):
    red, blue = Image.new("RGB", (32, 32), "red"), Image.new("RGB", (32, 32), "blue")
    small = Image.new("RGB", (16, 16), "red")
    lmm = GeoPilotLMMS(pretrained=str(tiny_model_dir), agentic="false", device="cpu")
    lmm.task_dict = {TASK: {"test": [{"picture": [red]}, {"picture": [red, blue]}, {"picture": [red, small]}]}}
    metadata = {"task": TASK, "doc_id": 0, "repeats": 1}
    asked = [
        Instance(
            "generate_until",
            ("Compare.", {"max_new_tokens": 24}, lambda doc: doc["picture"], i, TASK, "test"),
            i,
            metadata,
        )
        for i in range(3)
    ]
    assert [len(lmm._chat_request(r)["image"]) for r in asked] == [1, 2, 2]

    one, pair = lmm.pilot.chat_batch([lmm._chat_request(r) for r in asked[:2]], 0, {"max_new_tokens": 24})
    assert pair.tokens.prompt > one.tokens.prompt  # the second image's tokens are in the prompt
    with caplog.at_level("WARNING"):
        replies = lmm.generate_until(asked)
    assert replies[1] == pair.turns[0].text
    assert replies[2] == "" and "16x16 px but image 1 is 32x32" in caplog.text  # refused, and the log says why
