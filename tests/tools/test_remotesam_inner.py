"""RemoteSAM's inner-box removal against upstream's canvas test (`utils.py::box1_in_box2`, `M2B(remove_inner=True)`).

Upstream fills each [x, y, x+w, y+h] box with `cv2.fillPoly` on its four corners (end row and column included) on a
canvas of (max y2, max x2) pixels, so the larger box's last row/column falls off the canvas. `_canvas_inside` is that
test with numpy slices (cv2 is not a dependency): for an axis-aligned integer rectangle fillPoly fills exactly the
pixels from corner to corner inclusive.
"""

from __future__ import annotations

import numpy as np

from geopilot.tools.remotesam import Component, _inside, connected_components, remove_inner


def _canvas_inside(inner, outer) -> bool:
    width, height = max(inner[2], outer[2]), max(inner[3], outer[3])
    canvases = []
    for x1, y1, x2, y2 in (inner, outer):
        canvas = np.zeros((height, width), dtype=bool)
        canvas[y1 : y2 + 1, x1 : x2 + 1] = True  # corners included, cut at the canvas edge as cv2 clips
        canvases.append(canvas)
    return int((canvases[0] & canvases[1]).sum()) == int(canvases[0].sum())


def _upstream_kept(boxes) -> list[int]:
    """`M2B(remove_inner=True)`: every box inside any other is dropped (both of two boxes inside each other)."""
    dropped = {i for i in range(len(boxes)) for j in range(len(boxes)) if i != j and _canvas_inside(boxes[i], boxes[j])}
    return [i for i in range(len(boxes)) if i not in dropped]


def _random_boxes(rng, count: int, side: int = 12) -> list[tuple[int, int, int, int]]:
    boxes = []
    for _ in range(count):
        x1, y1 = (int(v) for v in rng.integers(0, side - 1, 2))
        boxes.append((x1, y1, int(rng.integers(x1 + 1, side + 1)), int(rng.integers(y1 + 1, side + 1))))
    return boxes


def test_containment_is_upstreams_canvas_test_on_random_boxes():
    rng = np.random.default_rng(0)
    pairs = [_random_boxes(rng, 2) for _ in range(5000)]
    one_pixel_past = sum(_canvas_inside(a, b) and not (a[2] <= b[2] and a[3] <= b[3]) for a, b in pairs)
    assert one_pixel_past > 50  # the case that differed: the inner box reaches one pixel past the outer one's end
    assert all(_inside(a, b) == _canvas_inside(a, b) for a, b in pairs)


def test_inner_boxes_removed_as_upstream_on_random_masks():
    """60 random noise masks (many small components, boxes one pixel apart): upstream's kept boxes exactly, except
    where two boxes lie inside each other, where upstream drops both and we keep the higher-scoring one."""
    rng = np.random.default_rng(0)
    strict_differs = 0
    for density in [0.1] * 30 + [0.3] * 30:
        noise = rng.random((32, 32)).astype(np.float32)
        mask = noise < density
        found = connected_components(mask, np.where(mask, 1 - noise, 0).astype(np.float32))
        boxes = [c.box for c in found]
        ours = {found.index(c) for c in remove_inner(found)}
        upstream = set(_upstream_kept(boxes))
        mutual = {
            i for i, a in enumerate(boxes) for j, b in enumerate(boxes) if i != j and _inside(a, b) and _inside(b, a)
        }
        assert upstream <= ours and ours - upstream <= mutual
        strict = {
            i
            for i, a in enumerate(boxes)
            if not any(j != i and a[2] <= b[2] and a[3] <= b[3] and _inside(a, b) for j, b in enumerate(boxes))
        }
        strict_differs += strict != upstream
    assert strict_differs > 30  # the one-pixel-stricter test this replaces disagreed with upstream on most of them


def test_one_pixel_past_the_end_is_inside_and_mutual_boxes_keep_the_best():
    crop = np.ones((1, 1), dtype=bool)
    big = Component((0, 0, 10, 10), 0.5, crop, (12, 12))
    past = Component((2, 2, 11, 10), 0.9, crop, (12, 12))  # one column past big's end: upstream calls it inside
    assert _inside(past.box, big.box) and not _inside(big.box, past.box)
    assert remove_inner([big, past]) == [big]
    twin = Component((0, 0, 11, 11), 0.4, crop, (12, 12))  # big and twin lie inside each other
    assert _canvas_inside(big.box, twin.box) and _canvas_inside(twin.box, big.box)
    assert remove_inner([big, twin]) == [big]
