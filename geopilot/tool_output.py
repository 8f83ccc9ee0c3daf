"""Canonical tool outputs (docs/design.md §4): what every backend returns and what samples store.

Boxes are `[x1, y1, x2, y2]` normalised to [0, 1], rounded to 3 decimals, with x1 < x2 and y1 < y2.
Beside them a detection may keep the same geometry unrounded in source pixels (`pixel_box`, `pixel_polygon`: pixels
of the full-resolution image, a GeoTIFF's raster), which is what map coordinates are computed from; they are left
out of the JSON when absent. Masks are COCO RLE and never reach the LLM: `llm_view` reduces an output to counts,
labels, areas and boxes; `decode_mask` is the one way a mask is decoded, after `rle_problem` has checked its size
and counts (pycocotools trusts both: a size claim allocates, runs past the size write past the buffer). `computed_on` says which image an output was computed on: the chat's input image, or
`result:N`, the image artefact of the chat's call N (docs/chains.md); the registry sets it, never a backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_serializer, model_validator

from geopilot.errors import GeoPilotInputError

if TYPE_CHECKING:
    import numpy as np

DECIMALS = 3
PIXEL_FIELDS = ("pixel_box", "pixel_polygon")  # left out of the JSON when None: samples stay as they were
INPUT_IMAGE = "input"  # `computed_on` of an output computed on the chat's own image
MASK_MAX_PIXELS = 100_000_000  # the largest mask decoded by default (10k x 10k), as geopilot.image's DEFAULT_MAX_PIXELS


def _unit(value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"coordinate {value} is outside [0, 1] (coordinates are normalised to the image size)")
    return round(value, DECIMALS)


UnitFloat = Annotated[float, AfterValidator(_unit)]
Point = tuple[UnitFloat, UnitFloat]


def _ordered_box(box: tuple[float, float, float, float]) -> tuple[float, float, float, float]:
    x1, y1, x2, y2 = box
    if not (x1 < x2 and y1 < y2):
        raise ValueError(f"box {list(box)} needs x1 < x2 and y1 < y2 (after rounding to {DECIMALS} decimals)")
    return box


PixelFloat = Annotated[float, Field(allow_inf_nan=False)]  # NaN pixels would map to NaN coordinates
Box = Annotated[tuple[UnitFloat, UnitFloat, UnitFloat, UnitFloat], AfterValidator(_ordered_box)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RLE(_Strict):
    """COCO run-length encoding as pycocotools writes it (`counts` as a string)."""

    size: tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]]  # [height, width]
    counts: str


class Detection(_Strict):
    label: str = Field(min_length=1)
    box: Box
    score: float | None = Field(default=None, ge=0.0, le=1.0)
    polygon: list[Point] | None = None  # rotated box or outline, normalised; >= 3 points
    mask: RLE | None = None
    area: float | None = Field(default=None, ge=0.0, le=1.0)  # fraction of the image the object covers
    pixel_box: tuple[PixelFloat, PixelFloat, PixelFloat, PixelFloat] | None = None  # `box` in source pixels, unrounded
    pixel_polygon: list[tuple[PixelFloat, PixelFloat]] | None = None  # `polygon` in source pixels, unrounded

    @model_validator(mode="after")
    def _polygon_has_three_points(self) -> Detection:
        for name, polygon in (("polygon", self.polygon), ("pixel_polygon", self.pixel_polygon)):
            if polygon is not None and len(polygon) < 3:
                raise ValueError(f"{name} needs at least 3 points, got {len(polygon)}")
        return self

    @model_serializer(mode="wrap")
    def _without_absent_pixels(self, handler) -> dict:
        data = handler(self)
        for name in PIXEL_FIELDS:
            if data.get(name) is None:
                data.pop(name, None)
        return data


class SegmentClass(_Strict):
    """One class of a semantic segmentation: how much of the image it covers, and where."""

    label: str = Field(min_length=1)
    area: float = Field(ge=0.0, le=1.0)
    mask: RLE | None = None


class RoadGraph(_Strict):
    nodes: list[Point]
    edges: list[tuple[int, int]]

    @model_validator(mode="after")
    def _edges_index_nodes(self) -> RoadGraph:
        for a, b in self.edges:
            if not (0 <= a < len(self.nodes) and 0 <= b < len(self.nodes)) or a == b:
                raise ValueError(f"edge ({a}, {b}) does not join two distinct nodes of {len(self.nodes)}")
        return self


class Artifact(_Strict):
    kind: Literal["image", "mask", "geojson"]
    path: str


class ToolOutput(_Strict):
    """What a tool call returns. `provenance` says whether a model or ground-truth annotations produced it."""

    provenance: Literal["model", "annotations"] = "model"
    detections: list[Detection] = []
    segments: list[SegmentClass] = []
    roads: RoadGraph | None = None
    artifacts: list[Artifact] = []
    geojson: dict | None = None  # FeatureCollection in map coordinates, when the input was georeferenced
    data: dict | None = (
        None  # structured result (numbers, tables) the model reads verbatim; schema declared by the tool
    )
    message: str | None = None
    error: str | None = None  # the call failed (timeout, exception, invalid call): the model reads only this
    # the chat's (first) image, its image K ("input:K", K >= 2), or call N's image artefact
    computed_on: str = Field(INPUT_IMAGE, pattern=r"^(input|input:[1-9][0-9]*|result:[1-9][0-9]*)$")


def rle_problem(rle: RLE, max_pixels: int = MASK_MAX_PIXELS) -> str | None:
    """Why `rle` cannot be decoded: more pixels than `max_pixels`, or counts that are not COCO's compressed string
    (characters '0'..'o', 5 bits each, a run's last character without the 0x20 bit; runs after the second are
    deltas of the run two back) or whose runs are negative or do not add up to height x width. None when it can."""
    height, width = rle.size
    if height * width > max_pixels:
        return f"a {height}x{width} mask is over the limit of {max_pixels:,} pixels"
    runs: list[int] = []
    value, shift = 0, 0
    for char in rle.counts:
        code = ord(char) - 48
        if not 0 <= code < 64:
            return f"mask counts hold {char!r}, not a COCO RLE character"
        value |= (code & 0x1F) << shift
        shift += 5
        if code & 0x20:
            continue
        if code & 0x10:  # the sign bit of the run's last character
            value |= -1 << shift
        if len(runs) > 2:
            value += runs[-2]
        if value < 0:
            return f"mask counts give a negative run ({value}) at run {len(runs)}"
        runs.append(value)
        value, shift = 0, 0
    if shift:
        return "mask counts end inside a run"
    if sum(runs) != height * width:
        return f"mask counts cover {sum(runs):,} pixels, its size {height}x{width} has {height * width:,}"
    return None


def decode_mask(rle: RLE, max_pixels: int = MASK_MAX_PIXELS) -> np.ndarray:
    """A checked mask decoded to an (height, width) uint8 array; a one-line GeoPilotInputError when it is not sound."""
    from pycocotools import mask as mask_utils

    problem = rle_problem(rle, max_pixels)
    if problem is not None:
        raise GeoPilotInputError(problem)
    return mask_utils.decode({"size": list(rle.size), "counts": rle.counts.encode("ascii")})


def _road_length(graph: RoadGraph) -> float:
    total = 0.0
    for a, b in graph.edges:
        (xa, ya), (xb, yb) = graph.nodes[a], graph.nodes[b]
        total += ((xa - xb) ** 2 + (ya - yb) ** 2) ** 0.5
    return round(total, DECIMALS)


def llm_view(output: ToolOutput) -> dict:
    """The part of a tool output the LLM reads: never masks, polygons, provenance or GeoJSON."""
    if output.error is not None:  # so the model says the tool failed instead of inventing a result
        return {"error": output.error}
    view: dict = {}
    if output.detections:
        view["count"] = len(output.detections)
        view["objects"] = [
            {
                "label": d.label,
                "box": list(d.box),
                **({"score": round(d.score, 2)} if d.score is not None else {}),
                **({"area": round(d.area, 4)} if d.area is not None else {}),
            }
            for d in output.detections
        ]
    if output.segments:
        view["classes"] = [{"label": s.label, "area": round(s.area, 4)} for s in output.segments]
    if output.roads is not None:
        degree = [0] * len(output.roads.nodes)
        for a, b in output.roads.edges:
            degree[a] += 1
            degree[b] += 1
        view["roads"] = {
            "nodes": len(output.roads.nodes),
            "edges": len(output.roads.edges),
            "intersections": sum(1 for d in degree if d >= 3),
            "length": _road_length(output.roads),
        }
    if output.data is not None:
        view["data"] = output.data
    if output.artifacts:
        view["artifacts"] = [a.kind for a in output.artifacts]
    if output.message:
        view["message"] = output.message
    if not view:
        view["count"] = 0
    if output.computed_on != INPUT_IMAGE:  # a chain's later step: say it read the earlier call's image
        view["computed_on"] = output.computed_on
    return view
