"""GeoTIFF fixtures shared by the image, geo and geo-CLI tests: a UTM scene with one bright object, multi-band
files with band names / colour interpretation / tags, and a simple real detector that reports pixel geometry."""

from __future__ import annotations

import numpy as np
import rasterio
from PIL import Image
from rasterio.transform import from_origin

from geopilot.tool_output import Detection
from geopilot.tools.canonical import pixel_box

W, H = 700, 500
ORIGIN_X, ORIGIN_Y, PIXEL = 500_000.0, 4_200_000.0, 10.0  # UTM 33N: about 15.0 E, 37.9 N
UTM = "EPSG:32633"
BRIGHT = (303, 123, 338, 171)  # x1, y1, x2, y2 (pixel edges) of the one bright object; 303 / 700 rounds to 0.433
S2_NAMES = ["B01", "B02", "B03", "B04", "B05", "B06", "B07", "B08", "B8A", "B09", "B10", "B11", "B12"]


def write_scene(path, crs=UTM, width=W, height=H, nodata_rows=0):
    data = np.full((3, height, width), 40, dtype=np.uint8)
    x1, y1, x2, y2 = BRIGHT
    data[:, y1:y2, x1:x2] = 250
    data[:, height - nodata_rows :, :] = 0
    transform = from_origin(ORIGIN_X, ORIGIN_Y, PIXEL, PIXEL)
    profile = {"driver": "GTiff", "width": width, "height": height, "count": 3, "dtype": "uint8"}
    with rasterio.open(path, "w", crs=crs, transform=transform, nodata=0 if nodata_rows else None, **profile) as dst:
        dst.write(data)
    return path


class BrightSpotDetector:
    """A real (if simple) detector: the bounding box of the bright pixels of the tile it is given, in that tile's
    pixels exactly (`pixel_box`), the way a backend that keeps its own pixel geometry reports it."""

    def __init__(self):
        self.calls = 0

    def detect(self, image: Image.Image, categories):
        self.calls += 1
        ys, xs = np.nonzero(np.asarray(image)[:, :, 0] > 200)
        if xs.size == 0:
            return []
        pixels = (float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1))
        return [Detection(label="ship", box=pixel_box(pixels, *image.size), score=0.9, pixel_box=pixels)]


def write_tif(path, data, descriptions=None, colorinterp=None, tags=None, nodata=None, crs="EPSG:32633"):
    count, height, width = data.shape
    profile = {"driver": "GTiff", "width": width, "height": height, "count": count, "dtype": data.dtype.name}
    with rasterio.open(
        path, "w", crs=crs, transform=from_origin(500_000, 4_200_000, 10, 10), nodata=nodata, **profile
    ) as dst:
        dst.write(data)
        if descriptions:
            dst.descriptions = tuple(descriptions)
        if colorinterp:
            dst.colorinterp = colorinterp
        for band, band_tags in (tags or {}).items():
            dst.update_tags(band, **band_tags)
    return path


def distinct_bands(count, height=40, width=50):
    """Band b holds values around 1000 * b, so which band went where can be read back from the picture."""
    rng = np.random.default_rng(count)
    return np.stack([rng.integers(0, 1000, (height, width)) + 1000 * (b + 1) for b in range(count)]).astype(np.uint16)
