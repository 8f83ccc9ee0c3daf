"""SAM-Road post-processing against upstream's own functions (htcr/sam_road @ 04b67c5, MIT).

Upstream's modules import rtree, igraph, sklearn, cv2 and tcod at import time, so they cannot be imported here; the
functions below are reimplemented from their source, one statement per upstream line where it matters, citing the
file and lines each mirrors. Only numpy and scipy (which upstream itself uses) do the work.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import scipy.spatial

from geopilot.tools.sam_road_graph import PRESETS, SamRoadPreset, graph_points, patch_query, patch_windows, to_uint8


# --- upstream, reimplemented ------------------------------------------------------------------------------------------
def upstream_nms_points(points, scores, radius):
    """graph_utils.py L572-591 `nms_points` (return_indices=False)."""
    sorted_indices = np.argsort(scores)[::-1]  # L574
    sorted_points = points[sorted_indices, :]  # L575
    sorted_scores = scores[sorted_indices]  # L576
    kept = np.ones(sorted_indices.shape[0], dtype=bool)  # L577
    tree = scipy.spatial.KDTree(sorted_points)  # L578
    for idx, p in enumerate(sorted_points):  # L579
        if not kept[idx]:  # L580-581
            continue
        neighbor_indices = tree.query_ball_point(p, r=radius)  # L583
        kept[neighbor_indices] = np.greater(sorted_scores[neighbor_indices], 1.0)  # L584-586
        kept[idx] = True  # L587
    return sorted_points[kept]  # L591


def upstream_points_and_scores(mask, threshold):
    """graph_extraction.py L24-28 `get_points_and_scores_from_mask`: (x, y) points and the mask's own values."""
    rcs = np.column_stack(np.where(mask > threshold))
    return rcs[:, ::-1], mask[mask > threshold]


def upstream_extract_graph_points(keypoint_mask, road_mask, preset: SamRoadPreset):
    """graph_extraction.py L130-139 `extract_graph_points` (config fields as in config/toponet_vitb_*.yaml)."""
    candidates, scores = upstream_points_and_scores(keypoint_mask, preset.keypoint_threshold * 255)  # L131
    kps_0 = upstream_nms_points(candidates, scores, preset.keypoint_nms_radius)  # L132
    candidates, scores = upstream_points_and_scores(road_mask, preset.road_threshold * 255)  # L133
    kps_1 = upstream_nms_points(candidates, scores, preset.road_nms_radius)  # L134
    candidates = np.concatenate([kps_0, kps_1], axis=0)  # L136
    scores = np.concatenate([np.ones(kps_0.shape[0]), np.zeros(kps_1.shape[0])], axis=0)  # L137
    return upstream_nms_points(candidates, scores, preset.road_nms_radius)  # L138


def upstream_patch_pairs(graph_points_xy, x0, y0, patch_size, preset: SamRoadPreset):
    """inferencer.py L150-171: one patch's (source, target) pairs and validity. The rtree box query (L150) is the
    inclusive box test, in insertion (= index) order."""
    x1, y1 = x0 + patch_size, y0 + patch_size
    inside = [
        i for i, (x, y) in enumerate(graph_points_xy.tolist()) if x0 <= x <= x1 and y0 <= y <= y1
    ]  # rtree.intersection
    patch_points = graph_points_xy[inside, :] - np.array([[x0, y0]], dtype=graph_points_xy.dtype)  # L154
    tree = scipy.spatial.KDTree(patch_points)  # L156
    _, knn_idx = tree.query(
        patch_points, k=preset.max_neighbors + 1, distance_upper_bound=preset.neighbor_radius
    )  # L160
    knn_idx = knn_idx[:, 1:]  # L162
    src_idx = np.tile(np.arange(len(inside))[:, np.newaxis], (1, preset.max_neighbors))  # L164-167
    valid = knn_idx < len(inside)  # L168
    tgt_idx = np.where(valid, knn_idx, src_idx)  # L169
    return np.array(inside), np.stack([src_idx, tgt_idx], axis=-1), valid  # L171


def upstream_patch_grid(image_size, sample_margin, patch_size, patches_per_edge):
    """dataset.py L56-67 `get_patch_info_one_img`: (x0, y0) of every patch, x outer, y inner."""
    samples = np.linspace(start=sample_margin, stop=image_size - (patch_size + sample_margin), num=patches_per_edge)
    samples = [round(x) for x in samples]
    return [(x, y) for x in samples for y in samples]


# --- synthetic network outputs ----------------------------------------------------------------------------------------
def synthetic_masks(size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Fused sigmoid maps of a few straight roads (saturating cores: long runs of equal 8-bit values, as real road
    maps have) with noise, and keypoint blobs; scaled to 8 bits as inferencer.py L109-110 does."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    road = np.zeros((size, size), np.float32)
    for _ in range(rng.integers(3, 7)):
        a, b = rng.uniform(0, size, 2), rng.uniform(0, size, 2)
        d = b - a
        t = np.clip(((xx - a[0]) * d[0] + (yy - a[1]) * d[1]) / (d @ d), 0, 1)
        dist = np.hypot(xx - a[0] - t * d[0], yy - a[1] - t * d[1])
        core = np.clip(1.3 * np.exp(-((dist / rng.uniform(2, 6)) ** 2)), 0, 1) * rng.uniform(0.6, 1.0)
        road = np.maximum(road, core.astype(np.float32))
    road = np.clip(road + rng.normal(0, 0.03, road.shape).astype(np.float32), 0, 1)
    keypoint = np.zeros_like(road)
    for _ in range(rng.integers(4, 10)):
        c = rng.uniform(0, size, 2)
        blob = np.exp(-((xx - c[0]) ** 2 + (yy - c[1]) ** 2) / (2 * rng.uniform(3, 8) ** 2))
        keypoint = np.maximum(keypoint, blob.astype(np.float32))
    return to_uint8(keypoint), to_uint8(road)


CASES = [(name, seed) for name in ("cityscale", "spacenet") for seed in range(8)]
MASK_SIZE = {"cityscale": 512, "spacenet": 400}  # one CityScale patch; one whole SpaceNet tile


@pytest.mark.parametrize(("preset_name", "seed"), CASES)
def test_graph_points_are_upstreams_points_in_upstreams_order(preset_name, seed):
    preset = PRESETS[preset_name]
    keypoint, road = synthetic_masks(MASK_SIZE[preset_name], seed)
    expected = upstream_extract_graph_points(keypoint, road, preset)
    ours = graph_points(keypoint, road, preset)
    assert len(expected) > 20  # enough points for ties to matter
    assert ours.tolist() == expected.tolist()


def test_the_float64_scores_of_the_old_code_would_keep_other_points():
    """The fault this guards against (issue 23 item 1): the same NMS on float64 copies of the scores."""
    preset = PRESETS["cityscale"]
    keypoint, road = synthetic_masks(512, 0)
    as_float = upstream_extract_graph_points(keypoint.astype(np.float64), road.astype(np.float64), preset)
    assert as_float.tolist() != graph_points(keypoint, road, preset).tolist()


def test_candidate_pairs_are_upstreams_with_ties_in_scipys_order():
    """A 16 px lattice (after NMS the densest layout): many neighbours at equal distances across the 16-cut."""
    preset = replace(PRESETS["cityscale"], patch_size=128)
    grid = np.array([(x, y) for y in range(8, 130, 16) for x in range(4, 130, 16)], dtype=np.int64)
    for x0, y0 in [(0, 0), (2, 6)]:
        query = patch_query(grid, x0, y0, preset)
        indices, pairs, valid = upstream_patch_pairs(grid, x0, y0, preset.patch_size, preset)
        assert query.indices.tolist() == indices.tolist()
        assert query.pairs.tolist() == pairs.tolist() and query.valid.tolist() == valid.tolist()


@pytest.mark.parametrize(("preset_name", "image_size"), [("cityscale", 2048), ("spacenet", 400)])
def test_default_patch_grid_is_upstreams_at_its_trained_size(preset_name, image_size):
    preset = PRESETS[preset_name]
    margin = {"cityscale": 64, "spacenet": 0}[preset_name]  # config/toponet_vitb_*.yaml SAMPLE_MARGIN
    expected = upstream_patch_grid(image_size, margin, preset.patch_size, 16)  # INFER_PATCHES_PER_EDGE: 16
    assert patch_windows(image_size, image_size, preset) == expected
    assert len(expected) == 256
