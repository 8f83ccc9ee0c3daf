"""Client-run tools over the OpenAI protocol (issue 25 item 1): `tools` -> the plan as `message.tool_calls`, the
client's `role: "tool"` results -> the answer; tool_choice; streaming deltas; bad tool messages are 400; a client that
never brings the results back costs its prefix-cache entry until the TTL."""

from __future__ import annotations

import json

import httpx
import pytest
from helpers.serving import DETECT, KEY, MODEL, image_message
from openai import APIError, BadRequestError

from geopilot.render import render_turns
from geopilot.sample import AssistantMessage, ToolMessage, UserMessage
from geopilot.tool_output import Detection, ToolOutput
from geopilot.wire import chat_turns

OUTPUT = ToolOutput(detections=[Detection(label="plane", box=(0.1, 0.2, 0.3, 0.4), score=0.9)])


def answer_messages(question: str, reply, output: ToolOutput = OUTPUT) -> list[dict]:
    message = reply.choices[0].message
    return image_message(question) + [
        {"role": "assistant", "content": message.content, "tool_calls": [c.model_dump() for c in message.tool_calls]},
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": output.model_dump_json()},
    ]


def test_the_plan_comes_back_as_tool_calls_and_the_results_give_the_answer(recording, tiny):
    client, seen = recording()
    reply = client.chat.completions.create(model=MODEL, messages=image_message("TOOL: how many?"), tools=[DETECT])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "detect_objects"
    assert json.loads(call.function.arguments) == {"categories": ["plane"]}
    assert choice.message.content == "Counting needs the detector."
    assert reply.model_extra["geopilot"]["tool_calls"] == []  # nothing ran on the server

    final = client.chat.completions.create(
        model=MODEL, messages=answer_messages("TOOL: how many?", reply), tools=[DETECT]
    )
    assert final.choices[0].finish_reason == "stop" and final.choices[0].message.content == "There are 2 planes."
    assert final.model_extra["geopilot"]["result"]["outcome"] == "tools"
    # the answer turn read the tool turn exactly as THE formatter writes it for a call run in process
    expected = [
        UserMessage(content="<image>\nTOOL: how many?"),
        AssistantMessage(
            reasoning="Counting needs the detector.",
            actions=[{"tool": "detect_objects", "params": {"categories": ["plane"]}}],
        ),
        ToolMessage(name="detect_objects", content=OUTPUT),
    ]
    image_tokens = GeoPilotImageTokens(tiny)
    assert seen[-1][0] == render_turns(chat_turns(expected), tiny[1].tokenizer, image_tokens).input_ids


def GeoPilotImageTokens(tiny) -> int:  # noqa: N802 - reads as the value it is
    from geopilot.model import num_image_tokens

    return num_image_tokens(tiny[0].config)


def test_tool_choice_none_answers_directly_and_required_asks_for_a_call(recording):
    client, _ = recording()
    # the scripted model plans a call: under "none" that plan is repaired into an answer
    direct = client.chat.completions.create(
        model=MODEL, messages=image_message("TOOL: how many?"), tools=[DETECT], tool_choice="none"
    )
    result = direct.model_extra["geopilot"]["result"]
    assert direct.choices[0].finish_reason == "stop" and direct.choices[0].message.tool_calls is None
    assert result["repaired"] and "must not call a tool" in result["turns"][0]["problems"][0]
    # it answers directly: under "required" (and a named function) it is asked for the call; still none -> recorded
    for choice in ("required", {"type": "function", "function": {"name": "detect_objects"}}):
        forced = client.chat.completions.create(
            model=MODEL, messages=image_message("what is this?"), tools=[DETECT], tool_choice=choice
        )
        result = forced.model_extra["geopilot"]["result"]
        assert result["repaired"] and "must call detect_objects" in result["error"]
    named = client.chat.completions.create(
        model=MODEL,
        messages=image_message("TOOL: how many?"),
        tools=[DETECT],
        tool_choice={"type": "function", "function": {"name": "detect_objects"}},
    )
    assert named.choices[0].finish_reason == "tool_calls"


def test_streaming_sends_tool_calls_as_deltas(recording):
    client, _ = recording()
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=image_message("TOOL: how many?"),
            tools=[DETECT],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [d.tool_calls[0] for d in deltas if d.tool_calls]
    assert calls[0].index == 0 and calls[0].id.startswith("call_") and calls[0].function.name == "detect_objects"
    assert calls[0].function.arguments == "" and all(c.id is None and c.function.name is None for c in calls[1:])
    assert json.loads("".join(c.function.arguments for c in calls)) == {"categories": ["plane"]}
    assert "".join(d.content or "" for d in deltas) == "Counting needs the detector."
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "tool_calls" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0  # include_usage's own chunk
    # the SDK's accumulating helper reads the same stream into one message
    with client.chat.completions.stream(
        model=MODEL, messages=image_message("TOOL: how many?"), tools=[DETECT]
    ) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.name == "detect_objects"


def test_unknown_tools_are_refused_unless_allowed_and_then_described_in_the_system_prompt(recording, tiny):
    other = {"type": "function", "function": {"name": "count_cars", "parameters": {"type": "object"}}}
    client, _ = recording()
    with pytest.raises(BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=image_message("hi"), tools=[DETECT, other])
    assert "count_cars" in refused.value.message and "detect_objects" in refused.value.message
    allowing, seen = recording(allow_unknown_tools=True)
    allowing.chat.completions.create(model=MODEL, messages=image_message("hi"), tools=[DETECT, other])
    text = tiny[1].tokenizer.decode(seen[-1][0])
    assert "count_cars" in text and "not trained" in text


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ([{"role": "tool", "tool_call_id": "call_x", "content": "{}"}], "must follow the assistant message"),
        (
            [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "call_a", "type": "function", "function": {"name": "detect_objects", "arguments": "{}"}}
                    ],
                },
                {"role": "tool", "tool_call_id": "call_b", "content": "{}"},
            ],
            "'call_b' matches no call",
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_a",
                            "type": "function",
                            "function": {"name": "detect_objects", "arguments": "{cat"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_a", "content": "{}"},
            ],
            "arguments: not JSON",
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "call_a", "type": "function", "function": {"name": "detect_objects", "arguments": "{}"}}
                    ],
                }
            ],
            "no tool message answers the call(s) 'call_a'",
        ),
    ],
)
def test_bad_tool_messages_are_400_naming_the_message(recording, extra, needle):
    client, _ = recording()
    with pytest.raises(BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=image_message("TOOL: n?") + extra, tools=[DETECT])
    assert needle in refused.value.message and refused.value.param.startswith("messages.")


def test_tool_results_over_the_context_are_refused_and_without_tools_too(recording, tiny):
    client, _ = recording()
    reply = client.chat.completions.create(model=MODEL, messages=image_message("TOOL: how many?"), tools=[DETECT])
    huge = ToolOutput(message="plane " * 6000)  # far past the tiny model's context
    with pytest.raises(BadRequestError) as refused:
        client.chat.completions.create(
            model=MODEL, messages=answer_messages("TOOL: how many?", reply, huge), tools=[DETECT]
        )
    assert "over the model's context" in refused.value.message and "tool results" in refused.value.message
    with pytest.raises(APIError) as streamed:  # streaming: the SSE error event the SDK raises, after the role chunk
        list(
            client.chat.completions.create(
                model=MODEL, messages=answer_messages("TOOL: how many?", reply, huge), tools=[DETECT], stream=True
            )
        )
    assert "over the model's context" in streamed.value.message and "tool results" in streamed.value.message
    with pytest.raises(BadRequestError) as no_tools:
        client.chat.completions.create(model=MODEL, messages=answer_messages("TOOL: how many?", reply))
    assert "send the tools too" in no_tools.value.message


def test_tool_choice_needs_tools_and_names_one_of_them(recording):
    client, _ = recording()
    url = str(client.base_url).rstrip("/")
    base = {"model": MODEL, "messages": image_message("hi")}
    for extra, field in (
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": [DETECT], "tool_choice": {"type": "function", "function": {"name": "ground"}}}, "tool_choice"),
        ({"tools": []}, "tools"),
    ):
        reply = httpx.post(f"{url}/chat/completions", json=base | extra, headers={"authorization": f"Bearer {KEY}"})
        assert reply.status_code == 400 and reply.json()["error"]["param"] == field


def test_a_client_that_never_returns_the_results_holds_its_entry_until_it_expires(tiny):
    """Real KV sessions (the tiny model) behind the server: the think turn that hands off its call is parked; a
    client that never brings the results costs that entry until the TTL, then it is freed (nothing else holds it);
    a client that comes back later still gets the answer, re-prefilled."""
    import gc
    import weakref

    from helpers.scripted import SlowTool
    from helpers.serving import serving
    from openai import OpenAI

    from geopilot.agent import GeoPilot, PrefixCache
    from geopilot.serving.api import create_app
    from geopilot.serving.config import ServeConfig
    from geopilot.tool_protocol import ToolRegistry

    now, parked = [0.0], []

    class Watched(PrefixCache):
        def park(self, key, entry):
            parked.append(weakref.ref(entry[0]))  # the parked KVSession (its cache tensors)
            super().park(key, entry)

    cache = Watched(ttl_s=60.0, clock=lambda: now[0])
    pilot = GeoPilot(tiny[0], tiny[1], ToolRegistry([SlowTool(0.6)]), prefix_cache=cache)
    tool = {"type": "function", "function": {"name": "segment_semantic", "parameters": {"type": "object"}}}
    named = {"type": "function", "function": {"name": "segment_semantic"}}
    with serving(create_app(pilot, ServeConfig(model_name=MODEL, api_key=KEY, max_new_tokens=48))) as url:
        client = OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        reply = client.chat.completions.create(
            model=MODEL, messages=image_message("Segment it."), tools=[tool], tool_choice=named
        )
        assert reply.choices[0].finish_reason == "tool_calls" and len(cache) == 1 and parked[0]() is not None
        now[0] = 59.0
        assert len(cache) == 1
        now[0] = 60.0  # the client never came back
        assert len(cache) == 0 and cache.expired == 1
        gc.collect()
        assert parked[0]() is None
        late = client.chat.completions.create(
            model=MODEL, messages=answer_messages("Segment it.", reply, ToolOutput(message="done")), tools=[tool]
        )
    result = late.model_extra["geopilot"]["result"]
    assert late.choices[0].finish_reason in ("stop", "tool_calls") and result["turns"][0]["kind"] == "answer"
    assert cache.hits == 0 and cache.misses == 1
    assert result["turns"][0]["new_input_tokens"] > reply.model_extra["geopilot"]["result"]["tokens"]["input"]
