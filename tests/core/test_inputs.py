"""Bad user input raises a GeoPilotInputError that says what to fix; awkward but valid images work."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from helpers.scripted import answer
from PIL import Image

from geopilot.errors import GeoPilotInputError, ImageInputError


def _png(path, array) -> str:
    Image.fromarray(array).save(path)
    return str(path)


def _claim_size(png: bytes, width: int, height: int) -> bytes:
    """Rewrite a PNG's IHDR to claim another size (a decompression bomb's header), with a valid CRC."""
    ihdr = png[12:16] + struct.pack(">II", width, height) + png[24:29]
    return png[:12] + ihdr + struct.pack(">I", zlib.crc32(ihdr)) + png[33:]


def test_non_image_corrupt_truncated_and_bomb_files(make_pilot, image, tmp_path):
    pilot, _ = make_pilot([answer("x")])
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    good = _png(tmp_path / "good.png", image)
    data = open(good, "rb").read()
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(data[: len(data) // 2])
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(_claim_size(data, 30000, 30000))
    for path, message in [
        (text, "not an image"),
        (truncated, "truncated"),
        (bomb, "decompression bomb"),
        (tmp_path / "missing.png", "not found"),
    ]:
        with pytest.raises(ImageInputError, match=message):
            pilot.chat(str(path), "How many planes?")


@pytest.mark.parametrize("query", ["", "   \n", None, "Look at <image> here"])
def test_empty_or_malformed_query(make_pilot, image, query):
    pilot, _ = make_pilot([answer("x")])
    with pytest.raises(GeoPilotInputError):
        pilot.chat(image, query)


def test_bad_arguments_are_input_errors(make_pilot, image):
    pilot, _ = make_pilot([answer("x")])
    with pytest.raises(GeoPilotInputError, match="modality"):
        pilot.chat(image, "q", modality="infrared")
    with pytest.raises(GeoPilotInputError, match="max_rounds"):
        pilot.chat(image, "q", max_rounds=-1)
    with pytest.raises(GeoPilotInputError, match="max_new_tokens"):
        pilot.chat(image, "q", generation={"max_new_tokens": 0})
    with pytest.raises(GeoPilotInputError, match="no image"):
        pilot.chat(None, "q")


def test_one_channel_16_bit_sar_image_works(make_pilot, tmp_path):
    sar = (np.random.default_rng(0).gamma(1.0, 3000.0, (40, 40))).clip(0, 65535).astype(np.uint16)
    path = tmp_path / "sar.png"
    Image.fromarray(sar).save(path)
    assert Image.open(path).mode.startswith("I")
    pilot, _ = make_pilot([answer("A ship.")])
    assert pilot.chat(str(path), "Any ships?", modality="sar").answer == "A ship."


def test_huge_geotiff_is_read_decimated(make_pilot, tmp_path):
    rasterio = pytest.importorskip("rasterio")
    path = tmp_path / "scene.tif"
    profile = {
        "driver": "GTiff",
        "width": 30000,
        "height": 30000,
        "count": 1,
        "dtype": "uint8",
        "tiled": True,
        "blockxsize": 512,
        "blockysize": 512,
        "sparse_ok": True,
        "compress": "deflate",
        "crs": "EPSG:32633",
        "transform": rasterio.Affine(10, 0, 500000, 0, -10, 4000000),
    }
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(np.full((512, 512), 200, dtype=np.uint8), 1, window=rasterio.windows.Window(0, 0, 512, 512))
    pilot, _ = make_pilot([answer("Fields.")], max_pixels=250_000)
    assert pilot.chat(str(path), "What is this?").answer == "Fields."
    from geopilot.image import load_image

    loaded = load_image(path, max_pixels=250_000)
    assert loaded.image.size == (500, 500) and loaded.source_size == (30000, 30000) and loaded.georef.crs
