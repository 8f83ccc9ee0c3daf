"""Plan parsing: the text of one assistant turn -> `{reasoning, actions, value}` as an AssistantMessage.

Strict `json.loads` first (the wire format is one compact JSON object), then a tolerant recovery, in order:
the first JSON object inside surrounding text, trailing commas removed, single quotes read as double quotes,
and LLaVA-Plus's emoji-delimited turn (`"thoughts🤔" ... "actions🚀" [...] "value👉" ...`, with
`API_name`/`API_params` actions). The contract, checked by a Hypothesis test: `parse_plan` returns a
`ParsedPlan` or raises `PlanParseError`, never anything else.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from geopilot.boxes import BoxCodec, params_from_model, text_from_model
from geopilot.errors import describe_validation_error
from geopilot.sample import Action, AssistantMessage

MAX_PLAN_CHARS = 50_000  # longer text is not a plan (and would make the recovery slow)
LLAVA_PLUS_TURN = re.compile(r'"thoughts🤔"(.*)"actions🚀"(.*)"value👉"(.*)', re.DOTALL)
TRAILING_COMMA = re.compile(r",\s*([}\]])")
TOOL_KEYS = ("tool", "name", "API_name")
PARAMS_KEYS = ("params", "arguments", "API_params")

Method = Literal["strict", "recovered", "llava_plus"]


class PlanParseError(ValueError):
    """The model's text is not a usable plan; the message says why (it is shown to the model in the repair turn)."""


@dataclass(frozen=True)
class ParsedPlan:
    plan: AssistantMessage
    method: Method  # how the text was read: strict JSON, tolerant recovery, or the LLaVA-Plus format


def parse_plan(text: str, boxes: BoxCodec | None = None) -> ParsedPlan:
    """`boxes`: the model writes boxes in its own convention (`geopilot.boxes`); the plan comes back with the
    trace's normalised boxes, as the tools receive them."""
    try:
        parsed = _parse(text)
        return ParsedPlan(plan_from_model(parsed.plan, boxes), parsed.method)
    except PlanParseError:
        raise
    except Exception as err:  # noqa: BLE001 - last guard of the contract; the cases above are the expected ones
        raise PlanParseError(f"unreadable plan ({type(err).__name__})") from None


def cut_answer(text: str, boxes: BoxCodec | None = None) -> str | None:
    """What a reply cut off at max_new_tokens had written of its answer (`value`) after a plan with no calls: the
    words so far, or None when the cut fell before them (or the reply planned calls)."""
    from pydantic_core import from_json

    try:
        partial = from_json(text.strip(), allow_partial="trailing-strings")
    except ValueError:
        return None
    if not isinstance(partial, dict) or partial.get("actions") != [] or not isinstance(partial.get("value"), str):
        return None
    value = partial["value"].strip()
    return text_from_model(value, boxes) if value else None


def _parse(text: str) -> ParsedPlan:
    if not isinstance(text, str):
        raise PlanParseError(f"expected text, got {type(text).__name__}")
    text = text.strip()
    if not text:
        raise PlanParseError("the reply is empty; expected one JSON object with reasoning, actions and value")
    if len(text) > MAX_PLAN_CHARS:
        raise PlanParseError(f"the reply is {len(text)} characters long; a plan is one short JSON object")
    try:
        strict = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        strict = None
    if isinstance(strict, dict):
        return ParsedPlan(plan_from_object(strict), "strict")
    emoji = LLAVA_PLUS_TURN.search(text)
    if emoji:
        return ParsedPlan(_llava_plus_plan(*emoji.groups()), "llava_plus")
    obj = _first_object(text)
    if obj is None:
        raise PlanParseError('no JSON object found; reply with one object {"reasoning", "actions", "value"}')
    return ParsedPlan(plan_from_object(obj), "recovered")


def _loads_tolerant(candidate: str) -> Any:
    """json.loads of the candidate, then with trailing commas removed, then with single quotes as double quotes."""
    no_commas = TRAILING_COMMA.sub(r"\1", candidate)
    variants = [candidate, no_commas]
    if "'" in candidate:
        variants += [
            no_commas.replace('"', "\u0000").replace("'", '"').replace("\u0000", "'"),
            no_commas.replace("'", '"'),
        ]
    for variant in variants:
        try:
            return json.loads(variant)
        except (json.JSONDecodeError, RecursionError):
            continue
    raise PlanParseError("not valid JSON, even after removing trailing commas and reading single quotes as double")


def _first_object(text: str) -> dict | None:
    """The first `{...}` in the text that reads as a JSON object (tolerantly), outermost first."""
    decoder = json.JSONDecoder()
    starts = [i for i, char in enumerate(text) if char == "{"][:50]
    for start in starts:
        try:
            obj, _ = decoder.raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):
            end = text.rfind("}")
            if end <= start:
                continue
            try:
                obj = _loads_tolerant(text[start : end + 1])
            except PlanParseError:
                continue
        if isinstance(obj, dict):
            return obj
    return None


def _llava_plus_plan(thoughts: str, actions: str, value: str) -> AssistantMessage:
    actions = actions.strip()
    parsed_actions = _loads_tolerant(actions) if actions else []
    value = value.strip()
    return plan_from_object({"reasoning": thoughts.strip(), "actions": parsed_actions, "value": value or None})


def _action(item: Any, index: int) -> Action:
    if not isinstance(item, dict):
        raise PlanParseError(f'actions[{index}] is {type(item).__name__}; expected {{"tool": name, "params": {{...}}}}')
    tool = next((item[k] for k in TOOL_KEYS if k in item), None)
    if not isinstance(tool, str) or not tool.strip():
        raise PlanParseError(f'actions[{index}] has no tool name ("tool": a string)')
    params = next((item[k] for k in PARAMS_KEYS if k in item), None)
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise PlanParseError(f"actions[{index}].params is {type(params).__name__}; expected an object")
    return Action(tool=tool.strip(), params=params)


def plan_from_object(obj: dict) -> AssistantMessage:
    """A decoded JSON object -> AssistantMessage; accepts `thoughts` for reasoning and a single action object."""
    reasoning = obj.get("reasoning", obj.get("thoughts", ""))
    actions = obj.get("actions", [])
    value = obj.get("value")
    if actions is None:
        actions = []
    if isinstance(actions, dict):
        actions = [actions]
    if not isinstance(actions, list):
        raise PlanParseError(f'"actions" is {type(actions).__name__}; expected a list of tool calls')
    if isinstance(value, bool) or isinstance(value, int | float):
        value = json.dumps(value)
    if value is not None and not isinstance(value, str):
        raise PlanParseError(f'"value" is {type(value).__name__}; expected a string or null')
    if not isinstance(reasoning, str):
        reasoning = json.dumps(reasoning, ensure_ascii=False, default=str)
    parsed_actions = [_action(item, i) for i, item in enumerate(actions)]
    if not parsed_actions and (value is None or not value.strip()):
        raise PlanParseError('the plan has no actions and no value; call a tool or put the answer in "value"')
    try:
        return AssistantMessage(reasoning=reasoning, actions=parsed_actions, value=value)
    except ValidationError as err:  # defensive: the checks above cover the schema
        raise PlanParseError(f"not a plan: {describe_validation_error(err)}") from None


def plan_from_model(plan: AssistantMessage, boxes: BoxCodec | None) -> AssistantMessage:
    """A plan as the model wrote it -> the trace's form: every box in its params and text normalised again."""
    if boxes is None:
        return plan
    return plan.model_copy(
        update={
            "reasoning": text_from_model(plan.reasoning, boxes),
            "actions": [a.model_copy(update={"params": params_from_model(a.params, boxes)}) for a in plan.actions],
            "value": text_from_model(plan.value, boxes),
        }
    )
