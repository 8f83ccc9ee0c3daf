"""The universal tool-call parser: one agent reply (text, and OpenAI `tool_calls` if any) -> the calls it makes.

Dialects, tried in this order (the first that applies decides; its name is recorded on every result row):
  openai_tool_calls  structured `tool_calls` of an OpenAI-compatible response (`function.arguments` JSON)
  hermes             `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (Hermes, Qwen)
  tool_code          fenced ```tool_code blocks holding Python calls, one per line or a list (Gemma)
  python_call        `<|python_start|>f(a=1)<|python_end|>` (Llama 4), or a reply that is only `f(a=1)` / `[f(), g()]`
  llava_plus         LLaVA-Plus's `"thoughts🤔" ... "actions🚀" [...] "value👉" ...`  } read by geopilot.plan_parser,
  geopilot_json      GeoPilot's `{"reasoning", "actions": [{"tool", "params"}], "value"}`  } the one plan parser
  json_call          a bare JSON object `{"name": ..., "arguments": {...}}`
  text               plain prose with no call: a direct answer
An empty reply is dialect `empty`; a reply that tries a dialect and gets it wrong (bad JSON inside a
`<tool_call>`, a syntax error in tool_code, malformed `function.arguments`, positional Python arguments, a JSON
plan missing its fields) is `unparsable`. Both count as incorrect. The parser never raises.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from geopilot.plan_parser import PlanParseError, parse_plan

Dialect = Literal[
    "openai_tool_calls",
    "hermes",
    "tool_code",
    "python_call",
    "llava_plus",
    "geopilot_json",
    "json_call",
    "text",
    "empty",
    "unparsable",
]
FAILED_DIALECTS = ("empty", "unparsable")

HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
TOOL_CODE = re.compile(r"```tool_code\s*\n?(.*?)(?:```|$)", re.DOTALL)
PYTHON_TAG = re.compile(r"<\|python_start\|>(.*?)(?:<\|python_end\|>|<\|eom\|>|$)", re.DOTALL)
BARE_CALLS = re.compile(r"^\[?\s*[A-Za-z_][\w.]*\s*\(.*\)\s*\]?$", re.DOTALL)
PLAN_KEYS = re.compile(r'["\'](reasoning|actions|value|tool|params|thoughts|name|arguments)["\']\s*:')


@dataclass(frozen=True)
class Call:
    tool: str
    params: dict[str, Any]
    id: str | None = None  # the OpenAI tool_call id, echoed back in the tool message


@dataclass(frozen=True)
class ParsedReply:
    dialect: Dialect
    calls: list[Call] = field(default_factory=list)
    answer: str | None = None  # the text the model meant as its answer (None when it only calls tools)
    error: str | None = None  # why an `unparsable` or `empty` reply could not be read

    @property
    def ok(self) -> bool:
        return self.dialect not in FAILED_DIALECTS


class _Unparsable(ValueError):
    pass


def parse_reply(text: str | None, tool_calls: list[dict] | None = None) -> ParsedReply:
    try:
        return _parse(text if isinstance(text, str) else "", tool_calls or [])
    except _Unparsable as err:
        return ParsedReply("unparsable", error=str(err))
    except Exception as err:  # noqa: BLE001 - the contract: never raise for what a model sends
        return ParsedReply("unparsable", error=f"unreadable reply ({type(err).__name__}: {err})")


def _parse(text: str, tool_calls: list) -> ParsedReply:
    stripped = text.strip()
    if tool_calls:
        return ParsedReply(
            "openai_tool_calls", [_openai_call(item, i) for i, item in enumerate(tool_calls)], stripped or None
        )
    if not stripped:
        return ParsedReply("empty", error="the reply is empty")
    if "<tool_call>" in stripped:
        calls = [_json_call(block, "<tool_call>") for block in HERMES.findall(stripped)]
        return ParsedReply("hermes", calls, _outside(stripped, HERMES))
    if "```tool_code" in stripped:
        calls = [call for block in TOOL_CODE.findall(stripped) for call in _python_calls(block)]
        return ParsedReply("tool_code", calls, _outside(stripped, TOOL_CODE))
    if "<|python_start|>" in stripped:
        calls = [call for block in PYTHON_TAG.findall(stripped) for call in _python_calls(block)]
        return ParsedReply("python_call", calls, _outside(stripped, PYTHON_TAG))
    if BARE_CALLS.match(stripped) and "{" not in stripped[: stripped.find("(")]:
        try:
            return ParsedReply("python_call", _python_calls(stripped))
        except _Unparsable:
            pass  # prose that happens to end with a parenthesis
    return _plan_or_text(stripped)


def _plan_or_text(text: str) -> ParsedReply:
    try:
        parsed = parse_plan(text)
    except PlanParseError as err:
        bare = _bare_json_call(text)
        if bare is not None:
            return ParsedReply("json_call", [bare])
        if PLAN_KEYS.search(text):
            raise _Unparsable(f"a JSON plan that cannot be used: {err}") from None
        return ParsedReply("text", answer=text)
    plan = parsed.plan
    dialect = "llava_plus" if parsed.method == "llava_plus" else "geopilot_json"
    return ParsedReply(dialect, [Call(a.tool, dict(a.params)) for a in plan.actions], plan.value)


def _bare_json_call(text: str) -> Call | None:
    start = text.find("{")
    if start < 0:
        return None
    try:
        obj, _ = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError:
        return None
    if isinstance(obj, dict) and "name" in obj and ("arguments" in obj or "parameters" in obj):
        return _call_from_object(obj, "JSON call")
    return None


def _outside(text: str, pattern: re.Pattern) -> str | None:
    rest = pattern.sub(" ", text).strip()
    return rest or None


def _call_from_object(obj: Any, where: str) -> Call:
    if not isinstance(obj, dict):
        raise _Unparsable(f"{where}: expected an object with name and arguments")
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        args = _loads(args, f"{where} arguments")
    if not isinstance(name, str) or not name.strip():
        raise _Unparsable(f"{where}: no tool name")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise _Unparsable(f"{where}: arguments are {type(args).__name__}, expected an object")
    return Call(name.strip(), args)


def _loads(text: str, where: str) -> Any:
    try:
        return json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as err:
        raise _Unparsable(f"{where} are not valid JSON ({err.msg})") from None


def _openai_call(item: Any, index: int) -> Call:
    where = f"tool_calls[{index}]"
    if not isinstance(item, dict) or not isinstance(item.get("function"), dict):
        raise _Unparsable(f"{where}: no function object")
    call = _call_from_object(item["function"], where)
    return Call(call.tool, call.params, item.get("id") if isinstance(item.get("id"), str) else None)


def _json_call(block: str, where: str) -> Call:
    return _call_from_object(_loads(block, where), where)


def _python_calls(source: str) -> list[Call]:
    """`f(a=1)` lines, or one list `[f(a=1), g()]`, read with `ast` (literal keyword values only)."""
    source = source.strip()
    if not source:
        raise _Unparsable("an empty tool_code block")
    try:
        tree = ast.parse(source, mode="exec")
    except SyntaxError as err:
        raise _Unparsable(f"Python call syntax error: {err.msg}") from None
    calls = []
    for statement in tree.body:
        if not isinstance(statement, ast.Expr):
            raise _Unparsable("tool code may only hold calls")
        nodes = statement.value.elts if isinstance(statement.value, ast.List | ast.Tuple) else [statement.value]
        calls.extend(_python_call(node) for node in nodes)
    return calls


def _python_call(node: ast.expr) -> Call:
    if not isinstance(node, ast.Call):
        raise _Unparsable(f"expected a call like name(key=value), got {ast.unparse(node)[:60]!r}")
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name is None:
        raise _Unparsable("the called object is not a tool name")
    if node.args:
        raise _Unparsable(f"{name}: positional arguments cannot be matched to parameters; use key=value")
    params = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            raise _Unparsable(f"{name}: **kwargs are not allowed")
        try:
            params[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            raise _Unparsable(f"{name}: argument {keyword.arg!r} is not a literal") from None
    return Call(name, params)
