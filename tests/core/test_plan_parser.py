"""Plan parsing: strict JSON, tolerant recovery, LLaVA-Plus's format, and the contract (a plan or PlanParseError)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geopilot.plan_parser import PlanParseError, parse_plan
from geopilot.sample import Action, AssistantMessage
from geopilot.wire import assistant_json

CALL = AssistantMessage(
    reasoning="Count them.", actions=[Action(tool="detect_objects", params={"categories": ["plane"]})]
)


def test_strict_wire_json_round_trips():
    parsed = parse_plan(assistant_json(CALL))
    assert parsed.method == "strict" and parsed.plan == CALL
    direct = parse_plan('{"reasoning":"r","actions":[],"value":"7 planes"}')
    assert direct.plan.value == "7 planes" and direct.plan.actions == []


@pytest.mark.parametrize(
    "text",
    [
        'Sure! {"reasoning":"Count them.","actions":[{"tool":"detect_objects","params":{"categories":["plane"]}}],"value":null} Done.',
        "{'reasoning': 'Count them.', 'actions': [{'tool': 'detect_objects', 'params': {'categories': ['plane']}}], 'value': null}",
        '{"reasoning":"Count them.","actions":[{"tool":"detect_objects","params":{"categories":["plane",],},},],"value":null,}',
        '```json\n{"reasoning": "Count them.", "actions": {"tool": "detect_objects", "params": {"categories": ["plane"]}}}\n```',
    ],
    ids=["surrounding-text", "single-quotes", "trailing-commas", "fenced-single-action"],
)
def test_tolerant_recovery(text):
    parsed = parse_plan(text)
    assert parsed.method == "recovered" and parsed.plan == CALL


def test_llava_plus_emoji_format():
    text = (
        '"thoughts🤔" Count them.\n"actions🚀" [{"API_name": "detect_objects", "API_params": {"categories": ["plane"]}}]\n'
        '"value👉" I will use detect_objects to help to answer the question. Please wait for a moment.\n'
    )
    parsed = parse_plan(text)
    assert (
        parsed.method == "llava_plus" and parsed.plan.actions == CALL.actions and parsed.plan.reasoning == "Count them."
    )
    single_quoted = "\"thoughts🤔\" t\n\"actions🚀\" [{'API_name': 'detect_objects', 'API_params': {'categories': ['plane']}}]\n\"value👉\" v"
    assert parse_plan(single_quoted).plan.actions == CALL.actions
    answer = parse_plan('"thoughts🤔" Easy.\n"actions🚀" []\n"value👉" Seven planes.')
    assert answer.plan.actions == [] and answer.plan.value == "Seven planes."


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty"),
        ("   ", "empty"),
        ("there are seven planes", "no JSON object"),
        ('{"reasoning": "r", "actions": [], "value": null}', "no actions and no value"),
        ('{"actions": "detect_objects"}', "expected a list"),
        ('{"actions": [{"params": {}}]}', "no tool name"),
        ('{"actions": [{"tool": "x", "params": [1]}]}', "expected an object"),
        ('{"actions": [], "value": {"a": 1}}', "expected a string or null"),
        ('{"reasoning": "r", "actions": [{"tool": "detect_', "no JSON object"),
        ("[1, 2, 3]", "no JSON object"),
        ("{" * 5000, "no JSON object"),
        ("x" * 60_000, "characters long"),
    ],
)
def test_unusable_text_raises_one_clear_error(text, message):
    with pytest.raises(PlanParseError, match=message):
        parse_plan(text)


def test_numbers_as_values_become_text():
    assert parse_plan('{"actions": [], "value": 7}').plan.value == "7"


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_contract_over_any_text(text):
    try:
        parsed = parse_plan(text)
    except PlanParseError:
        return
    assert isinstance(parsed.plan, AssistantMessage) and (parsed.plan.actions or parsed.plan.value)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["reasoning", "actions", "value", "tool", "params", "x"]), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(JSONISH, st.text(max_size=5), st.text(max_size=5))
def test_contract_over_json_shaped_text(obj, before, after):
    text = before + json.dumps(obj) + after
    try:
        parse_plan(text)
    except PlanParseError:
        pass
