"""SAM-Road graph extraction (torch-free): presets, patch layout, graph points, candidate edges, edge aggregation.

Reimplements htcr/sam_road (MIT) `inferencer.py::infer_one_img`, `graph_extraction.py::extract_graph_points` and
`graph_utils.py::nms_points` with numpy in place of rtree / scipy KD-trees:

1. Fused masks: every patch's sigmoid keypoint and road maps are averaged where patches overlap, then scaled to
   8 bits by truncation (`(mask * 255).to(uint8)`), as upstream.
2. Graph points: pixels above the keypoint threshold, then pixels above the road threshold, each through
   `nms_points`; then both lists together (keypoints scored 1, road points 0) through one NMS of the road radius.
   Upstream quirk kept: `nms_points` never suppresses a point whose score is above 1.0, and the 8-bit mask values
   always are, so the first two passes keep every candidate; the result is one radius-16 NMS that visits keypoint
   pixels first, then road pixels (tie order = upstream's `np.argsort(scores)[::-1]`).
3. Candidate edges, per patch: the points inside the patch (bounds inclusive, as upstream's rtree query), each with
   its up to 16 nearest other points closer than 64 px (scipy `KDTree.query(k=17, distance_upper_bound=64)`).
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
    """Upstream `config/toponet_vitb_*.yaml` values; `patch_stride` reproduces its patch grid (see `patch_starts`)."""

    name: str
    checkpoint: str  # file name on HF `congrui/sam_road`
    patch_size: int  # PATCH_SIZE: the encoder's input size
    keypoint_threshold: float  # ITSC_THRESHOLD
    road_threshold: float  # ROAD_THRESHOLD
    topo_threshold: float  # TOPO_THRESHOLD
    patch_stride: int  # INFER_PATCHES_PER_EDGE over the dataset's tiles, as a stride (rounded up)
    sample_margin: int = 0  # upstream SAMPLE_MARGIN (CityScale: 64, a border its evaluation crops off)
    keypoint_nms_radius: int = 8  # ITSC_NMS_RADIUS
    road_nms_radius: int = 16  # ROAD_NMS_RADIUS
    neighbor_radius: float = 64.0  # NEIGHBOR_RADIUS
    max_neighbors: int = 16  # MAX_NEIGHBOR_QUERIES


# CityScale: 16 patches per edge of a 2048 px tile with a 64 px margin = stride 93.9; SpaceNet: 16 per 400 px = 9.6.
# With sample_margin=64 on a 2048 px image, stride 94 gives exactly upstream's 16 patch positions.
PRESETS: dict[str, SamRoadPreset] = {
    "cityscale": SamRoadPreset("cityscale", "cityscale_vitb_512_e10.ckpt", 512, 0.248, 0.364, 0.500, 94),
    "spacenet": SamRoadPreset("spacenet", "spacenet_vitb_256_e10.ckpt", 256, 0.195, 0.341, 0.705, 10),
}


def patch_starts(length: int, patch: int, stride: int, margin: int = 0) -> list[int]:
    """Patch offsets along one axis: upstream `get_patch_info_one_img` (np.linspace from margin to the far end)
    with the count derived from a stride. `length` must be >= `patch` (the caller pads smaller images)."""
    lo, hi = margin, length - patch - margin
    if hi < lo:  # the margin does not fit: one centred patch
        lo = hi = (length - patch) // 2
    count = math.ceil((hi - lo) / stride) + 1 if hi > lo else 1
    return sorted({round(x) for x in np.linspace(lo, hi, count)})


def patch_windows(width: int, height: int, preset: SamRoadPreset, margin: int | None = None) -> list[tuple[int, int]]:
    """(x0, y0) of every patch, row by row in x then y as upstream (x outer loop)."""
    margin = preset.sample_margin if margin is None else margin
    xs = patch_starts(width, preset.patch_size, preset.patch_stride, margin)
    ys = patch_starts(height, preset.patch_size, preset.patch_stride, margin)
    return [(x, y) for x in xs for y in ys]


def to_uint8(mask: np.ndarray) -> np.ndarray:
    """Upstream `(mask * 255).to(torch.uint8)`: truncation, after clipping to [0, 1]."""
    return (np.clip(mask, 0.0, 1.0) * 255.0).astype(np.uint8)


def points_above(mask: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) integer points where the 8-bit mask exceeds threshold * 255, and their mask values."""
    hit = mask > threshold * 255
    rows, cols = np.nonzero(hit)
    return np.stack([cols, rows], axis=1).astype(np.int64), mask[hit].astype(np.float64)


def nms_points(points: np.ndarray, scores: np.ndarray, radius: float) -> np.ndarray:
    """Upstream `nms_points`: visit points by descending score; a point is kept if its score is above 1.0 or no
    kept point lies within `radius` (inclusive). Returns the kept points in visiting order."""
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
    local = (points[indices] - np.array([x0, y0])).astype(np.float64)
    count, k = len(indices), preset.max_neighbors
    distance = np.sqrt(((local[:, None, :] - local[None, :, :]) ** 2).sum(axis=-1))
    order = np.argsort(distance, axis=1, kind="stable")[:, : k + 1]
    nearest = np.take_along_axis(distance, order, axis=1)
    order = np.where(nearest < preset.neighbor_radius, order, count)[:, 1:]  # column 0 is the point itself
    if order.shape[1] < k:  # fewer than k other points: pad with "no neighbour"
        order = np.pad(order, ((0, 0), (0, k - order.shape[1])), constant_values=count)
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
