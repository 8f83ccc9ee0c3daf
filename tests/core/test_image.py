"""Image input: formats, SAR / 16-bit stretch, pixel limits checked before decoding, clear errors for bad files."""

from __future__ import annotations

import time

import numpy as np
import pytest
from helpers.images import header_png
from PIL import Image

from geopilot.errors import ImageInputError, ImageTooLargeError
from geopilot.image import load_image, stretch_to_uint8


def write_png_header_bomb(path, width: int, height: int) -> None:
    """A valid PNG of width x height 1-bit pixels, all zero: ~50 KB on disk, 400 M pixels when decoded."""
    path.write_bytes(header_png(width, height))


@pytest.mark.parametrize("suffix", [".png", ".jpg", ".tif"])
def test_rgb_formats_load_as_8bit_rgb(tmp_path, suffix):
    array = (np.random.RandomState(0).rand(24, 40, 3) * 255).astype(np.uint8)
    path = tmp_path / f"x{suffix}"
    Image.fromarray(array).save(path)
    loaded = load_image(path)
    assert loaded.image.mode == "RGB" and loaded.image.size == (40, 24)
    if suffix != ".jpg":
        assert np.array_equal(np.asarray(loaded.image), array)


def test_sar_16bit_single_channel_is_stretched_and_replicated(tmp_path):
    rng = np.random.RandomState(0)
    amplitude = (rng.gamma(1.0, 400.0, size=(32, 48))).astype(np.uint16)  # speckle-like, long-tailed
    path = tmp_path / "sar.png"
    Image.fromarray(amplitude).save(path)  # PIL writes mode I;16
    loaded = load_image(path)
    out = np.asarray(loaded.image)
    assert out.shape == (32, 48, 3) and out.dtype == np.uint8
    assert np.array_equal(out[:, :, 0], out[:, :, 1]) and np.array_equal(out[:, :, 1], out[:, :, 2])
    lo, hi = np.percentile(amplitude, [2, 98])
    expected = np.round(np.clip((amplitude - lo) / (hi - lo), 0, 1) * 255).astype(np.uint8)
    assert np.array_equal(out[:, :, 0], expected)


def test_8bit_grayscale_is_not_stretched(tmp_path):
    gray = np.full((8, 8), 100, np.uint8)
    gray[0, 0] = 110
    Image.fromarray(gray).save(tmp_path / "g.png")
    assert np.asarray(load_image(tmp_path / "g.png").image)[1, 1].tolist() == [100, 100, 100]


def test_stretch_of_a_constant_band_is_black():
    assert stretch_to_uint8(np.full((4, 4), 7.0)).max() == 0


def test_decompression_bomb_is_refused_before_decoding(tmp_path):
    path = tmp_path / "bomb.png"
    write_png_header_bomb(path, 20000, 20000)
    assert path.stat().st_size < 200_000
    with pytest.raises(ImageInputError, match=r"(20000x20000|400000000 pixels).* exceeds (the )?limit"):
        load_image(path)


def test_a_long_thin_image_is_refused_by_the_square_it_would_be_padded_to(tmp_path):
    """A 1 x 20000 PNG is 20,000 pixels, but the model pads it to 20000 x 20000: refused from the header, at once."""
    path = tmp_path / "strip.png"
    write_png_header_bomb(path, 1, 20000)
    started = time.perf_counter()
    with pytest.raises(ImageTooLargeError, match=r"padded to a 20000x20000 square"):
        load_image(path)
    assert time.perf_counter() - started < 0.5
    with pytest.raises(ImageTooLargeError, match="padded"):
        load_image(np.zeros((20000, 1), dtype=np.uint8))  # already-decoded inputs follow the same rule
    assert load_image(np.zeros((100, 10), dtype=np.uint8), max_pixels=10_000).image.size == (10, 100)


def test_over_pillows_own_bomb_limit_is_too_large_not_unreadable(tmp_path):
    path = tmp_path / "huge.png"
    write_png_header_bomb(path, 15000, 15000)  # 225 M pixels: over Pillow's 2 x 89.5 M bomb limit
    with pytest.raises(ImageTooLargeError, match="decompression bomb"):
        load_image(path, max_pixels=10**9)


def test_a_long_geotiff_is_decimated_until_its_padded_square_fits(tmp_path):
    rasterio = pytest.importorskip("rasterio")

    path = tmp_path / "strip.tif"
    with rasterio.open(path, "w", driver="GTiff", width=4000, height=10, count=1, dtype="uint8") as dst:
        dst.write(np.full((1, 10, 4000), 9, dtype=np.uint8))
    loaded = load_image(path, max_pixels=1_000_000)
    assert max(loaded.image.size) ** 2 <= 1_000_000 and loaded.source_size == (4000, 10)


def test_text_file_named_png(tmp_path):
    path = tmp_path / "fake.png"
    path.write_text("definitely not an image")
    with pytest.raises(ImageInputError, match="not an image file"):
        load_image(path)


def test_truncated_png(tmp_path):
    path = tmp_path / "t.png"
    Image.fromarray((np.random.RandomState(1).rand(64, 64, 3) * 255).astype(np.uint8)).save(path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ImageInputError, match="corrupt or truncated"):
        load_image(path)


def test_missing_file(tmp_path):
    with pytest.raises(ImageInputError, match="not found"):
        load_image(tmp_path / "nope.png")


def test_geotiff_keeps_its_transform_and_large_ones_are_read_decimated(tmp_path):
    rasterio = pytest.importorskip("rasterio")
    from rasterio.transform import from_origin

    path = tmp_path / "scene.tif"
    transform = from_origin(500000.0, 4100000.0, 0.5, 0.5)
    data = (np.arange(3 * 200 * 300) % 251).astype(np.uint16).reshape(3, 200, 300)
    with rasterio.open(
        path, "w", driver="GTiff", width=300, height=200, count=3, dtype="uint16", crs="EPSG:32633", transform=transform
    ) as dst:
        dst.write(data)
    full = load_image(path)
    assert full.image.size == (300, 200) and full.georef.crs == "EPSG:32633"
    assert full.georef.transform[:3] == (0.5, 0.0, 500000.0) and (full.georef.width, full.georef.height) == (300, 200)
    small = load_image(path, max_pixels=6000)  # 60000 px scene -> read at ~1/sqrt(10) per side
    assert small.image.width * small.image.height <= 6000 and small.source_size == (300, 200)
    assert small.georef == full.georef  # the transform still describes the full-resolution raster
