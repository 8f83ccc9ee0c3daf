"""The sample schema: every kind of sample parses; every kind of bad sample gives one error naming id, line, field."""

from __future__ import annotations

import json
import re

import pytest
from helpers.samples import ALL_KINDS, one_tool_call

from geopilot.errors import SampleError
from geopilot.sample import LoadReport, load_samples, parse_sample, write_samples


@pytest.mark.parametrize("kind", list(ALL_KINDS))
def test_every_kind_parses_and_round_trips(kind, tmp_path):
    sample = parse_sample(ALL_KINDS[kind]())
    path = tmp_path / "s.jsonl"
    write_samples([sample], path)
    assert list(load_samples(path)) == [sample]


def _bad(mutate) -> dict:
    data = one_tool_call()
    mutate(data)
    return data


BAD_SAMPLES = {
    "unknown role": (lambda d: d["messages"][1].update(role="robot"), "messages.1"),
    "actions not a list": (lambda d: d["messages"][1].update(actions={"tool": "x"}), "messages.1.actions"),
    "box outside [0, 1]": (
        lambda d: d["messages"][2]["content"]["detections"][0].update(box=[0.1, 0.2, 1.3, 0.4]),
        "messages.2.content.detections.0.box",
    ),
    "box with x1 > x2": (
        lambda d: d["messages"][2]["content"]["detections"][0].update(box=[0.5, 0.2, 0.3, 0.4]),
        "messages.2.content.detections.0.box",
    ),
    "missing image placeholder": (lambda d: d["messages"][0].update(content="How many planes?"), "messages.0.content"),
    "tool turn for the wrong tool": (lambda d: d["messages"][2].update(name="ground"), "messages.2.name"),
    "action without a tool name": (lambda d: d["messages"][1]["actions"][0].pop("tool"), "messages.1.actions.0.tool"),
    "ends with a think turn": (lambda d: d["messages"].pop(), "messages.2"),
    "unknown top-level key": (lambda d: d.update(imag="x.png"), "imag"),
    "bad modality": (lambda d: d.update(modality="lidar"), "modality"),
    "polygon with two points": (
        lambda d: d["messages"][2]["content"]["detections"][0].update(polygon=[[0.1, 0.1], [0.2, 0.2]]),
        "messages.2.content.detections.0",
    ),
}


@pytest.mark.parametrize("case", list(BAD_SAMPLES))
def test_bad_sample_names_id_line_and_field(case, tmp_path):
    mutate, field = BAD_SAMPLES[case]
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(one_tool_call()) + "\n" + json.dumps(_bad(mutate)) + "\n")
    with pytest.raises(SampleError) as info:
        list(load_samples(path))
    message = str(info.value)
    assert "line 2" in message and "dota/P0001/object_detection/0" in message
    assert info.value.field is None or info.value.field.startswith(field.split(".")[0])
    assert field in message, message


def test_invalid_json_line_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(one_tool_call()) + "\n{not json\n")
    with pytest.raises(SampleError, match=r"line 2.*not valid JSON"):
        list(load_samples(path))


def test_skip_mode_counts_bad_lines(tmp_path):
    path = tmp_path / "mixed.jsonl"
    good = json.dumps(one_tool_call())
    path.write_text("\n".join([good, "{oops", json.dumps(_bad(BAD_SAMPLES["unknown role"][0])), "", good]) + "\n")
    report = LoadReport()
    samples = list(load_samples(path, on_error="skip", report=report))
    assert len(samples) == 2 and report.loaded == 2 and report.skipped == 2
    assert sum(report.causes.values()) == 2 and len(report.errors) == 2


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(SampleError, match="not found"):
        list(load_samples(tmp_path / "nope.jsonl"))


def test_image_path_is_relative_to_the_jsonl_folder(tmp_path):
    sample = parse_sample(one_tool_call())
    assert sample.image_path(tmp_path) == tmp_path / "images" / "P0001.png"


def _two_image_sample(content: str, **extra) -> dict:
    return {
        "id": "pair-1",
        "images": ["before.png", "after.png"],
        "messages": [{"role": "user", "content": content}, {"role": "assistant", "value": "Two new buildings."}],
        **extra,
    }


def test_a_two_image_sample_keeps_its_images_in_order(tmp_path):
    sample = parse_sample(_two_image_sample("<image>\n<image>\nWhat changed?"))
    assert sample.image_names == ["before.png", "after.png"]
    assert sample.image_paths(tmp_path) == [tmp_path / "before.png", tmp_path / "after.png"]
    assert json.loads(sample.to_json())["images"] == ["before.png", "after.png"]


def test_a_one_image_sample_writes_no_images_key():
    sample = parse_sample({"id": "one", "image": "a.png", "messages": _two_image_sample("<image>\nq")["messages"]})
    assert "images" not in json.loads(sample.to_json()) and sample.image_names == ["a.png"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_two_image_sample("<image>\nWhat changed?"), "2 images need 2 '<image>', found 1"),
        (_two_image_sample("<image><image>\nq", image="x.png"), "either `image` (one) or `images` (several)"),
    ],
)
def test_two_image_samples_are_checked(data, message):
    with pytest.raises(SampleError, match=re.escape(message)):
        parse_sample(data)
