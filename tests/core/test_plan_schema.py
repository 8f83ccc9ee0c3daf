"""Every plan valid by construction (issue 40): the think turn decoded in the grammar compiled from the registry.
An untrained model's first turn parses and validates within max_new_tokens on every path and for every
tool_choice; the HTTP engine sends the same schema; what the grammar cannot hold fails early, in one line."""

from __future__ import annotations

import json
from typing import Annotated

import pytest
from fastapi import FastAPI, Request
from helpers.serving import serving
from pydantic import BaseModel, WithJsonSchema

from geopilot.agent import ClientTools, GeoPilot
from geopilot.agent.plan_schema import PlanConstraint, plan_json_schema
from geopilot.errors import GeoPilotInputError
from geopilot.plan_parser import parse_plan
from geopilot.tool_protocol import ToolRegistry
from geopilot.wire import assistant_json

QUESTIONS = {  # one question per tool of the default registry (the random model ignores them; the grammar does not)
    "detect_objects": "How many planes are parked on the apron?",
    "detect_all": "List every object you can find in this scene.",
    "ground": "Where is the largest ship near the dock?",
    "segment_semantic": "What fraction of the image is water?",
    "segment_instances": "Outline each storage tank.",
    "segment_referring": "Segment the river that crosses the image.",
    "extract_roads": "Trace the road network.",
    "remove_clouds": "Remove the clouds from this image.",
    "sar_detect_all": "Which ships are visible in this SAR scene?",
    "sar_ground": "Locate the bright ship at the harbour entrance in this SAR image.",
}


@pytest.fixture(scope="module")
def default_registry():
    from geopilot.tools.registry import build_registry

    return build_registry()


def valid_plan(text: str, registry: ToolRegistry, constraint: PlanConstraint | None = None):
    """The plan `text` holds, checked as the issue asks: strict JSON with the wire's keys in order, each call a
    registered tool whose params its own model accepts, `tool_choice` kept."""
    parsed = parse_plan(text)
    assert parsed.method == "strict", text
    assert list(json.loads(text)) == ["reasoning", "actions", "value"]
    plan = parsed.plan
    for action in plan.actions:
        registry.get(action.tool).params_model.model_validate(action.params)
    assert (plan.value is None) == bool(plan.actions) and (plan.actions or plan.value)
    if constraint is not None:
        assert constraint.problem(plan) is None, text
    return plan


@pytest.mark.parametrize("max_new_tokens", [40, pytest.param(160, marks=pytest.mark.slow)])
def test_the_untrained_models_first_turn_is_a_valid_plan_on_every_path(tiny, default_registry, image, max_new_tokens):
    pilot = GeoPilot(tiny[0], tiny[1], default_registry)
    generation = {"max_new_tokens": max_new_tokens}
    requests = [{"image": image, "query": q} for q in QUESTIONS.values()]
    batched = pilot.chat_batch(requests, max_rounds=0, generation=generation)  # max_rounds=0: no tool runs
    single = pilot.chat(image, QUESTIONS["ground"], max_rounds=0, generation=generation)
    stream = pilot.chat_stream(image, QUESTIONS["sar_ground"], max_rounds=0, generation=generation)
    list(stream)
    for result in [*batched, single, stream.result]:
        think = result.turns[0]
        assert think.finished and think.generated_tokens < max_new_tokens
        valid_plan(think.text, default_registry)
        assert not think.problems and not result.repaired


def test_a_whole_plan_ends_even_where_min_new_tokens_holds_back_eos(tiny):
    import torch

    from geopilot.agent.plan_schema import PlanGrammars, PlanLogits

    tokenizer = tiny[1].tokenizer
    grammars = PlanGrammars.of(tokenizer, tiny[0].config.text_config.vocab_size)
    steering = PlanLogits(grammars, [PlanConstraint(("detect_objects",))], 512)  # far from its closing window
    prompt = torch.tensor([[1, 2, 3]])
    steering(prompt, torch.zeros(1, grammars.vocab_size))
    plan = tokenizer.encode('{"reasoning":"","actions":[],"value":"two"}', add_special_tokens=False)
    scores = torch.zeros(1, grammars.vocab_size)
    scores[0, grammars.eos] = float("-inf")  # what min_new_tokens does before the grammar
    scores = steering(torch.cat([prompt, torch.tensor([plan])], dim=1), scores)
    assert int(scores.argmax()) == grammars.eos and torch.isinf(scores).sum() == grammars.vocab_size - 1


def test_a_declared_modality_keeps_the_plan_to_its_tools(tiny, default_registry, image):
    result = GeoPilot(tiny[0], tiny[1], default_registry).chat(
        image, QUESTIONS["sar_detect_all"], max_rounds=0, generation={"max_new_tokens": 80}, modality="sar"
    )
    plan = valid_plan(result.turns[0].text, default_registry)
    assert all(default_registry.get(a.tool).modality == "sar" for a in plan.actions)


@pytest.mark.parametrize(
    ("choice", "parallel"),
    [("none", True), ("auto", True), ("required", True), ("ground", True), ("required", False), ("auto", False)],
)
def test_every_tool_choice_is_held_by_the_grammar(tiny, default_registry, image, choice, parallel):
    offered = ("detect_objects", "ground", "segment_semantic")
    tools = ClientTools(offered, choice=choice, parallel=parallel)
    constraint = tools.constraint(default_registry)
    pilot = GeoPilot(tiny[0], tiny[1], default_registry)
    for question in (QUESTIONS["detect_objects"], QUESTIONS["segment_semantic"]):
        result = pilot.chat(image, question, generation={"max_new_tokens": 64}, client_tools=tools)
        plan = valid_plan(result.turns[0].text, default_registry, constraint)
        assert not result.repaired and result.turns[0].finished
        assert (result.outcome == "tool_calls") == bool(plan.actions)
        if choice == "none":
            assert not plan.actions
        if choice in ("required", "ground"):
            assert plan.actions
        if choice == "ground":
            assert {a.tool for a in plan.actions} == {"ground"}
        if not parallel:
            assert len(plan.actions) <= 1
        assert {a.tool for a in plan.actions} <= set(offered)


def test_without_the_switch_the_random_model_writes_no_plan(tiny, default_registry, image):
    """The ablation: constrain_plans=False decodes the think turn freely (the random model's is not JSON)."""
    pilot = GeoPilot(tiny[0], tiny[1], default_registry, constrain_plans=False)
    result = pilot.chat(image, QUESTIONS["ground"], max_rounds=0, generation={"max_new_tokens": 40})
    assert result.turns[0].parse == "failed"


def test_max_new_tokens_too_small_for_any_plan_is_one_line(tiny, default_registry, image):
    pilot = GeoPilot(tiny[0], tiny[1], default_registry)
    with pytest.raises(GeoPilotInputError, match=r"max_new_tokens=4 is too small for a plan") as err:
        pilot.chat(image, QUESTIONS["ground"], generation={"max_new_tokens": 4})
    assert "\n" not in str(err.value)
    named = ClientTools(("detect_objects",), choice="detect_objects")
    shortest = pilot.engine.grammars.shortest(named.constraint(default_registry))
    result = pilot.chat(image, "Planes?", generation={"max_new_tokens": shortest}, client_tools=named)
    assert result.outcome == "tool_calls" and result.turns[0].finished  # the shortest plan fits exactly


class Unsupported(BaseModel):
    # a look-behind, which xgrammar does not compile (pydantic's own regex engine would refuse it too)
    suffix: Annotated[str, WithJsonSchema({"type": "string", "pattern": "(?<=a)b"})]


class Odd:
    name, description, modality, params_model = "odd_tool", "a tool whose schema cannot compile", "optical", Unsupported

    def run(self, image, params):
        raise AssertionError("never run")


def test_a_schema_the_grammar_cannot_hold_fails_at_registry_load_naming_the_tool(tiny):
    """When GeoPilot loads its registry, not at request time (building a bare registry stays torch-free)."""
    from geopilot.errors import GeoPilotError

    registry = ToolRegistry([Odd()])
    with pytest.raises(ValueError, match=r"tool 'odd_tool': its params schema cannot be compiled.*Lookbehind"):
        registry.check_plan_schemas()
    with pytest.raises(GeoPilotError, match=r"tool 'odd_tool'") as err:
        GeoPilot(tiny[0], tiny[1], registry)
    assert "\n" not in str(err.value)
    GeoPilot(tiny[0], tiny[1], registry, constrain_plans=False)  # the ablation does not compile plans


def test_the_schema_keeps_tool_definitions_apart_and_the_wire_compact():
    params = (("a", json.dumps({"$defs": {"P": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/P"}}})),)
    schema = plan_json_schema(PlanConstraint(("a", "b"), 1, 1, params))
    assert set(schema["$defs"]) == {"a.P"}
    call = schema["properties"]["actions"]["items"]["anyOf"][0]
    assert call["properties"]["params"]["properties"]["x"] == {"$ref": "#/$defs/a.P"}
    assert schema["properties"]["actions"]["maxItems"] == 1 and schema["properties"]["value"] == {"type": "null"}


def test_the_http_engines_request_carries_the_plan_schema(default_registry, image):
    bodies: list[dict] = []
    reply = assistant_json(parse_plan('{"reasoning":"","actions":[],"value":"Three."}').plan)
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def complete(request: Request):
        bodies.append(await request.json())
        message = {"role": "assistant", "content": reply}
        return {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }

    with serving(app) as url:
        pilot = GeoPilot.from_endpoint(url + "/v1", "m", tools=default_registry, context_length=4096)
        result = pilot.chat(image, QUESTIONS["ground"], modality="optical")
        off = GeoPilot.from_endpoint(
            url + "/v1", "m", tools=default_registry, context_length=4096, constrain_plans=False
        )
        off.chat(image, QUESTIONS["ground"])
    assert result.answer == "Three."
    sent = bodies[0]["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["name"] == "geopilot_plan"
    assert sent["json_schema"]["schema"] == plan_json_schema(default_registry.plan_constraint("optical"))
    tools = {
        c["properties"]["tool"]["const"]
        for c in sent["json_schema"]["schema"]["anyOf"][0]["properties"]["actions"]["items"]["anyOf"]
    }
    assert tools == {t.name for t in default_registry if t.modality == "optical"}
    assert "response_format" not in bodies[1]


@pytest.mark.parametrize("off", [False, True])
def test_one_switch_reaches_serve_and_eval(tiny_model_dir, off):
    """`--unconstrained-plans` is `constrain_plans=False` for `geopilot serve` (server and FastChat worker share the
    pilot) and `geopilot eval planning --agent geopilot`, which records it with the run."""
    import argparse

    from geopilot.eval.planning_cli import add_arguments as eval_arguments
    from geopilot.eval.planning_cli import build_agent
    from geopilot.serving.cli import add_arguments, build_config, build_pilot

    flag = ["--unconstrained-plans"] if off else []
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--model", str(tiny_model_dir), "--device", "cpu", *flag])
    assert build_pilot(args, build_config(args)).constrain_plans is not off
    parser = argparse.ArgumentParser()
    eval_arguments(parser)
    common = ["--model", str(tiny_model_dir), "--out", "unused", "--device", "cpu", *flag]
    agent, _ = build_agent(parser.parse_args(["--agent", "geopilot", *common]), None)
    assert agent.pilot.constrain_plans is not off and agent.config.get("constrain_plans", True) is not off
    if off:
        with pytest.raises(GeoPilotInputError, match="--unconstrained-plans is for --agent geopilot"):
            build_agent(parser.parse_args(["--agent", "hf", *common]), None)


def test_a_client_declared_schema_that_is_huge_deep_or_recursive_is_a_400_before_compiling():
    from geopilot.serving.protocol import ChatCompletionRequest, client_tools
    from geopilot.serving.security import ServeError

    def declare(parameters) -> dict:
        tool = {"type": "function", "function": {"name": "count_cars", "parameters": parameters}}
        return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}

    ok = {"type": "object", "properties": {"lot": {"type": "string"}}, "required": ["lot"]}
    tools, _ = client_tools(ChatCompletionRequest.model_validate(declare(ok)), ["ground"], True, None)
    assert dict(tools.constraint().params)["count_cars"] == json.dumps(ok)  # the plan holds its params to it
    deep: dict = {"type": "object"}
    for _ in range(20):
        deep = {"type": "object", "properties": {"x": deep}}
    recursive = {"$defs": {"N": {"type": "object", "properties": {"n": {"$ref": "#/$defs/N"}}}}, "$ref": "#/$defs/N"}
    huge = {"type": "object", "description": "x" * 30_000}
    for bad, why in ((deep, "levels deep"), (recursive, "recursive"), (huge, "over the limit")):
        with pytest.raises(ServeError, match=why) as err:
            client_tools(ChatCompletionRequest.model_validate(declare(bad)), ["ground"], True, None)
        assert err.value.status == 400 and "count_cars" in str(err.value)
