"""mmcv's resize as the OpenMMLab backends see it (issue 23 item 7): OpenCV's 8-bit bilinear resize, bit for bit.

`fixtures/cv2_resize_linear.npz` was written once, outside the repo, with opencv-python-headless 5.1.0:
`cv2.resize(img, (w, h), interpolation=cv2.INTER_LINEAR)` (what mmcv `image/geometric.py` L116-117 calls for
`interpolation='bilinear'`) on seeded random uint8 images (numpy default_rng(2)), 3 channels (`in{i}` -> `out{i}`)
and 1 channel (`gin{i}` -> `gout{i}`), down- and upscaled to sizes whose rows are no multiple of 16 values.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.weights import FIXTURES
from PIL import Image

from geopilot.tools.cv2_resize import resize_bilinear_uint8
from geopilot.tools.denodet import DenoDet

CASES = np.load(FIXTURES / "cv2_resize_linear.npz")


@pytest.mark.parametrize("name", sorted(k for k in CASES.files if k.startswith(("in", "gin"))))
def test_resize_equals_opencv_bit_for_bit(name):
    image, expected = CASES[name], CASES[name.replace("in", "out")]
    ours = resize_bilinear_uint8(image, expected.shape[1], expected.shape[0])
    assert ours.dtype == np.uint8 and ours.shape == expected.shape
    assert np.array_equal(ours, expected)


def test_float_resizing_would_not_be_opencvs():
    """The comparison can fail: torch's float bilinear rounded to 8 bits differs from OpenCV's fixed point."""
    image, expected = CASES["in0"], CASES["out0"]
    t = torch.from_numpy(image).permute(2, 0, 1)[None].float()
    resized = F.interpolate(t, size=expected.shape[:2], mode="bilinear", align_corners=False)[0].permute(1, 2, 0)
    assert (np.floor(resized.numpy() + 0.5).astype(int) != expected).mean() > 0.05


def test_exact_halving_is_opencvs_area_mean_and_same_size_is_a_copy():
    image = np.arange(4 * 6, dtype=np.uint8).reshape(4, 6) * 10
    assert resize_bilinear_uint8(image, 3, 2).tolist() == [[35, 55, 75], [155, 175, 195]]  # (a+b+c+d+2) >> 2
    assert np.array_equal(resize_bilinear_uint8(image, 6, 4), image)
    with pytest.raises(TypeError, match="uint8"):
        resize_bilinear_uint8(image.astype(np.float32), 3, 2)


def test_denodet_feeds_its_model_the_8_bit_resized_image(monkeypatch):
    detector = DenoDet.tiny(seed=0, input_size=64)
    seen = []
    forward = detector.model.forward
    monkeypatch.setattr(detector.model, "forward", lambda pixels: seen.append(pixels) or forward(pixels))
    rgb = np.random.default_rng(4).integers(0, 256, (90, 70, 3), dtype=np.uint8)
    detector.detect(Image.fromarray(rgb))
    (pixels,) = seen
    expected = resize_bilinear_uint8(np.ascontiguousarray(rgb[:, :, ::-1]), 64, 64)  # BGR, as cv2 reads it
    assert torch.equal(pixels[0].permute(1, 2, 0), torch.from_numpy(expected).float())
