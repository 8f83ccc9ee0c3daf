"""Tiled detection on a scene 4x the tile size: objects across tile borders are found exactly once, in place."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from geopilot.image import load_image
from geopilot.sample import Action
from geopilot.tool_output import Detection
from geopilot.tool_protocol import ToolRegistry
from geopilot.tools.adapters import DetectorAdapter, DetectorOptions
from geopilot.tools.task_tools import TASKS_BY_NAME, TaskTool
from geopilot.tools.tiling import detect_windows, tile_windows

TILE, OVERLAP, SCENE = 128, 48, 512  # tiles start at 0, 80, 160, 240, 320, 384 on each axis

# (x1, y1, x2, y2) in pixels; most straddle a tile edge (x or y = 80, 128, 160, 208, 240, 288, ...)
OBJECTS = [
    (110, 20, 146, 50),  # across x = 128 (tile 0's right edge) and x = 160 (tile 2's left edge)
    (70, 70, 100, 100),  # across x = 80 and y = 80: a corner shared by four tiles
    (200, 300, 236, 330),  # across x = 208 and y = 320
    (370, 120, 410, 150),  # across x = 384 (the last, flush tile) and y = 128
    (20, 440, 50, 470),  # inside the bottom row only
    (280, 200, 300, 215),  # small, across x = 288
    (470, 470, 505, 500),  # bottom-right corner region
]


# larger than the overlap, so no tile sees them whole: their pieces are joined
BIG_OBJECTS = [
    (100, 100, 230, 140),  # 130 px wide, across three tile columns
    (300, 250, 340, 420),  # 170 px tall
    (20, 300, 60, 330),  # a small one next to them
]


def _scene(objects=OBJECTS) -> Image.Image:
    pixels = np.zeros((SCENE, SCENE, 3), dtype=np.uint8)
    for index, (x1, y1, x2, y2) in enumerate(objects):
        pixels[y1:y2, x1:x2] = (40 + 30 * index, 255 - 20 * index, 100)  # one colour per object
    return Image.fromarray(pixels, "RGB")


class ColourBoxDetector:
    """Sees what is drawn: one box per distinct non-black colour in the image it is given. Counts its calls."""

    def __init__(self):
        self.calls = 0

    def detect(self, image: Image.Image, categories: list[str]) -> list[Detection]:
        self.calls += 1
        pixels = np.asarray(image)
        height, width = pixels.shape[:2]
        flat = pixels.reshape(-1, 3)
        found = []
        for colour in {tuple(c) for c in flat[flat.any(axis=1)]}:
            ys, xs = np.nonzero((pixels == colour).all(axis=2))
            box = (xs.min() / width, ys.min() / height, (xs.max() + 1) / width, (ys.max() + 1) / height)
            found.append(Detection(label=categories[0], box=tuple(round(v, 3) for v in box), score=0.9))
        return found


def test_windows_cover_the_scene_with_the_overlap():
    windows = tile_windows(SCENE, SCENE, TILE, OVERLAP)
    assert len(windows) == 36
    assert sorted({w[0] for w in windows}) == [0, 80, 160, 240, 320, 384]
    assert all(x1 - x0 == TILE and y1 - y0 == TILE for x0, y0, x1, y1 in windows)


def test_objects_across_tile_borders_are_found_exactly_once():
    detector = ColourBoxDetector()
    raw = sum(len(detector.detect(_scene().crop(w), ["box"])) for w in tile_windows(SCENE, SCENE, TILE, OVERLAP))
    assert raw > 2 * len(OBJECTS)  # the scene really does cut objects into several tiles' detections
    merged = detect_windows(
        lambda tile: detector.detect(tile, ["box"]), _scene(), tile=TILE, overlap=OVERLAP
    ).detections
    assert len(merged) == len(OBJECTS)
    found = sorted(tuple(round(v * SCENE) for v in d.box) for d in merged)
    assert found == sorted(OBJECTS)


def test_objects_larger_than_the_overlap_are_joined_into_one_box():
    detector = ColourBoxDetector()
    merged = detect_windows(
        lambda tile: detector.detect(tile, ["box"]), _scene(BIG_OBJECTS), tile=TILE, overlap=OVERLAP
    ).detections
    found = sorted(tuple(round(v * SCENE) for v in d.box) for d in merged)
    assert found == sorted(BIG_OBJECTS)


def test_small_images_are_not_tiled():
    detector = ColourBoxDetector()
    image = _scene().crop((0, 0, 120, 120))
    assert (
        len(detect_windows(lambda tile: detector.detect(tile, ["box"]), image, tile=TILE, overlap=OVERLAP).detections)
        == 2
    )
    assert detector.calls == 1


def test_overlap_must_be_smaller_than_the_tile():
    with pytest.raises(ValueError, match="overlap"):
        tile_windows(SCENE, SCENE, 64, 64)


def test_detector_adapter_tiles_through_the_registry():
    detector = ColourBoxDetector()
    options = DetectorOptions(tile_size=TILE, tile_overlap=OVERLAP, score_threshold=0.5)
    adapter = DetectorAdapter(detector, options)
    registry = ToolRegistry(
        [TaskTool(TASKS_BY_NAME[name], adapter, "fake", 10**8) for name in ("detect_objects", "ground")]
    )
    result = registry.call(Action(tool="detect_objects", params={"categories": ["box"]}), load_image(_scene()))
    assert result.ok and len(result.output.detections) == len(OBJECTS)
    assert detector.calls == 36
    strict = registry.call(
        Action(tool="detect_objects", params={"categories": ["box"], "score_threshold": 0.95}), load_image(_scene())
    )
    assert strict.ok and strict.output.detections == []
    grounded = registry.call(Action(tool="ground", params={"expression": "the box"}), load_image(_scene()))
    assert grounded.ok and len(grounded.output.detections) == 1 and grounded.output.detections[0].label == "the box"
