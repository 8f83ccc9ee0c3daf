"""`geopilot chat --out` drawing: boxes, polygons, masks (COCO RLE) and road graphs change the pixels where they are."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from geopilot.tool_output import RLE, Detection, RoadGraph, SegmentClass, ToolOutput
from geopilot.visualize import draw_outputs


def _rle(mask: np.ndarray) -> RLE:
    from pycocotools import mask as mask_utils

    encoded = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return RLE(size=tuple(encoded["size"]), counts=encoded["counts"].decode())


@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")  # inside pycocotools' decode
def test_draws_boxes_masks_and_roads_where_they_are():
    image = Image.new("RGB", (100, 80), (0, 0, 0))
    mask = np.zeros((80, 100), dtype=bool)
    mask[60:80, 0:20] = True
    outputs = [
        ToolOutput(detections=[Detection(label="plane", box=(0.1, 0.1, 0.5, 0.5), score=0.8)]),
        ToolOutput(segments=[SegmentClass(label="water", area=0.04, mask=_rle(mask))]),
        ToolOutput(roads=RoadGraph(nodes=[(0.6, 0.9), (0.95, 0.9)], edges=[(0, 1)])),
    ]
    drawn = np.asarray(draw_outputs(image, outputs))
    assert drawn[8, 30].any()  # top edge of the box (y = 0.1 * 80)
    assert not drawn[30, 30].any()  # inside the box stays untouched
    assert drawn[70, 10].any() and not drawn[50, 10].any()  # the mask overlay, only on the mask
    assert drawn[72, 80].any()  # the road line at y = 0.9 * 80
    assert np.asarray(image).sum() == 0  # the input is not modified


def test_a_chain_is_drawn_as_the_input_then_each_result_on_the_image_it_read(tmp_path):
    from geopilot.agent.results import ToolCallRecord
    from geopilot.tool_output import Artifact
    from geopilot.visualize import chain_panels, draw_chain

    image = Image.new("RGB", (64, 48), (0, 0, 0))
    restored = tmp_path / "restored.png"
    Image.new("RGB", (64, 48), (200, 200, 200)).save(restored)
    ship = Detection(label="ship", box=(0.25, 0.25, 0.75, 0.75))
    calls = [
        ToolCallRecord(
            round=1,
            tool="remove_clouds",
            params={},
            output=ToolOutput(artifacts=[Artifact(kind="image", path=str(restored))]),
        ),
        ToolCallRecord(
            round=2,
            tool="detect_objects",
            params={"image": "result:1"},
            output=ToolOutput(detections=[ship], computed_on="result:1"),
        ),
        ToolCallRecord(round=2, tool="segment_semantic", params={}, error="timeout"),
    ]
    panels = chain_panels(image, calls)
    assert [caption for caption, _ in panels] == [
        "input",
        "1. remove_clouds",
        "2. detect_objects on result:1",
        "3. segment_semantic (failed)",
    ]
    final = np.asarray(panels[2][1])
    assert final[24, 32].tolist() == [200, 200, 200]  # drawn on the restored image, not on the black input
    assert final[12, 32].tolist() != [200, 200, 200]  # the box's top edge (y = 0.25 * 48)
    strip = draw_chain(image, calls[:2], height=96)
    assert strip.size == (3 * 128 + 2 * 28, 96 + 18)  # three panels at one height, two arrows between them
