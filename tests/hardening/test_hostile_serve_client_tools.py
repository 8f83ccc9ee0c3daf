"""Issue 37 items 4 and 7 over `geopilot serve` with client-run tools (`--allow-unknown-tools`): every string a client
sends counts against `--max-text-chars`, tool schemas are bounded in depth and size, deep tool results are 400 (not
a 500), the plans in the history are read as strictly as the server's own, and no refusal quotes more than 200
characters of the input. Each case: the HTTP status, a one-line message, nothing in the server's log with a
traceback, and bounded wall time and peak RSS (measured around the request)."""

from __future__ import annotations

import json

import httpx
import pytest
from helpers.bounded import ServerLog, assert_bounded, assert_one_line, measured
from helpers.scripted import Detector, KeywordSession
from helpers.serving import DETECT, KEY, MODEL, client_tool, image_message, nested_schema, serving

from geopilot.json_limits import MAX_SCHEMA_CHARS, MAX_SCHEMA_DEPTH, check_tool_schema
from geopilot.serving.protocol import MAX_TOOLS

AUTH = {"authorization": f"Bearer {KEY}"}
MB = 2**20


@pytest.fixture(scope="module")
def served(tiny):
    """(URL, its log) of a server around a scripted pilot (the Detector as its one tool) that allows untrained
    client tools."""
    from geopilot.agent import GeoPilot
    from geopilot.serving.api import create_app
    from geopilot.serving.config import ServeConfig
    from geopilot.tool_protocol import ToolRegistry

    def factory(batch, pixels, options):
        return KeywordSession(tiny[1].tokenizer, batch, 0.0)

    pilot = GeoPilot(tiny[0], tiny[1], ToolRegistry([Detector(boxes=2)]), session_factory=factory)
    config = ServeConfig(model_name=MODEL, api_key=KEY, allow_unknown_tools=True)
    with serving(create_app(pilot, config)) as base, ServerLog() as log:
        yield base, log


def nested_json(levels: int) -> str:
    return '{"a":' * levels + "1" + "}" * levels


def history(arguments: str = '{"categories": ["plane"]}', name: str = "detect_objects", result: str = "{}") -> list:
    """A conversation whose plan called `name` with `arguments` and got `result` back."""
    call = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}
    return image_message("TOOL: how many?") + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": result},
    ]


def chat(messages: list, tools: list | None = None, **extra) -> dict:
    return {"model": MODEL, "messages": messages, **({"tools": tools} if tools else {}), **extra}


CASES = {
    # item 4: every string counts against --max-text-chars (100,000 by default)
    "15 MB tool description": (
        lambda: chat(image_message("hi"), [client_tool("count_cars", "d" * (15 * MB))]),
        400,
        "context_length_exceeded",
    ),
    "2 MB of tool names and descriptions over 60 tools": (
        lambda: chat(image_message("hi"), [client_tool(f"t{i}", "d" * 35_000) for i in range(60)]),
        400,
        "context_length_exceeded",
    ),
    "a 60,000-character question and a 60,000-character description": (
        lambda: chat(image_message("q" * 60_000), [client_tool("count_cars", "d" * 60_000)]),
        400,
        "context_length_exceeded",
    ),
    "1 MB tool-call name in the history": (
        lambda: chat(history(name="n" * MB), [DETECT]),
        400,
        "context_length_exceeded",
    ),
    "1 MB tool message": (lambda: chat(history(result="r" * MB), [DETECT]), 400, "context_length_exceeded"),
    "1 MB of stop strings": (
        lambda: chat(image_message("hi"), stop=["s" * (MB // 4)] * 4),
        400,
        "context_length_exceeded",
    ),
    # item 4: schema depth and size, tool count
    "schema 40 objects deep": (
        lambda: chat(image_message("hi"), [client_tool("deep", parameters=nested_schema(40))]),
        400,
        None,
    ),
    "schema 3000 levels deep": (  # past what json.dumps (and pydantic-core) recurse through: written as text
        lambda: (
            json.dumps(chat(image_message("hi"), [client_tool("deep", parameters={"type": "object"})]))
            .replace('{"type": "object"}', '{"p":' * 3000 + "1" + "}" * 3000)
            .encode()
        ),
        400,
        None,
    ),
    "schema of 60,000 characters": (
        lambda: chat(
            image_message("hi"),
            [client_tool("wide", parameters={"type": "object", "enum": [f"v{i:05d}" for i in range(6000)]})],
        ),
        400,
        None,
    ),
    f"{MAX_TOOLS + 1} tools": (
        lambda: chat(image_message("hi"), [client_tool(f"t{i}") for i in range(MAX_TOOLS + 1)]),
        400,
        None,
    ),
    "a schema that is not an object": (
        lambda: chat(image_message("hi"), [client_tool("x", parameters=[1])]),
        400,
        None,
    ),
    # item 4: deeply nested tool results and arguments are 400, never a 500
    "tool message JSON 260 levels deep": (lambda: chat(history(result=nested_json(260)), [DETECT]), 400, None),
    "tool message JSON 5000 levels deep": (lambda: chat(history(result=nested_json(5000)), [DETECT]), 400, None),
    "arguments 260 levels deep": (lambda: chat(history(arguments=nested_json(260)), [DETECT]), 400, None),
    "request body 300 levels deep": (
        lambda: chat(image_message("hi"), metadata=json.loads(nested_json(300))),
        400,
        None,
    ),
    # item 7: plans in the history are read as the server's own
    "NaN argument in the history": (lambda: chat(history('{"categories": NaN}'), [DETECT]), 400, None),
    "Infinity argument in the history": (lambda: chat(history('{"x": -Infinity}'), [DETECT]), 400, None),
    "a history call of a tool not offered": (lambda: chat(history(name="rm_rf"), [DETECT]), 400, None),
    "a history call of no tool of GeoPilot's (no tools)": (
        lambda: chat(history(name="rm_rf")[:-1] + [{"role": "user", "content": "and?"}]),
        400,
        None,
    ),
    "an empty tool name in the history": (lambda: chat(history(name=""), [DETECT]), 400, None),
    # item 7: at most 200 characters of the input come back
    "a 90,000-character tool_call_id": (
        lambda: chat(history()[:-1] + [{"role": "tool", "tool_call_id": "i" * 90_000, "content": "{}"}], [DETECT]),
        400,
        None,
    ),
    "a 90,000-character unknown key": (lambda: chat(image_message("hi"), **{"k" * 90_000: 1}), 400, None),
    "a 90,000-character tool_choice name": (
        lambda: chat(
            image_message("hi"), [DETECT], tool_choice={"type": "function", "function": {"name": "c" * 90_000}}
        ),
        400,
        None,
    ),
    "a 90,000-character model name": (lambda: {**chat(image_message("hi")), "model": "m" * 90_000}, 404, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_client_tool_requests_are_refused_in_one_line_within_bounds(served, case):
    url, log = served
    build, status, code = CASES[case]
    body = build()
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    result = measured(
        lambda: httpx.post(
            url + "/v1/chat/completions", content=raw, headers={**AUTH, "content-type": "application/json"}, timeout=60
        )
    )
    reply = result.value
    assert reply.status_code == status, (case, reply.status_code, reply.text[:300])
    error = reply.json()["error"]
    assert_one_line(case, error["message"])
    assert "x" * 201 not in reply.text and not any(c * 201 in reply.text for c in "dnrsikmqc"), case
    if code is not None:
        assert error["code"] == code, (case, error)
    assert_bounded(case, result)
    assert log.tracebacks() == [], case


def test_a_client_tool_round_trip_still_answers_after_the_hostile_set(served):
    url, log = served
    """The ordinary round trip: the plan comes back as tool_calls, its results give the answer."""
    first = httpx.post(
        url + "/v1/chat/completions", json=chat(image_message("TOOL: how many?"), [DETECT]), headers=AUTH
    )
    assert first.status_code == 200, first.text
    message = first.json()["choices"][0]["message"]
    messages = image_message("TOOL: how many?") + [
        message,
        {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": '{"message": "2 planes"}'},
    ]
    final = httpx.post(url + "/v1/chat/completions", json=chat(messages, [DETECT]), headers=AUTH)
    assert final.status_code == 200 and final.json()["choices"][0]["message"]["content"] == "There are 2 planes."
    assert log.tracebacks() == []


def test_the_schema_check_is_one_public_function_with_limits_that_hold():
    from geopilot.errors import GeoPilotInputError
    from geopilot.json_limits import loads

    for text in ('{"x": NaN}', '{"x": -Infinity}', nested_json(65), "[" * 100_000 + "]" * 100_000):
        with pytest.raises(GeoPilotInputError, match="arguments: "):
            loads(text, "arguments")
    assert loads(nested_json(63), "arguments")

    check_tool_schema(nested_schema(MAX_SCHEMA_DEPTH // 2 - 1))
    check_tool_schema({"type": "object", "description": "d" * (MAX_SCHEMA_CHARS - 100)})
    for bad, needle in (
        (nested_schema(MAX_SCHEMA_DEPTH), "levels deep"),
        (nested_schema(100_000), "levels deep"),  # walked without recursion
        ({"type": "object", "description": "d" * MAX_SCHEMA_CHARS}, "characters of JSON"),
        ("string", "must be a JSON Schema object"),
        ({"type": "number", "maximum": float("nan")}, "not JSON"),
    ):
        with pytest.raises(GeoPilotInputError, match=needle):
            check_tool_schema(bad, "tools.0.function.parameters")
