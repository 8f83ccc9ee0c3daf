"""Validators: each failure kind is caught and named by its cause; a faithful reply passes."""

from __future__ import annotations

import random

import pytest
from helpers.traces import optical_records, sar_records

from geopilot.data_gen.abilities import plan_target
from geopilot.data_gen.validate import (
    AnswerReply,
    PlanReply,
    check_answer,
    check_coordinates,
    check_plan,
    parse_reply,
)
from geopilot.sample import Action
from geopilot.tools.annotations import AnnotationBackend
from geopilot.tools.registry import build_registry


@pytest.fixture()
def registry(tmp_path):
    """What the generator validates plans with: the tool registry built with the annotation backend."""
    return build_registry(annotations=optical_records(tmp_path)[1], annotations_root=tmp_path)


@pytest.fixture()
def detection(tmp_path):
    record = optical_records(tmp_path)[1]  # two planes and a storage tank
    target = plan_target("object_detection", record, random.Random(0))
    target.params = {"categories": ["plane"]}
    return record, target


def causes(failures) -> set[str]:
    return {f.cause for f in failures}


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        ("Sure! Here is the query you asked for.", "prose"),
        ('{"query": "How many planes?", "reasoning": "x", "actions": [', "malformed_json"),
        ('{"query": "How many planes?"}', "reply_schema"),
        ("[1, 2]", "prose"),
    ],
)
def test_unusable_replies_are_named(text, cause):
    reply, failure = parse_reply("plan", text)
    assert reply is None and failure.cause == cause


def test_fenced_json_is_accepted():
    reply, failure = parse_reply("answer", '```json\n{"reasoning": "r", "answer": "There are 2 planes."}\n```')
    assert failure is None and reply.answer == "There are 2 planes."


@pytest.mark.parametrize(
    "box", ["[0.1, 0.2, 1.3, 0.4]", "[-0.1, 0.2, 0.3, 0.4]", "[0.5, 0.2, 0.3, 0.4]", "[0.1, 0.4, 0.3, 0.4]"]
)
def test_coordinates_outside_unit_square_or_unordered(box):
    assert causes(check_coordinates(f"The plane is at {box}.")) == {"coordinates"}


def test_good_plan_passes(detection, registry):
    record, target = detection
    reply = PlanReply(
        query="How many planes are parked here?",
        reasoning="Counting needs a detector.",
        actions=[Action(tool="detect_objects", params={"categories": ["planes"]})],
    )
    assert check_plan(reply, target, record.modality, registry) == []


def test_plan_failures_by_dimension(detection, registry, tmp_path):
    record, target = detection

    def plan(query="How many planes are there?", tool="detect_objects", params=None, actions=None):
        actions = (
            actions
            if actions is not None
            else [Action(tool=tool, params=params if params is not None else {"categories": ["plane"]})]
        )
        return causes(
            check_plan(PlanReply(query=query, reasoning="r", actions=actions), target, record.modality, registry)
        )

    assert plan(tool="sar_detect_all", params={}) == {"tool_source", "tool_call_correctness", "parameter_consistency"}
    assert "param_schema" in plan(params={"categories": []})
    assert "param_schema" in plan(params={"categories": ["plane"], "colour": "red"})
    assert plan(tool="detect_all", params={}) == {"tool_call_correctness", "parameter_consistency"}
    assert plan(params={"categories": ["ship"]}) == {"parameter_consistency"}
    assert plan(params={"categories": "plane"}) == {"param_schema", "parameter_consistency"}
    assert plan(params={"categories": [1, 2]}) == {"param_schema", "parameter_consistency"}
    assert plan(params={"categories": ["plane"], "score_threshold": 2}) == {"param_schema"}
    assert plan(query="What is in this picture?") == {"query_answerability"}
    assert plan(query="Find the planes at [0.1, 0.1, 0.2, 0.25].") == {"query_answerability"}
    assert plan(actions=[]) == {"tool_call_correctness"}
    # SAR tools only for SAR records, optical tools only for optical ones
    sar = sar_records(tmp_path)[0]
    sar_target = plan_target("panoptic_detection", sar, random.Random(0))
    reply = PlanReply(query="What objects are in this SAR image?", reasoning="r", actions=[Action(tool="detect_all")])
    assert "tool_source" in causes(check_plan(reply, sar_target, "sar", registry))


def test_answer_faithfulness(detection):
    record, target = detection
    output = AnnotationBackend(record).call("detect_objects", {"categories": ["plane"]})
    names = {"plane", "storage tank"}
    query = "How many planes are there?"

    def answer(text: str) -> set[str]:
        return causes(
            check_answer(AnswerReply(reasoning="From the output.", answer=text), output, target, names, query)
        )

    assert answer("There are 2 planes, at [0.1, 0.1, 0.2, 0.25] and [0.3, 0.3, 0.4, 0.45].") == set()
    assert answer("There are two planes.") == set()
    assert answer("There are 3 planes.") == {"final_answer_faithfulness"}  # count
    # a category that is not in the output
    assert answer("There are 2 planes and a storage tank.") == {"final_answer_faithfulness"}
    # a box that is not in the output
    assert answer("There are 2 planes; one is at [0.5, 0.5, 0.6, 0.6].") == {"final_answer_faithfulness"}
    assert answer("The planes are at [0.1, 0.1, 1.2, 0.25].") == {"coordinates", "final_answer_faithfulness"}
    assert answer("The image shows an airport.") == {"final_answer_faithfulness"}  # neither count nor location
    empty = AnnotationBackend(record).call("detect_objects", {"categories": ["ship"]})
    target.params = {"categories": ["ship"]}
    reply = AnswerReply(reasoning="r", answer="I found no ships in this image.")
    assert check_answer(reply, empty, target, names, "Any ships?") == []
    reply = AnswerReply(reasoning="r", answer="There are ships in this image.")
    assert causes(check_answer(reply, empty, target, names, "Any ships?")) == {"final_answer_faithfulness"}


def test_area_percentages_must_match(tmp_path):
    from helpers.traces import semantic_record

    record = semantic_record(tmp_path)
    target = plan_target("semantic_segmentation", record, random.Random(0))
    target.params = {"classes": ["rangeland", "water"]}
    output = AnnotationBackend(record, root=tmp_path).call("segment_semantic", target.params)
    names = {"rangeland", "water", "bareland", "building"}
    good = AnswerReply(reasoning="r", answer="Rangeland covers 50.0% of the image; water covers 12.5%.")
    assert check_answer(good, output, target, names, "How much rangeland and water?") == []
    bad = AnswerReply(reasoning="r", answer="Rangeland covers 40% of the image; water covers 12.5%.")
    faithful = "final_answer_faithfulness"
    assert causes(check_answer(bad, output, target, names, "How much rangeland and water?")) == {faithful}
    hallucinated = AnswerReply(reasoning="r", answer="Rangeland covers 50.0% and buildings the rest.")
    assert causes(check_answer(hallucinated, output, target, names, "How much rangeland?")) == {faithful}
