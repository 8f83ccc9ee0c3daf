"""SAM-Road: graph post-processing on hand-made network outputs, tiny forward passes, the tool path, bad input."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from PIL import Image

from geopilot.errors import GeoPilotInputError
from geopilot.loaded_image import LoadedImage
from geopilot.tool_output import RoadGraph, ToolOutput, llm_view
from geopilot.tools.adapters import RoadExtractorAdapter
from geopilot.tools.sam_road import SamRoad
from geopilot.tools.sam_road_graph import (
    PRESETS,
    graph_points,
    nms_points,
    patch_query,
    patch_starts,
    patch_windows,
    score_edges,
    to_road_graph,
)
from geopilot.tools.task_tools import TASKS_BY_NAME, NoParams, TaskTool

SIZE = 160
CENTRE = (80, 80)
ARM = [16, 48, 112, 144]  # 32 px apart: neighbours (< 64 px) of each other, not of the node after next


def _cross_masks() -> tuple[np.ndarray, np.ndarray]:
    """8-bit network outputs of a '+' crossing at (80, 80): one keypoint pixel, road peaks every 32 px, a faint road
    line under the thresholds, and a road peak 8 px from the crossing that the keypoint must absorb."""
    keypoint = np.zeros((SIZE, SIZE), np.uint8)
    keypoint[CENTRE[1], CENTRE[0]] = 230
    road = np.zeros((SIZE, SIZE), np.uint8)
    road[CENTRE[1], :] = 60  # below 0.364 * 255 = 92.8
    road[:, CENTRE[0]] = 60
    for v in ARM:
        road[CENTRE[1], v] = 200  # horizontal arm, (x, y) = (v, 80)
        road[v, CENTRE[0]] = 200  # vertical arm, (x, y) = (80, v)
    road[CENTRE[1], CENTRE[0] + 8] = 250  # highest road score, but within 16 px of the keypoint
    return keypoint, road


def _cross_truth() -> set[frozenset]:
    chain_x = [(16, 80), (48, 80), CENTRE, (112, 80), (144, 80)]
    chain_y = [(80, 16), (80, 48), CENTRE, (80, 112), (80, 144)]
    return {frozenset((a, b)) for chain in (chain_x, chain_y) for a, b in zip(chain, chain[1:], strict=False)}


def test_known_cross_gives_the_expected_nodes_and_edges():
    preset = replace(PRESETS["cityscale"], patch_size=128, patch_stride=32, sample_margin=0)
    keypoint, road = _cross_masks()
    points = graph_points(keypoint, road, preset)
    assert tuple(points[0]) == CENTRE  # keypoints first
    expected_nodes = {CENTRE} | {(v, 80) for v in ARM} | {(80, v) for v in ARM}
    assert {tuple(p) for p in points.tolist()} == expected_nodes

    truth = _cross_truth()
    seen_pairs = set()

    def edge_map(patch_index, query):  # a hand-made TopoNet: 0.9 on the true road segments, 0.1 elsewhere
        scores = np.full(query.valid.shape, 0.1)
        for s, t in zip(*np.nonzero(query.valid), strict=True):
            a, b = (tuple(points[query.indices[query.pairs[s, t, i]]].tolist()) for i in (0, 1))
            seen_pairs.add(frozenset((a, b)))
            if frozenset((a, b)) in truth:
                scores[s, t] = 0.9
        return scores

    windows = patch_windows(SIZE, SIZE, preset)
    assert windows == [(0, 0), (0, 32), (32, 0), (32, 32)]
    edges = score_edges(points, windows, edge_map, preset)
    assert {frozenset((tuple(points[a]), tuple(points[b]))) for a, b in edges} == truth
    # candidates are pairs closer than 64 px: (16, 80)-(80, 80) is exactly 64 apart and never scored; the diagonal
    # (48, 80)-(80, 48) is a candidate (45 px) that the edge map rejects
    assert frozenset(((16, 80), CENTRE)) not in seen_pairs and frozenset(((48, 80), (80, 48))) in seen_pairs

    graph = to_road_graph(points, edges, SIZE, SIZE)
    assert isinstance(graph, RoadGraph) and len(graph.nodes) == 9 and len(graph.edges) == 8
    assert graph.nodes[0] == (0.5, 0.5)
    view = llm_view(ToolOutput(roads=graph))["roads"]
    assert view == {"nodes": 9, "edges": 8, "intersections": 1, "length": 1.6}


def test_edge_scores_are_averaged_over_patches_and_thresholded_per_preset():
    points = np.array([[10, 10], [40, 10]])
    per_patch = {0: 0.9, 1: 0.25}  # mean 0.575: above CityScale's 0.5, below SpaceNet's 0.705

    def scorer(patch_index, query):
        return np.where(query.valid, per_patch[patch_index], 0.0)

    for name, expected in (("cityscale", [(0, 1)]), ("spacenet", [])):
        preset = replace(PRESETS[name], patch_size=64)
        assert score_edges(points, [(0, 0), (0, 0)], scorer, preset) == expected


def test_nms_never_suppresses_scores_above_one_as_upstream():
    points = np.array([[0, 0], [5, 0], [16, 0], [17, 0]])
    assert len(nms_points(points, np.array([200.0, 150.0, 100.0, 90.0]), 16)) == 4  # 8-bit scores: all kept
    kept = nms_points(points, np.array([1.0, 0.9, 0.8, 0.7]), 16)
    assert kept.tolist() == [[0, 0], [17, 0]]  # radius inclusive: 16 px away is suppressed


def test_patch_grid_reproduces_upstream_inference_grids():
    cityscale = [round(x) for x in np.linspace(64, 2048 - 512 - 64, 16)]  # 16 per edge, margin 64
    cityscale_preset, spacenet_preset = PRESETS["cityscale"], PRESETS["spacenet"]
    assert patch_starts(2048, cityscale_preset) == cityscale
    spacenet = [round(x) for x in np.linspace(0, 400 - 256, 16)]
    assert patch_starts(400, spacenet_preset) == spacenet
    assert patch_starts(512, cityscale_preset) == [0]  # the margin does not fit: one patch
    assert patch_starts(600, cityscale_preset) == [44]  # ... centred: 44 px each side stay blank
    # other sizes keep upstream's spacing (<= 94 px) and margin: 1024 px -> 64..448 in 6 steps of 76.8
    assert patch_starts(1024, cityscale_preset) == [64, 141, 218, 294, 371, 448]
    assert patch_starts(2048, cityscale_preset, margin=0) == [round(x) for x in np.linspace(0, 1536, 18)]


def test_patch_query_takes_at_most_16_neighbours_closer_than_the_radius():
    preset = replace(PRESETS["cityscale"], patch_size=128)
    points = np.array([[60, 60]] + [[60 + dx, 40] for dx in range(-40, 41, 4)] + [[60, 124]])
    query = patch_query(points, 0, 0, preset)
    assert query.pairs.shape == (len(points), 16, 2)
    centre_neighbours = query.pairs[0, query.valid[0], 1]
    assert len(centre_neighbours) == 16 and (len(points) - 1) not in centre_neighbours  # (60, 124) is 64 away
    assert (query.pairs[~query.valid][:, 1] == query.pairs[~query.valid][:, 0]).all()  # padding points at itself


@pytest.fixture(scope="module")
def tiny_road():
    return SamRoad.tiny(seed=0, patch_size=64)


def test_tiny_forward_gives_a_valid_graph_for_non_square_and_one_band_images(tiny_road):
    rng = np.random.default_rng(0)
    for image in (
        Image.fromarray(rng.integers(0, 255, (72, 100, 3), dtype=np.uint8)),
        Image.fromarray(rng.integers(0, 255, (50, 40), dtype=np.uint8), "L"),  # smaller than a patch, 1 band
    ):
        graph = tiny_road.extract(image)
        assert isinstance(graph, RoadGraph) and len(graph.nodes) > 0
        assert all(0.0 <= x <= 1.0 and 0.0 <= y <= 1.0 for x, y in graph.nodes)
        assert all(a < b for a, b in graph.edges) and len(set(graph.edges)) == len(graph.edges)
        RoadGraph.model_validate(graph.model_dump())


def test_tool_path_returns_a_schema_valid_output(tiny_road):
    tool = TaskTool(TASKS_BY_NAME["extract_roads"], RoadExtractorAdapter(tiny_road), "sam_road", 10**6)
    out = tool.run(LoadedImage(Image.new("RGB", (80, 64), (90, 90, 90))), NoParams())
    assert out.roads is not None
    ToolOutput.model_validate(out.model_dump())
    assert set(llm_view(out)["roads"]) == {"nodes", "edges", "intersections", "length"}


def test_scene_needing_too_many_patches_is_refused_clearly():
    road = SamRoad.tiny(patch_size=64, max_patches=4)
    with pytest.raises(GeoPilotInputError, match=r"a 200x150 scene needs \d+ SAM-Road patches of 64 px \(limit 4\)"):
        road.extract(Image.new("RGB", (200, 150)))
