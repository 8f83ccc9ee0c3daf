"""Tiled inference for large scenes: run a detector on overlapping tiles, merge the boxes so each object counts once.

Rule: tiles of `tile` px overlap by `overlap` px, so every object no larger than `overlap` lies whole inside some
tile. A detection that touches a tile edge inside the scene is marked *cut*; when boxes are merged (per label,
best first, non-cut before cut) a box is dropped if it overlaps a kept one by IoU >= `iou_threshold`, or if it is
cut and lies mostly (>= `containment`) inside a kept box: the fragments a border produces. Objects larger than
the overlap are cut in every tile; their remaining pieces (cut, from different tiles, overlapping each other) are
joined into one box. Masks do not cross tiles and are dropped; rotated polygons are carried over (joined pieces
keep only the union box). Every detection leaves with its geometry in scene pixels, unrounded (`pixel_box`,
`pixel_polygon`: the tile offset plus the detector's own pixel geometry when it gives one, else its box scaled to the
tile), so map coordinates never go through the 3-decimal scene box.

The scene is anything with `size` and `crop(box)`: a PIL image, or a GeoTIFF's `RasterSource`, which reads each
tile at full resolution and returns None for a tile that is all nodata (skipped, and counted).

    found = detect_windows(backend.detect_fn, loaded.raster, tile=1024, overlap=256)   # .detections, .empty_tiles
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from PIL import Image

from geopilot.cancellation import check_cancelled
from geopilot.tool_output import Detection
from geopilot.tools.canonical import pixel_box, unit_polygon

Detector = Callable[[Image.Image], list[Detection]]  # boxes normalised to the image it is given
EDGE_TOLERANCE_PX = 1.0


class Scene(Protocol):
    """What tiles are cut from: a PIL image, or `geopilot.raster.RasterSource` (None: a tile of nodata only)."""

    size: tuple[int, int]

    def crop(self, box: Sequence[int]) -> Image.Image | None: ...


def tile_starts(length: int, tile: int, overlap: int) -> list[int]:
    """Start offsets along one axis: stride tile - overlap, the last tile flush with the end."""
    if length <= tile:
        return [0]
    stride = tile - overlap
    starts = list(range(0, length - tile, stride))
    return starts + [length - tile]


def tile_windows(width: int, height: int, tile: int, overlap: int) -> list[tuple[int, int, int, int]]:
    if not 0 <= overlap < tile:
        raise ValueError(f"tile overlap must be in [0, tile) = [0, {tile}), got {overlap}")
    return [
        (x0, y0, min(x0 + tile, width), min(y0 + tile, height))
        for y0 in tile_starts(height, tile, overlap)
        for x0 in tile_starts(width, tile, overlap)
    ]


def overlaps(boxes: np.ndarray, box: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IoU of `box` (4,) with each of `boxes` (N, 4), and the fraction of `box` that lies inside each of them."""
    lt = np.maximum(boxes[:, :2], box[:2])
    rb = np.minimum(boxes[:, 2:], box[2:])
    inter = (rb - lt).clip(min=0).prod(axis=1)
    areas = (boxes[:, 2:] - boxes[:, :2]).clip(min=0).prod(axis=1)
    area = (box[2:] - box[:2]).clip(min=0).prod()
    return inter / np.maximum(areas + area - inter, 1e-12), inter / max(area, 1e-12)


def merge_detections(
    boxes: np.ndarray, scores: np.ndarray, cut: np.ndarray, iou_threshold: float, containment: float
) -> list[int]:
    """Greedy NMS over one label's boxes, plus suppression of cut fragments; returns kept indices."""
    # Whole boxes before cut ones, then by score, then larger first: a fragment never outranks its object.
    areas = (boxes[:, 2:] - boxes[:, :2]).prod(axis=1)
    order = sorted(range(len(boxes)), key=lambda i: (bool(cut[i]), -float(scores[i]), -float(areas[i])))
    kept: list[int] = []
    for i in order:
        if kept:
            iou, inside = overlaps(boxes[kept], boxes[i])
            if bool((iou >= iou_threshold).any()) or (bool(cut[i]) and bool((inside >= containment).any())):
                continue
        kept.append(i)
    return kept


def join_fragments(boxes: np.ndarray, tiles: list[int], candidates: list[int]) -> list[list[int]]:
    """Groups of cut boxes from different tiles that overlap each other: pieces of one object too big for the
    overlap. Union-find over `candidates`; every other index is its own group."""
    parent = {i: i for i in candidates}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a_pos, a in enumerate(candidates):
        for b in candidates[a_pos + 1 :]:
            if tiles[a] != tiles[b] and float(overlaps(boxes[a : a + 1], boxes[b])[0][0]) > 0.0:
                parent[root(b)] = root(a)
    groups: dict[int, list[int]] = {}
    for i in candidates:
        groups.setdefault(root(i), []).append(i)
    return list(groups.values())


@dataclass(frozen=True)
class _TileDetection:
    detection: Detection
    pixels: tuple[float, float, float, float]  # scene pixel box
    cut: bool  # touches an edge of its tile that lies inside the scene
    tile: int


def _tile_pixels(det: Detection, tw: int, th: int) -> tuple[tuple[float, ...], list[tuple[float, float]] | None]:
    """The detection's box and polygon in its tile's pixels: its own pixel geometry if it has one, else scaled."""
    box = det.pixel_box or tuple(v * s for v, s in zip(det.box, (tw, th, tw, th), strict=True))
    polygon = det.pixel_polygon or ([(x * tw, y * th) for x, y in det.polygon] if det.polygon else None)
    return box, polygon


def _from_tile(det: Detection, window: tuple[int, int, int, int], size: tuple[int, int], tile: int) -> _TileDetection:
    (x0, y0, x1, y1), (width, height) = window, size
    tw, th = x1 - x0, y1 - y0
    (bx1, by1, bx2, by2), tile_polygon = _tile_pixels(det, tw, th)
    pixels = (x0 + bx1, y0 + by1, x0 + bx2, y0 + by2)
    cut = (
        (x0 > 0 and bx1 <= EDGE_TOLERANCE_PX)
        or (y0 > 0 and by1 <= EDGE_TOLERANCE_PX)
        or (x1 < width and bx2 >= tw - EDGE_TOLERANCE_PX)
        or (y1 < height and by2 >= th - EDGE_TOLERANCE_PX)
    )
    scene_polygon = [(x0 + x, y0 + y) for x, y in tile_polygon] if tile_polygon else None
    moved = Detection(
        label=det.label,
        box=pixel_box(pixels, width, height),
        score=det.score,
        polygon=unit_polygon([(x / width, y / height) for x, y in scene_polygon]) if scene_polygon else None,
        pixel_box=pixels,
        pixel_polygon=scene_polygon,
    )
    return _TileDetection(moved, pixels, cut, tile)


def _score(det: Detection) -> float:
    return det.score if det.score is not None else 1.0


def _merge_label(group: list[_TileDetection], size: tuple[int, int], iou_threshold: float, containment: float):
    boxes = np.array([g.pixels for g in group], dtype=np.float64)
    scores = np.array([_score(g.detection) for g in group], dtype=np.float64)
    cuts = np.array([g.cut for g in group], dtype=bool)
    kept = merge_detections(boxes, scores, cuts, iou_threshold, containment)
    whole = [[i] for i in kept if not group[i].cut]
    pieces = join_fragments(boxes, [g.tile for g in group], [i for i in kept if group[i].cut])
    merged = []
    for members in whole + pieces:
        if len(members) == 1:
            merged.append(group[members[0]].detection)
            continue
        union = boxes[members]
        x1, y1 = float(union[:, 0].min()), float(union[:, 1].min())
        x2, y2 = float(union[:, 2].max()), float(union[:, 3].max())
        best = max((group[i].detection for i in members), key=_score)
        union_box = (x1, y1, x2, y2)
        merged.append(
            Detection(label=best.label, box=pixel_box(union_box, *size), score=best.score, pixel_box=union_box)
        )
    return merged


@dataclass(frozen=True)
class TiledDetections:
    detections: list[Detection]
    tiles: int  # windows cut
    empty_tiles: int  # windows that were all nodata: not shown to the detector


def detect_windows(
    detect: Detector,
    scene: Scene,
    tile: int = 1024,
    overlap: int = 256,
    iou_threshold: float = 0.5,
    containment: float = 0.7,
) -> TiledDetections:
    """Detections over the whole scene, in its normalised coordinates and its pixels. A scene no larger than one
    tile goes through in one piece (masks kept)."""
    width, height = scene.size
    windows = tile_windows(width, height, tile, overlap)
    if len(windows) == 1:
        whole = scene.crop(windows[0])
        if whole is None:
            return TiledDetections([], 1, 1)
        found = []
        for det in detect(whole):
            box, polygon = _tile_pixels(det, width, height)
            found.append(det.model_copy(update={"pixel_box": tuple(box), "pixel_polygon": polygon}))
        return TiledDetections(found, 1, 0)
    found, empty = [], 0
    for index, window in enumerate(windows):
        check_cancelled()  # a timed-out call stops here, between tiles (geopilot.cancellation)
        pixels = scene.crop(window)
        if pixels is None:
            empty += 1
            continue
        found += [_from_tile(det, window, scene.size, index) for det in detect(pixels)]
    merged: list[Detection] = []
    for label in dict.fromkeys(f.detection.label for f in found):
        group = [f for f in found if f.detection.label == label]
        merged.extend(_merge_label(group, scene.size, iou_threshold, containment))
    merged.sort(key=lambda d: -_score(d))
    return TiledDetections(merged, len(windows), empty)
