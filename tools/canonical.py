"""Helpers that turn pixel geometry and masks into canonical tool outputs (`geopilot.tool_output`).

Every backend and the annotation backend go through these, so boxes are clamped, rounded and never degenerate
the same way everywhere, and masks are COCO RLE written by pycocotools.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pycocotools import mask as mask_utils

from geopilot.tool_output import DECIMALS, RLE, SegmentClass

MIN_SIZE = 10.0**-DECIMALS  # the smallest box side that survives rounding


def _clamp(value: float) -> float:
    return min(1.0, max(0.0, float(value)))


def unit_box(x1: float, y1: float, x2: float, y2: float) -> tuple[float, float, float, float]:
    """A normalised box clamped to [0, 1], rounded to 3 decimals, with sides of at least 0.001."""
    out = []
    for lo, hi in ((x1, x2), (y1, y2)):
        lo, hi = sorted((_clamp(lo), _clamp(hi)))
        lo, hi = round(lo, DECIMALS), round(hi, DECIMALS)
        if hi - lo < MIN_SIZE:  # a sub-pixel box: widen it to the smallest representable side, inside [0, 1]
            lo = min(lo, round(1.0 - MIN_SIZE, DECIMALS))
            hi = round(lo + MIN_SIZE, DECIMALS)
        out.append((lo, hi))
    (ax, bx), (ay, by) = out
    return (ax, ay, bx, by)


def pixel_box(box: Sequence[float], width: int, height: int) -> tuple[float, float, float, float]:
    """Pixel `[x1, y1, x2, y2]` -> canonical normalised box."""
    x1, y1, x2, y2 = box
    return unit_box(x1 / width, y1 / height, x2 / width, y2 / height)


def unit_polygon(points: Sequence[Sequence[float]]) -> list[tuple[float, float]]:
    return [(round(_clamp(x), DECIMALS), round(_clamp(y), DECIMALS)) for x, y in points]


def encode_mask(mask: np.ndarray) -> RLE:
    """A boolean (H, W) mask -> COCO RLE with string counts."""
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return RLE(size=(int(rle["size"][0]), int(rle["size"][1])), counts=rle["counts"].decode("ascii"))


def coco_rle(mask: dict) -> RLE:
    """A COCO RLE dict as datasets store it (`counts` compressed string or uncompressed list) -> canonical RLE."""
    height, width = (int(s) for s in mask["size"])
    counts = mask["counts"]
    if isinstance(counts, list):  # uncompressed -> compressed
        counts = mask_utils.frPyObjects({"size": [height, width], "counts": counts}, height, width)["counts"]
    if isinstance(counts, bytes):
        counts = counts.decode("ascii")
    return RLE(size=(height, width), counts=counts)


def segment_class(label: str, mask: np.ndarray) -> SegmentClass:
    """One class of a label map: its area fraction (6 decimals) and its COCO RLE mask."""
    return SegmentClass(label=label, area=round(float(mask.mean()), 6), mask=encode_mask(mask))


def rle_area_fraction(rle: RLE) -> float:
    height, width = rle.size
    area = float(mask_utils.area({"size": list(rle.size), "counts": rle.counts.encode("ascii")}))
    return area / float(height * width) if height * width else 0.0


def rle_contains(rle: RLE, points: Sequence[tuple[float, float]]) -> list[bool]:
    """Whether each normalised (x, y) point falls on a pixel of the mask."""
    mask = mask_utils.decode({"size": list(rle.size), "counts": rle.counts.encode("ascii")})
    height, width = mask.shape[:2]
    return [bool(mask[min(int(y * height), height - 1), min(int(x * width), width - 1)]) for x, y in points]


def rle_box(rle: RLE) -> tuple[float, float, float, float] | None:
    """Canonical box around a mask, or None for an empty mask."""
    height, width = rle.size
    x, y, w, h = mask_utils.toBbox({"size": list(rle.size), "counts": rle.counts.encode("ascii")}).tolist()
    if w <= 0 or h <= 0:
        return None
    return pixel_box((x, y, x + w, y + h), width, height)


def polygon_mask(polygon: Sequence[Sequence[float]], width: int, height: int) -> RLE:
    """Rasterise a normalised polygon to an RLE mask of a width x height image (pycocotools' polygon fill)."""
    flat = [coord for x, y in polygon for coord in (x * width, y * height)]
    rle = mask_utils.merge(mask_utils.frPyObjects([flat], height, width))
    return RLE(size=(int(rle["size"][0]), int(rle["size"][1])), counts=rle["counts"].decode("ascii"))


def box_mask(box: Sequence[float], width: int, height: int) -> RLE:
    x1, y1, x2, y2 = box
    return polygon_mask([(x1, y1), (x2, y1), (x2, y2), (x1, y2)], width, height)
