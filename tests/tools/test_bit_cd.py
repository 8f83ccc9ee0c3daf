"""BIT's crop rule on sizes other than LEVIR-CD's (the network itself: tests/tools/test_bit_cd_upstream.py)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from geopilot.tools.bit_cd import CROP, BitCd, windows


class PixelDifference(BitCd):
    """A stand-in network that is per-pixel (changed where after is brighter than before in red), recording the crop
    sizes it is given: a stitched mask then equals the per-pixel answer exactly, wherever the crops lie."""

    def __init__(self):
        self.shapes: list[tuple[int, ...]] = []

    def logits(self, before: np.ndarray, after: np.ndarray) -> np.ndarray:
        self.shapes.append(before.shape)
        difference = after[:, :1] - before[:, :1]
        return np.concatenate([np.zeros_like(difference), difference], axis=1)


def _pair(height: int, width: int) -> tuple[Image.Image, Image.Image, np.ndarray]:
    rng = np.random.default_rng(height * width)
    before, after = (rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(2))
    expected = after[..., 0].astype(int) > before[..., 0].astype(int)
    return Image.fromarray(before), Image.fromarray(after), expected


def test_windows_cover_a_side_from_the_grid_and_end_at_the_border():
    assert windows(1024) == [0, 256, 512, 768]  # LEVIR-CD: 16 crops of a tile, no overlap
    assert windows(256) == [0]
    assert windows(300) == [0, 44]
    assert windows(700) == [0, 256, 444]


@pytest.mark.parametrize(("height", "width"), [(512, 512), (300, 700), (256, 257)])
def test_every_pixel_is_predicted_from_a_256_crop(height, width):
    detector = PixelDifference()
    before, after, expected = _pair(height, width)
    assert np.array_equal(detector.detect(before, after), expected)
    assert {shape[1:] for shape in detector.shapes} == {(3, CROP, CROP)}
    assert sum(shape[0] for shape in detector.shapes) == len(windows(height)) * len(windows(width))


def test_a_side_under_256_is_resized_to_a_crop_and_back():
    detector = PixelDifference()
    before, after, _ = _pair(100, 300)
    changed = detector.detect(before, after)
    assert changed.shape == (100, 300) and detector.shapes == [(1, 3, CROP, CROP)]
    resized = [np.asarray(im.resize((CROP, CROP), Image.BICUBIC))[..., 0].astype(int) for im in (before, after)]
    small = Image.fromarray((resized[1] > resized[0]).astype(np.uint8))
    assert np.array_equal(changed, np.asarray(small.resize((300, 100), Image.NEAREST)).astype(bool))


def test_a_pair_of_two_sizes_is_refused():
    with pytest.raises(ValueError, match="the images differ in size: 300x256 and 256x256"):
        PixelDifference().detect(Image.new("RGB", (300, 256)), Image.new("RGB", (256, 256)))


def test_tiny_random_model_gives_a_mask_of_the_image_size():
    before, after, _ = _pair(256, 256)
    changed = BitCd.tiny(seed=0).detect(before, after)
    assert changed.shape == (256, 256) and changed.dtype == bool
