"""Limits on the JSON a client sends (a request body, a tool's parameter schema, a call's arguments, a tool result),
checked by walking it without recursion before anything else walks it: pydantic-core serialises at most about 255
levels (deeper is a ValueError, so a 500, long after the request was accepted), and a schema of megabytes would sit
in every prompt and every grammar compiled from it.

`check_tool_schema` is the one check of a client-declared tool schema: serving applies it to every request's
`tools`, and whatever compiles such a schema (the plan grammar) may rely on it having passed.
"""

from __future__ import annotations

import json
from typing import Any

from geopilot.errors import GeoPilotInputError

MAX_JSON_DEPTH = 64  # nesting of any JSON a client sends; real tool results and requests stay under 20
MAX_SCHEMA_DEPTH = 32  # nesting of a tool's parameter schema: about 15 levels of objects within objects
MAX_SCHEMA_CHARS = 30_000  # a tool's parameter schema as compact JSON; real ones are a few thousand characters


def measure(value: Any, max_depth: int) -> tuple[int, int]:
    """(nesting depth, characters of text) of a JSON value: every string, key and scalar counts as its text. The
    walk stops as soon as the depth passes `max_depth` (then the depth returned is `max_depth + 1`)."""
    depth, chars = 0, 0
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, level = pending.pop()
        if isinstance(item, dict | list):
            depth = max(depth, level)
            if depth > max_depth:
                return depth, chars
            if isinstance(item, dict):
                chars += sum(len(key) for key in item)
                item = item.values()
            pending.extend((child, level + 1) for child in item)
        elif item is not None:
            chars += len(item) if isinstance(item, str) else len(str(item))
    return depth, chars


def check_depth(value: Any, what: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """GeoPilotInputError when `value` nests deeper than `max_depth` levels."""
    if measure(value, max_depth)[0] > max_depth:
        raise GeoPilotInputError(f"{what}: nests more than {max_depth} levels deep")


def loads(text: str, what: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Strict JSON text -> the value: GeoPilotInputError for text that is not JSON, for NaN and Infinity (not JSON
    numbers; Python's json module reads them, and they come back as `null`), and for nesting past `max_depth`."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise GeoPilotInputError(f"{what}: nests more than {max_depth} levels deep") from None
    except ValueError as err:  # JSONDecodeError, NaN/Infinity, an integer over Python's digit limit
        raise GeoPilotInputError(f"{what}: not JSON ({str(err)[:200]})") from None
    check_depth(value, what, max_depth)
    return value


def check_tool_schema(
    schema: Any, what: str = "parameters", max_depth: int = MAX_SCHEMA_DEPTH, max_chars: int = MAX_SCHEMA_CHARS
) -> None:
    """A client tool's parameter schema: a JSON object nesting at most `max_depth` levels and at most `max_chars`
    characters as compact JSON; GeoPilotInputError naming `what` otherwise. The size is measured only once the
    depth is known to be bounded."""
    if not isinstance(schema, dict):
        raise GeoPilotInputError(f"{what}: must be a JSON Schema object, got {type(schema).__name__}")
    check_depth(schema, what, max_depth)
    try:
        size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False))
    except (TypeError, ValueError) as err:  # NaN or Infinity, or a value JSON has no form for
        raise GeoPilotInputError(f"{what}: not JSON ({str(err)[:200]})") from None
    if size > max_chars:
        raise GeoPilotInputError(f"{what}: {size:,} characters of JSON, over the limit of {max_chars:,}")


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")
