"""The agent loop driven by scripted plan texts: every path ends in the documented ChatResult."""

from __future__ import annotations

import json
import time

import pytest
from helpers.scripted import answer, plan

from geopilot.errors import GeoPilotInputError
from geopilot.render import user_turn_text
from geopilot.sample import check_dialogue
from geopilot.tool_output import Detection, ToolOutput
from geopilot.wire import chat_turns, format_tool_turn

QUESTION = "How many planes are on the apron?"


def _tool_turn(results, question=QUESTION) -> str:
    return user_turn_text(format_tool_turn(results, question), first=False)


def test_valid_call_runs_the_tool_and_answers_from_its_output(make_pilot, image):
    pilot, scripts = make_pilot([plan(("detect_objects", {"categories": ["plane"]})), answer("There is 1 plane.")])
    result = pilot.chat(image, QUESTION)
    assert (result.outcome, result.answer, result.error, result.repaired) == ("tools", "There is 1 plane.", None, False)
    [call] = result.tool_calls
    assert (call.tool, call.params, call.error, call.round) == ("detect_objects", {"categories": ["plane"]}, None, 1)
    assert call.output.detections[0].label == "plane"
    expected = ToolOutput(detections=[Detection(label="plane", box=(0.1, 0.2, 0.4, 0.5), score=0.9)])
    assert scripts.fed[0] == [_tool_turn([("detect_objects", expected)])]  # exactly THE formatter's text
    assert [t.kind for t in result.turns] == ["think", "answer"] and result.turns[0].parse == "strict"
    assert result.plans[0].actions[0].tool == "detect_objects"
    check_dialogue(result.messages, image_count=1)  # usable as history
    assert result.timings.total >= result.timings.tools >= 0 and result.tokens.image == pilot.image_tokens


def test_two_calls_in_one_plan_feed_both_outputs_back(make_pilot, image):
    pilot, scripts = make_pilot(
        [
            plan(("detect_objects", {"categories": ["plane", "ship"]}), ("extract_roads", {})),
            answer("2 objects, 2 roads."),
        ]
    )
    result = pilot.chat(image, QUESTION)
    assert result.outcome == "tools" and [c.tool for c in result.tool_calls] == ["detect_objects", "extract_roads"]
    fed = scripts.fed[0][0]
    assert "detect_objects output: " in fed and "extract_roads output: " in fed and '"edges":2' in fed
    assert [m.role for m in result.messages] == ["user", "assistant", "tool", "tool", "assistant"]


def test_unknown_tool_gets_one_repair_turn(make_pilot, image):
    pilot, scripts = make_pilot(
        [plan(("count_planes", {})), plan(("detect_objects", {"categories": ["plane"]})), answer("1.")]
    )
    result = pilot.chat(image, QUESTION)
    assert (result.outcome, result.answer, result.repaired, result.error) == ("tools", "1.", True, None)
    assert result.turns[0].problems and "unknown_tool" in result.turns[0].problems[0]
    assert "Your last reply could not be used: unknown_tool" in scripts.fed[0][0]
    assert [t.kind for t in result.turns] == ["think", "repair", "answer"]


def test_unknown_tool_twice_runs_as_a_failed_call_with_the_error_recorded(make_pilot, image):
    pilot, scripts = make_pilot(
        [plan(("count_planes", {})), plan(("count_planes", {})), answer("The tool is missing.")]
    )
    result = pilot.chat(image, QUESTION)
    assert result.outcome == "tools" and result.answer == "The tool is missing."
    assert result.tool_calls[0].error_kind == "unknown_tool" and "unknown_tool" in result.error
    assert (
        '{"error":"unknown tool' in scripts.fed[0][1]
    )  # the model answered from the error, not from an invented result


def test_bad_params_are_repaired_and_then_reported(make_pilot, image):
    pilot, scripts = make_pilot(
        [plan(("detect_objects", {"categories": "plane"})), plan(("detect_objects", {"cats": ["plane"]})), answer("?")]
    )
    result = pilot.chat(image, QUESTION)
    assert "invalid_params" in scripts.fed[0][0] and "categories" in scripts.fed[0][0]
    assert result.tool_calls[0].error_kind == "invalid_params" and result.repaired and "invalid_params" in result.error


def test_wrong_modality_is_a_validation_problem(make_pilot, image):
    pilot, scripts = make_pilot([plan(("sar_detect_all", {})), answer("I cannot use a SAR tool here.")])
    result = pilot.chat(image, QUESTION, modality="optical")
    assert "wrong_modality" in scripts.fed[0][0] and result.outcome == "direct" and result.repaired
    assert (result.modality, result.modality_source) == ("optical", "declared")
    sar_pilot, _ = make_pilot([plan(("sar_detect_all", {})), answer("One ship.")])
    sar = sar_pilot.chat(image, "Any ships?", modality="sar")
    assert sar.outcome == "tools" and sar.tool_calls[0].output.detections[0].label == "ship" and not sar.repaired


def test_unparsable_text_twice_becomes_the_answer_with_the_error(make_pilot, image):
    pilot, scripts = make_pilot(["there are planes maybe", "still {not json"])
    result = pilot.chat(image, QUESTION)
    assert (result.outcome, result.answer, result.repaired) == ("unparsable", "still {not json", True)
    assert result.error and result.turns[1].parse == "failed" and not result.tool_calls
    assert "no JSON object" in scripts.fed[0][0]
    check_dialogue(result.messages, image_count=1)


def test_unparsable_then_a_direct_answer(make_pilot, image):
    pilot, _ = make_pilot(["<<garbage>>", answer("Seven.", reasoning="I can see them.")])
    result = pilot.chat(image, QUESTION)
    assert (result.outcome, result.answer, result.repaired, result.error) == ("direct", "Seven.", True, None)


def test_tool_timeout_is_captured_and_the_model_answers(make_pilot, image):
    pilot, scripts = make_pilot([plan(("segment_semantic", {})), answer("The tool timed out.")], tool_timeout_s=0.2)
    start = time.perf_counter()
    result = pilot.chat(image, QUESTION)
    assert time.perf_counter() - start < 2.0  # did not wait for the 3 s tool
    assert result.tool_calls[0].error_kind == "timeout" and result.outcome == "tools"
    assert "timed out after 0.2 s" in scripts.fed[0][0]


def test_tool_exception_is_captured(make_pilot, image):
    pilot, scripts = make_pilot([plan(("remove_clouds", {})), answer("Cloud removal failed.")])
    result = pilot.chat(image, QUESTION)
    call = result.tool_calls[0]
    assert call.error_kind == "tool_error" and "backend exploded" in call.error and call.output is None
    assert result.answer == "Cloud removal failed." and "backend exploded" in scripts.fed[0][0]
    # the history re-renders the failed call exactly as the model read it live
    [(_, tool_turn)] = [t for t in chat_turns(result.messages) if t[1].startswith("remove_clouds output:")]
    assert _tool_turn([("remove_clouds", ToolOutput(error=call.error))]) == scripts.fed[0][0]
    assert tool_turn == format_tool_turn([("remove_clouds", ToolOutput(error=call.error))], QUESTION)


def test_no_tool_answer(make_pilot, image):
    pilot, scripts = make_pilot([answer("The scene is an airport.", reasoning="Visible at a glance.")])
    result = pilot.chat(image, "What is this scene?")
    assert (result.outcome, result.answer, result.tool_calls, result.repaired) == (
        "direct",
        "The scene is an airport.",
        [],
        False,
    )
    assert len(result.turns) == 1 and scripts.fed[0] == []


def test_llava_plus_format_is_recovered(make_pilot, image):
    text = '"thoughts🤔" I need the detector.\n"actions🚀" [{"API_name": "detect_objects", "API_params": {"categories": ["plane"]}}]\n"value👉" Wait.'
    pilot, _ = make_pilot([text, answer("1 plane.")])
    result = pilot.chat(image, QUESTION)
    assert result.turns[0].parse == "llava_plus" and result.outcome == "tools" and result.tool_calls[0].error is None


def test_round_limit_then_chaining_with_more_rounds(make_pilot, image):
    script = [plan(("detect_objects", {"categories": ["plane"]})), plan(("extract_roads", {})), answer("Near a road.")]
    pilot, _ = make_pilot(list(script))
    limited = pilot.chat(image, QUESTION, max_rounds=1)
    assert limited.outcome == "round_limit" and "max_rounds=1" in limited.error and len(limited.tool_calls) == 1
    check_dialogue(limited.messages, image_count=1)
    pilot, _ = make_pilot(list(script))
    chained = pilot.chat(image, QUESTION, max_rounds=2)
    assert (
        chained.outcome == "tools"
        and [c.round for c in chained.tool_calls] == [1, 2]
        and chained.answer == "Near a road."
    )


def test_stream_callback_and_iterator_give_the_answer(make_pilot, image):
    pilot, _ = make_pilot([plan(("detect_objects", {"categories": ["plane"]})), answer('One "plane" \\ here.')])
    pieces: list[str] = []
    result = pilot.chat(image, QUESTION, stream=pieces.append)
    assert "".join(pieces) == result.answer == 'One "plane" \\ here.'  # the think turn streams nothing
    pilot, _ = make_pilot([answer("Seven planes.")])
    stream = pilot.chat_stream(image, QUESTION)
    assert "".join(stream) == "Seven planes." and stream.result.answer == "Seven planes."


def test_history_continues_a_chat(make_pilot, image):
    pilot, _ = make_pilot([plan(("detect_objects", {"categories": ["plane"]})), answer("1 plane.")])
    first = pilot.chat(image, QUESTION)
    pilot, scripts = make_pilot([answer("Top left.")])
    second = pilot.chat(
        image, "Where is it?", history=json.loads(json.dumps([m.model_dump(mode="json") for m in first.messages]))
    )
    assert second.answer == "Top left." and len(second.messages) == len(first.messages) + 2
    prompt = pilot.tokenizer.decode(scripts.sessions[0].prompts[0])
    assert "detect_objects output:" in prompt and prompt.rstrip().endswith("USER: Where is it? ASSISTANT:")


@pytest.mark.parametrize(
    "history, message",
    [
        ("not a list", "history must be a list"),
        ([{"role": "user", "content": "<image>\nq"}], "ends with an answer turn"),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "value": "a"}], "must contain '<image>'"),
        ([{"role": "robot", "content": "q"}], "history.0"),
        ([{"role": "user", "content": "<image>\nq"}, {"role": "assistant", "value": "a", "extra": 1}], "history.1"),
        (
            [{"role": "user", "content": "<image>\nq"}, {"role": "assistant", "actions": [{"params": {}}]}],
            "history.1.actions.0.tool: Field required",
        ),
    ],
)
def test_history_in_the_wrong_shape_is_a_clear_input_error(make_pilot, image, history, message):
    pilot, _ = make_pilot([answer("x")])
    with pytest.raises(GeoPilotInputError, match=message):
        pilot.chat(image, QUESTION, history=history)


def test_chat_batch_runs_rows_through_different_paths(make_pilot, image):
    pilot, scripts = make_pilot(
        [answer("Direct.")],
        [plan(("detect_objects", {"categories": ["ship"]})), answer("1 ship.")],
        ["junk", "more junk"],
    )
    results = pilot.chat_batch([{"image": image, "query": q} for q in ("What is it?", "Ships?", "Count?")])
    assert [r.outcome for r in results] == ["direct", "tools", "unparsable"]
    assert results[1].tool_calls[0].output.detections[0].label == "ship" and results[2].answer == "more junk"
    with pytest.raises(GeoPilotInputError, match=r"requests.1.query"):
        pilot.chat_batch([{"image": image, "query": "a"}, {"image": image}])


def test_default_registry_is_built_lazily_and_a_missing_tools_package_is_a_clear_error(tiny, image, monkeypatch):
    import sys

    from geopilot.agent import GeoPilot
    from geopilot.errors import GeoPilotError

    pilot = GeoPilot(tiny[0], tiny[1], tools=None)
    assert "detect_objects" in pilot.tools.names() and len(pilot.tools) == 11  # configs/tools.yaml, no weights loaded
    monkeypatch.setitem(sys.modules, "geopilot.tools.registry", None)  # as if geopilot.tools were not installed
    with pytest.raises(GeoPilotError, match="pass tools=ToolRegistry"):
        GeoPilot(tiny[0], tiny[1], tools=None).chat(image, QUESTION)
