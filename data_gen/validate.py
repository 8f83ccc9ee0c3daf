"""Validators for generated traces (paper §2.3.4). Every failure has a cause name; the generator regenerates on
any failure, and the report counts causes.

Structural causes: `prose` (no JSON object), `malformed_json`, `reply_schema` (JSON of the wrong shape),
`coordinates` (a box outside [0, 1] or with x1 >= x2 / y1 >= y2), `tool_source` (a tool of the wrong modality,
e.g. a SAR tool on an optical record), `param_schema` (params that fail the tool's input model). Both are checked by
`ToolRegistry.validate` of the registry the generator builds for each record with the annotation backend
(`build_registry(annotations=record)`), the same dispatcher inference uses. Semantic causes, one per dimension the
paper reports: `query_answerability`,
`tool_call_correctness`, `parameter_consistency`, `final_answer_faithfulness` (counts, categories, areas and
boxes in the answer agree with the tool output).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from geopilot.data_gen.abilities import CATEGORY_TOOLS, CLASS_TOOLS, DETECTION_TOOLS, EXPRESSION_TOOLS, Target
from geopilot.data_gen.templates import names_for, plural
from geopilot.errors import describe_validation_error
from geopilot.sample import Action
from geopilot.tool_output import ToolOutput, llm_view
from geopilot.tool_protocol import ToolRegistry
from geopilot.tool_result import ToolCallError

STRUCTURAL = ("prose", "malformed_json", "reply_schema", "coordinates", "tool_source", "param_schema")
SEMANTIC = ("query_answerability", "tool_call_correctness", "parameter_consistency", "final_answer_faithfulness")
CAUSES = STRUCTURAL + SEMANTIC  # priority order: the first failing cause names a regeneration


@dataclass(frozen=True)
class Failure:
    cause: str
    detail: str


def first_cause(failures: list[Failure]) -> Failure:
    return min(failures, key=lambda f: CAUSES.index(f.cause) if f.cause in CAUSES else len(CAUSES))


# ---- replies: what the LLM must return at each stage (extra keys are tolerated, missing ones are not) ----


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore")


class PlanReply(_Reply):
    query: str = Field(min_length=1)
    reasoning: str = Field(min_length=1)
    actions: list[Action]


class AnswerReply(_Reply):
    reasoning: str = Field(min_length=1)
    answer: str = Field(min_length=1)


class ReasoningReply(_Reply):
    reasoning: list[str] = Field(min_length=1)


class CaptionDialogueReply(_Reply):
    query: str = Field(min_length=1)
    reasoning: str = Field(min_length=1)


REPLIES: dict[str, type[_Reply]] = {
    "plan": PlanReply,
    "answer": AnswerReply,
    "reasoning": ReasoningReply,
    "caption_dialogue": CaptionDialogueReply,
}
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def parse_reply(stage: str, text: str) -> tuple[_Reply | None, Failure | None]:
    """LLM text -> the stage's reply model. A code fence around the JSON is accepted; anything else is not."""
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1)
    if not stripped.startswith("{"):
        return None, Failure("prose", f"reply is not a JSON object: {text[:80]!r}")
    try:
        data = json.loads(stripped)
    except json.JSONDecodeError as err:
        return None, Failure("malformed_json", f"{err.msg} at column {err.colno}")
    if not isinstance(data, dict):
        return None, Failure("reply_schema", "reply is not a JSON object")
    try:
        return REPLIES[stage].model_validate(data), None
    except ValidationError as err:
        return None, Failure("reply_schema", describe_validation_error(err))


# ---- coordinates ----

_NUMBER = r"-?\d+(?:\.\d+)?"
BOX_TEXT = re.compile(rf"\[\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\]")


def boxes_in_text(text: str) -> list[tuple[float, ...]]:
    return [tuple(float(v) for v in match.groups()) for match in BOX_TEXT.finditer(text)]


def box_problem(box: tuple[float, ...]) -> str | None:
    if any(not 0.0 <= v <= 1.0 for v in box):
        return f"box {list(box)} has a coordinate outside [0, 1]"
    if not (box[0] < box[2] and box[1] < box[3]):
        return f"box {list(box)} needs x1 < x2 and y1 < y2"
    return None


def check_coordinates(*texts: str) -> list[Failure]:
    problems = [box_problem(box) for text in texts for box in boxes_in_text(text)]
    return [Failure("coordinates", p) for p in problems if p]


# ---- tools ----


def check_action(action: Action, modality: str, registry: ToolRegistry) -> list[Failure]:
    try:
        registry.validate(action, modality)
    except ToolCallError as err:
        cause = "param_schema" if err.kind == "invalid_params" else "tool_source"
        return [Failure(cause, str(err))]
    return []


# ---- semantic dimensions ----

_STOPWORDS = {
    "the",
    "a",
    "an",
    "of",
    "in",
    "on",
    "at",
    "to",
    "and",
    "or",
    "with",
    "is",
    "are",
    "that",
    "this",
    "image",
    "its",
}


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9%.\- ]", " ", text.lower().replace("_", " ").replace("-", " ")).split())


def mentions(text: str, label: str) -> bool:
    """Does `text` name `label` (singular or plural, '-'/'_' read as spaces)?"""
    norm = f" {_norm(text).replace('.', ' ')} "
    label = _norm(label)
    return any(f" {form} " in norm for form in {label, plural(label)})


def _content_words(text: str) -> list[str]:
    return [w for w in _norm(text).replace(".", " ").split() if len(w) > 2 and w not in _STOPWORDS]


def check_query(query: str, target: Target) -> list[Failure]:
    """Answerable: a real request of sensible length, naming its target (by its class name or one of the class's
    everyday synonyms, geopilot/vocabulary.yaml), not leaking coordinates."""
    words = query.split()
    fail = []
    if not 3 <= len(words) <= 120:
        fail.append(f"query has {len(words)} words")
    if "{" in query or "FACTS" in query:
        fail.append("query contains template or JSON text")
    if boxes_in_text(query):
        fail.append("query gives away coordinates")
    params = target.params
    if target.tool in CATEGORY_TOOLS:
        missing = [c for c in params["categories"] if not any(mentions(query, n) for n in names_for(c))]
        if missing:
            fail.append(f"query does not name {missing}")
    elif target.tool in EXPRESSION_TOOLS:
        wanted = _content_words(params["expression"])
        have = set(_content_words(query))
        if wanted and sum(w in have for w in wanted) < max(1, len(wanted) // 2):
            fail.append(f"query does not carry the expression {params['expression']!r}")
    elif target.tool in CLASS_TOOLS:
        if not any(mentions(query, n) for c in params["classes"] for n in names_for(c)):
            fail.append(f"query names none of the classes {params['classes']}")
    return [Failure("query_answerability", "; ".join(fail))] if fail else []


def check_tool_call(actions: list[Action], target: Target) -> list[Failure]:
    tools = [a.tool for a in actions]
    if tools != [target.tool]:
        return [Failure("tool_call_correctness", f"expected exactly one call to {target.tool!r}, got {tools}")]
    return []


def _same_names(a, b: list[str]) -> bool:
    if not isinstance(a, list) or not all(isinstance(name, str) for name in a):
        return False  # the schema check names the problem; here it simply is not the annotation's list

    def canon(names: list[str]) -> set[str]:
        out = set()
        for name in names:
            n = _norm(name)
            out.add(n[:-1] if n.endswith("s") and not n.endswith("ss") else n)
        return out

    return canon(a) == canon(b)


def check_params(params: dict, target: Target) -> list[Failure]:
    """The call's params agree with the annotation: same categories / expression / classes, nothing else."""
    want = target.params
    ok = True
    if set(params) - {"score_threshold"} != set(want):
        ok = False
    elif target.tool in CATEGORY_TOOLS:
        ok = _same_names(params.get("categories", []), want["categories"])
    elif target.tool in CLASS_TOOLS:
        ok = _same_names(params.get("classes", []), want["classes"])
    elif target.tool in EXPRESSION_TOOLS:
        ok = _norm(str(params.get("expression", ""))).rstrip(".") == _norm(want["expression"]).rstrip(".")
    if not ok:
        return [Failure("parameter_consistency", f"params {params} do not match the annotation's {want}")]
    return []


def check_plan(reply: PlanReply, target: Target, modality: str, registry: ToolRegistry) -> list[Failure]:
    failures = check_coordinates(reply.query, reply.reasoning)
    for action in reply.actions:
        failures += check_action(action, modality, registry)
    failures += check_query(reply.query, target)
    failures += check_tool_call(reply.actions, target)
    if len(reply.actions) == 1:
        failures += check_params(reply.actions[0].params, target)
    return failures


_NUMBER_WORDS = {
    w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())
}
_NEGATION = re.compile(r"\b(no|none|not|zero|0)\b")


def _allowed_numbers(view: dict, target: Target, query: str) -> set[float]:
    allowed = {float(n) for n in re.findall(_NUMBER, query)}
    objects = view.get("objects", [])
    allowed.add(float(len(objects)))
    for label in {o["label"] for o in objects}:
        allowed.add(float(sum(o["label"] == label for o in objects)))
    for key in ("nodes", "edges", "intersections", "length"):
        if "roads" in view:
            allowed.add(float(view["roads"][key]))
    for text in [target.params.get("expression", "")] + list(target.params.get("categories", [])):
        allowed |= {float(n) for n in re.findall(_NUMBER, text)}
    return allowed


def check_answer(
    reply: AnswerReply, output: ToolOutput, target: Target, vocabulary: set[str], query: str
) -> list[Failure]:
    """Faithful: every box, count, area and category the answer mentions is in the tool output."""
    failures = check_coordinates(reply.answer, reply.reasoning)
    view = llm_view(output)
    text = f"{reply.reasoning} {reply.answer}"
    out_boxes = [tuple(o["box"]) for o in view.get("objects", [])]
    problems = []
    for box in boxes_in_text(text):
        if not any(max(abs(a - b) for a, b in zip(box, ob, strict=True)) <= 0.01 for ob in out_boxes):
            problems.append(f"box {list(box)} is not in the tool output")
    rest = BOX_TEXT.sub(" ", text)
    areas = [o["area"] for o in view.get("objects", []) if "area" in o] + [c["area"] for c in view.get("classes", [])]
    for pct in re.findall(rf"({_NUMBER})\s*%", rest):
        if not any(abs(float(pct) - a * 100) <= 0.15 for a in areas):
            problems.append(f"{pct}% matches no area in the tool output")
    rest = re.sub(rf"{_NUMBER}\s*%", " ", rest)
    allowed = _allowed_numbers(view, target, query)
    numbers = [float(n) for n in re.findall(rf"(?<![\w.]){_NUMBER}(?![\w.]*\w)", rest)]
    numbers += [
        float(_NUMBER_WORDS[w]) for w in re.findall(r"[a-z]+", rest.lower()) if w in _NUMBER_WORDS and w != "one"
    ]
    for number in numbers:
        if not any(abs(number - a) < 1e-3 for a in allowed):
            problems.append(f"the number {number:g} is not in the tool output")
    backed = {o["label"].lower() for o in view.get("objects", [])} | {
        c["label"].lower() for c in view.get("classes", [])
    }
    asked = {c.lower() for c in target.params.get("categories", []) + target.params.get("classes", [])}
    context = f"{query} {target.params.get('expression', '')}"
    for name in sorted(vocabulary - backed - asked):
        if mentions(reply.answer, name) and not mentions(context, name):
            problems.append(f"the answer mentions {name!r}, which the tool output does not contain")
    if target.tool in DETECTION_TOOLS:
        if not out_boxes and not _NEGATION.search(reply.answer.lower()):
            problems.append("the tool found nothing but the answer does not say so")
        if (
            out_boxes
            and not numbers
            and not boxes_in_text(reply.answer)
            and not (len(out_boxes) == 1 and re.search(r"\b(one|a|an|single)\b", reply.answer.lower()))
        ):
            problems.append("the answer gives neither a count nor a location")
    return failures + ([Failure("final_answer_faithfulness", "; ".join(problems))] if problems else [])
