"""Exact IoU of convex polygons (rotated boxes) by Sutherland-Hodgman clipping; no shapely needed. In the core: the
GeoChat reader (data_gen) and the grounding metric (eval) both use it.

Every polygon is first made a counter-clockwise convex polygon by `convex_polygon`: the convex hull of its points.
For a rotated box (the only shape GeoChat's `{<x1><y1><x2><y2>|θ}` text and its 4-point ground truth describe) the
hull IS the box, whatever the corner order, so a self-intersecting "bow-tie" corner order is repaired to the box it
means. `is_simple` tells whether the given corner order was self-intersecting (loaders count such repairs). Fewer
than three distinct points, non-finite coordinates or a hull of (near) zero area raise `DegeneratePolygonError`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Point = tuple[float, float]
AREA_EPS = 1e-9


class DegeneratePolygonError(ValueError):
    """A polygon with no area: fewer than three distinct points, collinear points, or NaN/inf coordinates."""


def signed_area(points: Sequence[Point]) -> float:
    return 0.5 * sum(x1 * y2 - x2 * y1 for (x1, y1), (x2, y2) in zip(points, [*points[1:], points[0]], strict=True))


def _cross(o: Point, a: Point, b: Point) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def convex_polygon(points: Sequence[Sequence[float]]) -> list[Point]:
    """The counter-clockwise convex hull (Andrew's monotone chain) of `points`; DegeneratePolygonError if it has no
    area."""
    pts = sorted({(float(p[0]), float(p[1])) for p in points})
    if any(not math.isfinite(c) for p in pts for c in p):
        raise DegeneratePolygonError(f"polygon has non-finite coordinates: {list(points)}")
    if len(pts) < 3:
        raise DegeneratePolygonError(f"polygon needs three distinct points, got {len(pts)}")
    lower: list[Point] = []
    upper: list[Point] = []
    for p in pts:
        while len(lower) >= 2 and _cross(lower[-2], lower[-1], p) <= 0:
            lower.pop()
        lower.append(p)
    for p in reversed(pts):
        while len(upper) >= 2 and _cross(upper[-2], upper[-1], p) <= 0:
            upper.pop()
        upper.append(p)
    hull = lower[:-1] + upper[:-1]
    if len(hull) < 3 or signed_area(hull) <= AREA_EPS:
        raise DegeneratePolygonError(f"polygon has no area: {list(points)}")
    return hull


def _segments_cross(a: Point, b: Point, c: Point, d: Point) -> bool:
    d1, d2, d3, d4 = _cross(c, d, a), _cross(c, d, b), _cross(a, b, c), _cross(a, b, d)
    return ((d1 > 0) != (d2 > 0)) and ((d3 > 0) != (d4 > 0)) and 0 not in (d1, d2, d3, d4)


def is_simple(points: Sequence[Sequence[float]]) -> bool:
    """False when two non-adjacent edges of the ring cross (a bow-tie corner order)."""
    ring = [(float(p[0]), float(p[1])) for p in points]
    edges = list(zip(ring, [*ring[1:], ring[0]], strict=True))
    for i in range(len(edges)):
        for j in range(i + 2, len(edges)):
            if i == 0 and j == len(edges) - 1:
                continue
            if _segments_cross(*edges[i], *edges[j]):
                return False
    return True


def _clip(subject: list[Point], a: Point, b: Point) -> list[Point]:
    """Keep the part of `subject` left of the directed line a->b (inside a CCW clip polygon)."""
    out: list[Point] = []
    for i, current in enumerate(subject):
        previous = subject[i - 1]
        cur_in, prev_in = _cross(a, b, current) >= 0, _cross(a, b, previous) >= 0
        if cur_in != prev_in:
            dx, dy = current[0] - previous[0], current[1] - previous[1]
            ex, ey = b[0] - a[0], b[1] - a[1]
            t = ((a[0] - previous[0]) * ey - (a[1] - previous[1]) * ex) / (dx * ey - dy * ex)
            out.append((previous[0] + t * dx, previous[1] + t * dy))
        if cur_in:
            out.append(current)
    return out


def clip_convex(subject: Sequence[Point], clip: Sequence[Point]) -> list[Point]:
    """The part of CCW convex polygon `subject` inside CCW convex polygon `clip` (fewer than 3 points: none)."""
    region = list(subject)
    for i in range(len(clip)):
        region = _clip(region, clip[i], clip[(i + 1) % len(clip)])
        if len(region) < 3:
            return []
    return region


def intersection_area(a: Sequence[Point], b: Sequence[Point]) -> float:
    """Area of the intersection of two CCW convex polygons (as `convex_polygon` returns them)."""
    region = clip_convex(a, b)
    return max(signed_area(region), 0.0) if region else 0.0


def polygon_iou(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> float:
    """IoU of two polygons after `convex_polygon` (raises DegeneratePolygonError for one with no area)."""
    pa, pb = convex_polygon(a), convex_polygon(b)
    inter = intersection_area(pa, pb)
    union = signed_area(pa) + signed_area(pb) - inter
    return inter / union if union > 0 else 0.0
