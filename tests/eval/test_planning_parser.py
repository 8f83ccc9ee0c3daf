"""Golden tests of the universal tool-call parser: every dialect, and malformed input of each."""

from __future__ import annotations

import json

import pytest

from geopilot.eval.tool_calls import Call, parse_reply

ROADS = [Call("extract_roads", {})]
PLANES = [Call("detect_objects", {"categories": ["plane"]})]


@pytest.mark.parametrize(
    ("text", "dialect", "calls", "answer"),
    [
        (
            '{"reasoning":"r","actions":[{"tool":"detect_objects","params":{"categories":["plane"]}}],"value":null}',
            "geopilot_json",
            PLANES,
            None,
        ),
        (
            'Sure! {"reasoning": "r", "actions": [{"tool": "extract_roads", "params": {},},], "value": null} done',
            "geopilot_json",
            ROADS,
            None,
        ),  # recovered: surrounding text, trailing commas
        ('{"reasoning": "no tool needed", "actions": [], "value": "Farmland."}', "geopilot_json", [], "Farmland."),
        (
            '"thoughts🤔" roads "actions🚀" [{"API_name": "extract_roads", "API_params": {}}] "value👉" ',
            "llava_plus",
            ROADS,
            None,
        ),
        (
            '<tool_call>{"name": "detect_objects", "arguments": {"categories": ["plane"]}}</tool_call>',
            "hermes",
            PLANES,
            None,
        ),
        (
            'Let me look.\n<tool_call>\n{"name": "extract_roads", "arguments": {}}\n</tool_call>',
            "hermes",
            ROADS,
            "Let me look.",
        ),
        ('<tool_call>{"name": "extract_roads", "arguments": "{}"}</tool_call>', "hermes", ROADS, None),  # string args
        ('```tool_code\ndetect_objects(categories=["plane"])\n```', "tool_code", PLANES, None),
        (
            '```tool_code\n[extract_roads(), detect_objects(categories=["plane"])]\n```',
            "tool_code",
            ROADS + PLANES,
            None,
        ),
        ("<|python_start|>extract_roads()<|python_end|>", "python_call", ROADS, None),
        ('detect_objects(categories=["plane"])', "python_call", PLANES, None),
        ("[extract_roads(), tools.detect_objects(categories=['plane'])]", "python_call", ROADS + PLANES, None),
        ('{"name": "extract_roads", "arguments": {}}', "json_call", ROADS, None),
        (
            "There are three planes near the hangar (I think).",
            "text",
            [],
            "There are three planes near the hangar (I think).",
        ),
    ],
)
def test_dialects(text, dialect, calls, answer):
    parsed = parse_reply(text)
    assert (parsed.dialect, parsed.calls, parsed.answer, parsed.error) == (dialect, calls, answer, None)


def test_openai_tool_calls_win_over_text():
    tool_calls = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "detect_objects", "arguments": json.dumps({"categories": ["plane"]})},
        }
    ]
    parsed = parse_reply("I will detect them.", tool_calls)
    assert parsed.dialect == "openai_tool_calls"
    assert parsed.calls == [Call("detect_objects", {"categories": ["plane"]}, "call_1")]
    assert parsed.answer == "I will detect them."


@pytest.mark.parametrize(
    ("text", "tool_calls", "dialect", "reason"),
    [
        ("", None, "empty", "empty"),
        ("   \n", None, "empty", "empty"),
        (None, None, "empty", "empty"),
        (
            None,
            [{"id": "c", "function": {"name": "extract_roads", "arguments": "{bad"}}],
            "unparsable",
            "not valid JSON",
        ),
        (None, [{"id": "c", "function": {"arguments": "{}"}}], "unparsable", "no tool name"),
        (None, [{"id": "c"}], "unparsable", "no function"),
        (None, [{"id": "c", "function": {"name": "x", "arguments": "[1]"}}], "unparsable", "expected an object"),
        (
            '<tool_call>{"name": "ground", "arguments": {"expression": </tool_call>',
            None,
            "unparsable",
            "not valid JSON",
        ),
        ('<tool_call>{"name": "ground"', None, "unparsable", "not valid JSON"),  # never closed
        ("```tool_code\ndetect_objects(categories=[\n```", None, "unparsable", "syntax error"),
        ('```tool_code\ndetect_objects(["plane"])\n```', None, "unparsable", "positional"),
        ("```tool_code\ndetect_objects(categories=x)\n```", None, "unparsable", "not a literal"),
        ("```tool_code\nx = 1\n```", None, "unparsable", "only hold calls"),
        ("```tool_code\n\n```", None, "unparsable", "empty tool_code"),
        ('{"reasoning": "x", "actions": "detect_all"}', None, "unparsable", "expected a list"),
        ('{"reasoning": "x", "actions": [{"params": {}}], "value": null}', None, "unparsable", "no tool name"),
        ('{"reasoning": "only thinking"}', None, "unparsable", "no actions and no value"),
    ],
)
def test_malformed_is_recorded_not_raised(text, tool_calls, dialect, reason):
    parsed = parse_reply(text, tool_calls)
    assert parsed.dialect == dialect and parsed.calls == [] and not parsed.ok
    assert reason in parsed.error


def test_parser_never_raises_on_junk():
    for junk in ["{" * 5000, "(" * 3000 + ")" * 3000, "```tool_code\n" + "f(" * 500, "<tool_call>" * 100, "\x00\x01"]:
        assert parse_reply(junk).dialect in ("text", "unparsable", "python_call", "tool_code", "hermes")
