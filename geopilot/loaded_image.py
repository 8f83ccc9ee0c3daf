"""What an image is once loaded (`LoadedImage`, its `GeoRef`) and the percentile stretch limits that both readers
use: Pillow's (geopilot.image) and rasterio's (geopilot.raster). It sits below both, so neither imports the other
to share them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from geopilot.bands import BandChoice

if TYPE_CHECKING:
    from geopilot.raster import RasterSource

STRETCH_PERCENTILES = (2.0, 98.0)


@dataclass(frozen=True)
class GeoRef:
    """Where a georeferenced image lies: affine transform (GDAL order a, b, c, d, e, f) and CRS of the full raster."""

    transform: tuple[float, float, float, float, float, float]
    crs: str | None
    width: int  # full-resolution size of the raster the transform refers to
    height: int


@dataclass(frozen=True)
class LoadedImage:
    image: Image.Image  # 8-bit RGB: the picture the model sees (a GeoTIFF's is a decimated read)
    georef: GeoRef | None = None
    source_size: tuple[int, int] = (0, 0)  # (width, height) before any decimated read
    bands: BandChoice | None = None  # which bands the picture shows, and why (geopilot.bands)
    raster: RasterSource | None = None  # a GeoTIFF: full-resolution windows and the scene for the tools
    notes: tuple[str, ...] = ()  # said once in the result: a guessed band choice, no CRS, a CRS not reprojectable

    def scene(self) -> Image.Image:
        """The whole image as tools that see it whole get it: a GeoTIFF decimated to fit `max_pixels`, else `image`."""
        return self.raster.scene() if self.raster is not None else self.image

    @property
    def scene_size(self) -> tuple[int, int]:
        return self.raster.scene_size if self.raster is not None else self.image.size


def percentile_limits(valid: np.ndarray, percentiles: tuple[float, float] = STRETCH_PERCENTILES):
    """Rule 2's (lo, hi) over a band's valid values, or None when the band is black (no valid or constant values)."""
    if valid.size == 0:
        return None
    lo, hi = np.percentile(valid, percentiles)
    if hi <= lo:  # (nearly) constant band: fall back to the full range, and to black if truly constant
        lo, hi = valid.min(), valid.max()
        if hi <= lo:
            return None
    return float(lo), float(hi)
