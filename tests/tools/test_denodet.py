"""DenoDet: GFL decoding of hand-made head outputs, the DCT attention, tiny forward passes, tiling, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from geopilot.errors import GeoPilotInputError
from geopilot.loaded_image import LoadedImage
from geopilot.tool_output import ToolOutput
from geopilot.tools.adapters import DetectorAdapter, SarDetectorOptions
from geopilot.tools.denodet import (
    METAINFO_CLASSES,
    SARDET100K_CATEGORY_IDS,
    DenoDet,
    TransDeno,
    decode_gfl,
    mmdet_label_order,
    sardet_classes,
)
from geopilot.tools.task_tools import SarDetectAllParams
from geopilot.tools.tiling import tile_windows
from geopilot.vocabulary import canonical_class

BINS = 17


def _side(reg: torch.Tensor, y: int, x: int, side: int, bins: list[int]) -> None:
    """Put the distribution of one side (0 left, 1 top, 2 right, 3 bottom) on the given bins (equal weights)."""
    reg[side * BINS : (side + 1) * BINS, y, x] = -50.0
    for b in bins:
        reg[side * BINS + b, y, x] = 50.0


def test_gfl_decoding_of_hand_made_outputs_gives_the_expected_boxes_after_nms():
    cls = torch.full((2, 6, 6), -10.0)  # 2 classes, 6x6 locations of stride 8 (a 48 px input)
    reg = torch.zeros(4 * BINS, 6, 6)
    # (x=2, y=2), prior at (16, 16): left 1, top 1, right 1.5 (bins 1 and 2), bottom 1 -> (8, 8, 28, 24)
    cls[0, 2, 2] = 3.0
    for side, bins in ((0, [1]), (1, [1]), (2, [1, 2]), (3, [1])):
        _side(reg, 2, 2, side, bins)
    # (x=3, y=2), prior at (24, 16): the same box, lower score: class 0 suppressed by NMS, class 1 kept
    cls[0, 2, 3], cls[1, 2, 3] = 2.0, 1.0
    for side, bins in ((0, [2]), (1, [1]), (2, [0, 1]), (3, [1])):
        _side(reg, 2, 3, side, bins)
    # (x=0, y=0), prior at (0, 0): runs off the image and is clamped -> (0, 0, 8, 8)
    cls[1, 0, 0] = 2.0
    for side, bins in ((0, [2]), (1, [2]), (2, [1]), (3, [1])):
        _side(reg, 0, 0, side, bins)
    cls[0, 5, 5] = -3.5  # sigmoid 0.029 < score_thr 0.05
    found = decode_gfl([cls], [reg], (48, 48), strides=(8,))
    assert found.labels.tolist() == [0, 1, 1]
    torch.testing.assert_close(found.scores, torch.tensor([3.0, 2.0, 1.0]).sigmoid())
    expected = torch.tensor([[8.0, 8.0, 28.0, 24.0], [0.0, 0.0, 8.0, 8.0], [8.0, 8.0, 28.0, 24.0]])
    torch.testing.assert_close(found.boxes, expected, atol=1e-3, rtol=0)
    # nms_pre keeps the best (location, class) pairs per level; max_per_img caps the result
    assert decode_gfl([cls], [reg], (48, 48), nms_pre=1, strides=(8,)).labels.tolist() == [0]
    assert len(decode_gfl([cls], [reg], (48, 48), max_per_img=2, strides=(8,)).labels) == 2


def test_dct_attention_is_an_orthonormal_round_trip_with_a_frequency_mask():
    deno = TransDeno(8)
    x = torch.randn(2, 4, 8, 8)
    freq = deno.dct_h @ x @ deno.dct_w.T
    torch.testing.assert_close(deno.dct_h.T @ freq @ deno.dct_w, x, atol=1e-5, rtol=0)
    # upstream's DCT basis: cos(pi * (0.5 + j) * v / W) / sqrt(W), times sqrt(2) for v > 0
    v, j = 3, 5
    assert deno.dct_w[v, j].item() == pytest.approx(np.cos(np.pi * (0.5 + j) * v / 8) / np.sqrt(8) * np.sqrt(2))
    out = deno(x)
    assert out.shape == x.shape and torch.isfinite(out).all()
    with pytest.raises(GeoPilotInputError, match="TransDeno of size 8 got a"):
        deno(torch.randn(1, 4, 16, 16))


@pytest.fixture(scope="module")
def tiny_detector() -> DenoDet:
    return DenoDet.tiny(seed=0, input_size=128, score_thr=0.0)


def test_tiny_forward_gives_schema_valid_detections_and_one_band_images_work(tiny_detector):
    rng = np.random.default_rng(1)
    gray = rng.integers(0, 255, (90, 70), dtype=np.uint8)
    one_band = tiny_detector.detect(Image.fromarray(gray, "L"))
    replicated = tiny_detector.detect(Image.fromarray(np.repeat(gray[:, :, None], 3, axis=2)))
    assert one_band == replicated and 0 < len(one_band) <= 100
    assert {d.label for d in one_band} <= set(sardet_classes())
    ToolOutput.model_validate(ToolOutput(detections=one_band).model_dump())
    ships = tiny_detector.detect(Image.fromarray(gray, "L"), ["ship", "aircraft"])  # SARDet's own name for airplane
    assert ships and {d.label for d in ships} <= {"ship", "airplane"}


def test_classes_are_sardet_order_in_canonical_names():
    assert sardet_classes() == ["ship", "airplane", "car", "storage tank", "bridge", "harbor"]


def test_unknown_category_is_refused_clearly(tiny_detector):
    with pytest.raises(GeoPilotInputError, match="DenoDet detects only ship, airplane, .* got 'tennis court'"):
        tiny_detector.detect(Image.new("L", (64, 64)), ["tennis court"])


def test_large_scene_is_tiled_through_the_adapter():
    tiny_detector = DenoDet.tiny(seed=0, input_size=128, score_thr=0.0, max_per_img=5)  # few boxes: a quick merge
    calls = []

    class Counting:
        classes = tiny_detector.classes

        def detect(self, image, categories):
            calls.append(image.size)
            return tiny_detector.detect(image, categories)

    options = SarDetectorOptions(tile_size=128, tile_overlap=32, score_threshold=0.0)
    out = DetectorAdapter(Counting(), options).run(
        "sar_detect_all", LoadedImage(Image.new("RGB", (300, 200), (40, 40, 40))), SarDetectAllParams()
    )
    assert len(calls) == len(tile_windows(300, 200, 128, 32)) == 6 and set(calls) == {(128, 128)}
    assert out.detections and len(out.detections) <= 100
    ToolOutput.model_validate(out.model_dump())


def _coco_categories(path, names: list[str]) -> None:
    import json

    path.write_text(
        json.dumps(
            {"images": [], "annotations": [], "categories": [{"id": i + 1, "name": n} for i, n in enumerate(names)]}
        )
    )


def test_label_order_follows_the_annotation_json_as_mmdet_numbers_it(tmp_path):
    """groksar/datasets/SAR_Det.py L38-40: label i = the i-th JSON category named in METAINFO (file order)."""
    path = tmp_path / "train.json"
    _coco_categories(path, ["harbor", "ship", "bridge", "aircraft", "tank", "car"])
    assert sardet_classes(path) == ["harbor", "ship", "bridge", "airplane", "storage tank", "car"]
    detector = DenoDet.tiny(seed=0, input_size=64, annotation_file=str(path))
    assert detector.classes == sardet_classes(path)
    metainfo = ("ship", "aircraft", "car", "tank", "bridge", "harbor")  # SAR_Det.py METAINFO, without a file
    assert DenoDet.tiny(seed=0, input_size=64).classes == [canonical_class(c, "SARDet-100K") for c in metainfo]


def test_default_order_is_sardet100k_published_category_ids(tmp_path):
    """A train.json with SARDet-100K's published ids (0 ship ... 5 harbor), listed in id order, numbers the labels
    as the default does; so the default needs no annotation file for the released annotations."""
    import json

    path = tmp_path / "train.json"
    categories = [{"id": i, "name": n} for i, n in sorted(SARDET100K_CATEGORY_IDS.items())]
    path.write_text(json.dumps({"images": [], "annotations": [], "categories": categories}))
    assert mmdet_label_order(path, METAINFO_CLASSES) == list(METAINFO_CLASSES)
    assert sardet_classes(path) == sardet_classes() == DenoDet.tiny(seed=0, input_size=64).classes


def test_an_annotation_file_without_the_six_classes_is_one_clear_error(tmp_path):
    from geopilot.errors import WeightsError

    path = tmp_path / "train.json"
    _coco_categories(path, ["ship", "aircraft", "car"])
    with pytest.raises(WeightsError, match="do not name each of ship, aircraft, car, tank, bridge, harbor"):
        sardet_classes(path)
    path.write_text("{}")
    with pytest.raises(WeightsError, match="not a COCO annotation file"):
        sardet_classes(path)
