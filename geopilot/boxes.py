"""Boxes between the trace format and a model's own convention (docs/models.md, "Boxes").

The trace format (samples, tool outputs, tool params, `ChatResult`) keeps boxes normalised `[x1, y1, x2, y2]` in
[0, 1]. A model family that was pretrained on another convention (Qwen2.5-VL: absolute pixels of its resized input)
gives a `BoxCodec` for one image, and the wire format writes every box the model reads through `to_model` and
reads every box the model writes through `from_model`. `None` in place of a codec: the model reads the trace's boxes
as they are (LLaVA).

Where boxes are: a JSON value (a tool's `llm_view`, a call's params) holds one under `box`, `bbox` or `bbox_2d`
(four numbers) or several under `boxes`; an answer's text quotes one as `[x1, y1, x2, y2]`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

BOX_KEYS = ("box", "bbox", "bbox_2d")  # a JSON value under one of these keys that is four numbers is a box
BOXES_KEY = "boxes"  # a list of boxes
TEXT_BOX = re.compile(
    r"\[\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*\]"
)
BoxMap = Callable[[Sequence[float]], list]


@dataclass(frozen=True)
class BoxCodec:
    """One image's boxes in a model's convention: `to_model` maps a normalised box to what the model reads,
    `from_model` what the model writes back to a normalised box (clipped to [0, 1])."""

    to_model: BoxMap
    from_model: BoxMap


def _is_box(value: Any) -> bool:
    return (
        isinstance(value, list | tuple)
        and len(value) == 4
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    )


def _is_unit_box(box: Sequence[float]) -> bool:
    x1, y1, x2, y2 = box
    return all(0.0 <= v <= 1.0 for v in box) and x1 < x2 and y1 < y2


def map_json(value: Any, convert: BoxMap) -> Any:
    """A JSON value with every box (under `BOX_KEYS`, or each of a list under `BOXES_KEY`) mapped by `convert`."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in BOX_KEYS and _is_box(item):
                out[key] = convert(list(item))
            elif key == BOXES_KEY and isinstance(item, list) and item and all(_is_box(b) for b in item):
                out[key] = [convert(list(b)) for b in item]
            else:
                out[key] = map_json(item, convert)
        return out
    if isinstance(value, list):
        return [map_json(item, convert) for item in value]
    return value


def _number(value: float) -> str:
    """How a box coordinate is quoted in text: integers as integers, fractions without trailing zeros."""
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.4f}".rstrip("0").rstrip(".")


def map_text(text: str, convert: BoxMap, only_unit: bool) -> str:
    """`text` with every quoted `[x1, y1, x2, y2]` mapped by `convert` (`only_unit`: only those that are normalised
    boxes, so other bracketed numbers in an answer are left as written)."""

    def replace(match: re.Match) -> str:
        box = [float(v) for v in match.groups()]
        if only_unit and not _is_unit_box(box):
            return match.group(0)
        return "[" + ", ".join(_number(v) for v in convert(box)) + "]"

    return TEXT_BOX.sub(replace, text)


def view_to_model(view: Any, boxes: BoxCodec | None) -> Any:
    """A JSON value the model reads (a tool's `llm_view`, a plan's params) in the model's convention."""
    return view if boxes is None else map_json(view, boxes.to_model)


def params_from_model(params: dict, boxes: BoxCodec | None) -> dict:
    """A call's params as the model wrote them -> the trace's normalised boxes (what the tool receives)."""
    return params if boxes is None else map_json(params, boxes.from_model)


def text_to_model(text: str | None, boxes: BoxCodec | None) -> str | None:
    """An answer's quoted normalised boxes in the model's convention."""
    return text if boxes is None or text is None else map_text(text, boxes.to_model, only_unit=True)


def text_from_model(text: str | None, boxes: BoxCodec | None) -> str | None:
    """An answer's quoted boxes as the model wrote them -> normalised."""
    return text if boxes is None or text is None else map_text(text, boxes.from_model, only_unit=False)
