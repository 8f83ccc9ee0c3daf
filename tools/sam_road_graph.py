"""SAM-Road graph extraction (torch-free): presets, patch layout, graph points, candidate edges, edge aggregation.

Reimplements htcr/sam_road (MIT) `inferencer.py::infer_one_img`, `graph_extraction.py::extract_graph_points` and
`graph_utils.py::nms_points` (numpy + scipy's KDTree, without rtree); `tests/tools/test_sam_road_upstream.py` checks
points and their order against upstream's functions on synthetic masks of both presets:

1. Fused masks: every patch's sigmoid keypoint and road maps are averaged where patches overlap, then scaled to
   8 bits by truncation (`(mask * 255).to(uint8)`), as upstream; always in float32, whatever the network runs in.
2. Graph points: pixels above the keypoint threshold, then pixels above the road threshold, each through
   `nms_points` with their uint8 mask values as scores; then both lists together (keypoints scored 1.0, road points
   0.0) through one NMS of the road radius. Upstream quirk kept: `nms_points` never suppresses a point whose score is
   above 1.0, and the 8-bit mask values always are, so the first two passes keep every candidate and only sort it;
   the result is one radius-16 NMS. The order is numpy's `np.argsort(scores)[::-1]` on upstream's dtypes (uint8,
   then float64): argsort breaks ties differently per dtype, and a different tie order keeps different points.
3. Candidate edges, per patch: the points inside the patch (bounds inclusive, as upstream's rtree query, in index
   order), each with its up to 16 nearest other points closer than 64 px: scipy `KDTree.query(k=17,
   distance_upper_bound=64)` as upstream, so equal distances come in scipy's order.
4. Edge scores: TopoNet's probability for each (source, target) pair, averaged over the patches that scored it;
   a pair is kept above the preset's threshold. Upstream returns directed pairs; the canonical graph is undirected,
   so an edge is kept when either direction is.
Output nodes are (x, y) pixels (upstream returns (row, col)); `to_road_graph` normalises them by the image size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from geopilot.tool_output import RoadGraph
from geopilot.tools.canonical import unit_polygon


@dataclass(frozen=True)
class SamRoadPreset:
    """Upstream `config/toponet_vitb_*.yaml` values and the tile size each was trained and evaluated on."""

    name: str
    checkpoint: str  # file name on HF `congrui/sam_road`
    patch_size: int  # PATCH_SIZE: the encoder's input size
    keypoint_threshold: float  # ITSC_THRESHOLD
    road_threshold: float  # ROAD_THRESHOLD
    topo_threshold: float  # TOPO_THRESHOLD
    trained_image_size: int | None  # the dataset's tile edge (CityScale 2048, SpaceNet 400); None = no such size
    sample_margin: int  # SAMPLE_MARGIN: a border no patch starts in (CityScale 64: upstream leaves it blank)
    patch_stride: int  # upstream's spacing at the trained size, rounded up: the grid rule at other sizes
    patches_per_edge: int = 16  # INFER_PATCHES_PER_EDGE
    keypoint_nms_radius: int = 8  # ITSC_NMS_RADIUS
    road_nms_radius: int = 16  # ROAD_NMS_RADIUS
    neighbor_radius: float = 64.0  # NEIGHBOR_RADIUS
    max_neighbors: int = 16  # MAX_NEIGHBOR_QUERIES


# CityScale: 16 patches per edge over 64..1472 of a 2048 px tile = stride 93.9; SpaceNet: 16 over 0..144 of 400 = 9.6.
PRESETS: dict[str, SamRoadPreset] = {
    "cityscale": SamRoadPreset("cityscale", "cityscale_vitb_512_e10.ckpt", 512, 0.248, 0.364, 0.500, 2048, 64, 94),
    "spacenet": SamRoadPreset("spacenet", "spacenet_vitb_256_e10.ckpt", 256, 0.195, 0.341, 0.705, 400, 0, 10),
}


def patch_starts(length: int, preset: SamRoadPreset, margin: int | None = None) -> list[int]:
    """Patch offsets along one axis (`length` >= the patch size; the caller pads smaller images).

    At the preset's trained tile size with its own margin: upstream's `dataset.py::get_patch_info_one_img` exactly,
    `patches_per_edge` offsets `round(np.linspace(margin, length - patch - margin))`. At any other size or margin:
    the same linspace with as many offsets as keep upstream's spacing (at most `patch_stride` apart), so each pixel is
    averaged over about as many patches as upstream's; when the margins leave no room, one centred patch."""
    margin = preset.sample_margin if margin is None else margin
    lo, hi = margin, length - preset.patch_size - margin
    if hi < lo:
        lo = hi = (length - preset.patch_size) // 2
    if length == preset.trained_image_size and margin == preset.sample_margin:
        count = preset.patches_per_edge
    else:
        count = math.ceil((hi - lo) / preset.patch_stride) + 1 if hi > lo else 1
    return sorted({round(x) for x in np.linspace(lo, hi, count)})  # upstream's trained sizes have no repeats


def patch_windows(width: int, height: int, preset: SamRoadPreset, margin: int | None = None) -> list[tuple[int, int]]:
    """(x0, y0) of every patch, x outer and y inner as upstream; non-square images get a grid per axis."""
    xs, ys = patch_starts(width, preset, margin), patch_starts(height, preset, margin)
    return [(x, y) for x in xs for y in ys]


def to_uint8(mask: np.ndarray) -> np.ndarray:
    """Upstream `(mask * 255).to(torch.uint8)`: truncation, after clipping to [0, 1]."""
    return (np.clip(mask, 0.0, 1.0) * 255.0).astype(np.uint8)


def points_above(mask: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) integer points where the 8-bit mask exceeds threshold * 255, row by row, and their mask values in the
    mask's own dtype (uint8: the dtype decides the tie order of the NMS sort)."""
    hit = mask > threshold * 255
    rows, cols = np.nonzero(hit)
    return np.stack([cols, rows], axis=1).astype(np.int64), mask[hit]


def nms_points(points: np.ndarray, scores: np.ndarray, radius: float) -> np.ndarray:
    """Upstream `nms_points`: visit points by descending score (`np.argsort(scores)[::-1]` on the scores' own dtype,
    as upstream); a point is kept if its score is above 1.0 or no kept point lies within `radius` (inclusive).
    Returns the kept points in visiting order."""
    if len(points) == 0:
        return points.reshape(0, 2)
    order = np.argsort(scores)[::-1]
    points, scores = points[order], scores[order]
    forced = scores > 1.0
    if forced.all():
        return points
    cell = max(float(radius), 1.0)
    grid: dict[tuple[int, int], list[int]] = {}
    kept = np.zeros(len(points), dtype=bool)
    r2 = float(radius) ** 2
    for index, (x, y) in enumerate(points.tolist()):
        cx, cy = int(x // cell), int(y // cell)
        if not forced[index]:
            near = [j for dx in (-1, 0, 1) for dy in (-1, 0, 1) for j in grid.get((cx + dx, cy + dy), ())]
            if near:
                d = points[near] - (x, y)
                if ((d * d).sum(axis=1) <= r2).any():
                    continue
        kept[index] = True
        grid.setdefault((cx, cy), []).append(index)
    return points[kept]


def graph_points(keypoint_mask: np.ndarray, road_mask: np.ndarray, preset: SamRoadPreset) -> np.ndarray:
    """Upstream `extract_graph_points` on 8-bit masks: (N, 2) integer (x, y) points, keypoints first."""
    keypoints = nms_points(*points_above(keypoint_mask, preset.keypoint_threshold), preset.keypoint_nms_radius)
    roads = nms_points(*points_above(road_mask, preset.road_threshold), preset.road_nms_radius)
    merged = np.concatenate([keypoints, roads], axis=0)
    priority = np.concatenate([np.ones(len(keypoints)), np.zeros(len(roads))])
    return nms_points(merged, priority, preset.road_nms_radius)


@dataclass(frozen=True)
class PatchQuery:
    """TopoNet's input for one patch: point indices into the whole graph, their patch-relative (x, y), and pairs."""

    indices: np.ndarray  # (P,) indices into the graph points
    points: np.ndarray  # (P, 2) float, relative to the patch origin
    pairs: np.ndarray  # (P, K, 2) patch-local (source, target); invalid pairs point at the source
    valid: np.ndarray  # (P, K) bool


def patch_query(points: np.ndarray, x0: int, y0: int, preset: SamRoadPreset) -> PatchQuery | None:
    """Candidate pairs of one patch (upstream: rtree box query + KD-tree kNN with a distance bound)."""
    size = preset.patch_size
    inside = (points[:, 0] >= x0) & (points[:, 0] <= x0 + size) & (points[:, 1] >= y0) & (points[:, 1] <= y0 + size)
    indices = np.nonzero(inside)[0]
    if len(indices) == 0:
        return None
    from scipy.spatial import KDTree  # the `tools` extra; imported here so the registry builds without it

    local = (points[indices] - np.array([x0, y0])).astype(np.float64)
    count, k = len(indices), preset.max_neighbors
    # k + 1 because the nearest is the point itself; missing neighbours come back as index `count` (upstream L160)
    _, order = KDTree(local).query(local, k=k + 1, distance_upper_bound=preset.neighbor_radius)
    order = np.asarray(order, dtype=np.int64).reshape(count, k + 1)[:, 1:]
    valid = order < count
    source = np.repeat(np.arange(count)[:, None], k, axis=1)
    pairs = np.stack([source, np.where(valid, order, source)], axis=-1)
    return PatchQuery(indices, local, pairs, valid)


PairScorer = Callable[[int, PatchQuery], np.ndarray]  # (patch index, query) -> (P, K) edge probabilities


def score_edges(
    points: np.ndarray, windows: list[tuple[int, int]], scorer: PairScorer, preset: SamRoadPreset
) -> list[tuple[int, int]]:
    """Average each directed pair's probability over the patches that scored it; undirected edges (i < j) of the
    pairs above the preset's threshold, sorted."""
    total: dict[tuple[int, int], float] = {}
    count: dict[tuple[int, int], int] = {}
    for patch_index, (x0, y0) in enumerate(windows):
        query = patch_query(points, x0, y0, preset)
        if query is None:
            continue
        scores = np.asarray(scorer(patch_index, query), dtype=np.float64)
        for s, t in zip(*np.nonzero(query.valid), strict=True):
            pair = (int(query.indices[query.pairs[s, t, 0]]), int(query.indices[query.pairs[s, t, 1]]))
            total[pair] = total.get(pair, 0.0) + float(scores[s, t])
            count[pair] = count.get(pair, 0) + 1
    kept = {(min(a, b), max(a, b)) for (a, b), value in total.items() if value / count[(a, b)] > preset.topo_threshold}
    return sorted(kept)


def to_road_graph(points: np.ndarray, edges: list[tuple[int, int]], width: int, height: int) -> RoadGraph:
    """Pixel (x, y) nodes -> the canonical graph: nodes divided by the image size (as the annotation readers do),
    edges as given (undirected, i < j)."""
    nodes = unit_polygon([(float(x) / width, float(y) / height) for x, y in points.tolist()])
    return RoadGraph(nodes=nodes, edges=edges)
