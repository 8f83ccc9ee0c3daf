"""Zonal statistics of one raster over one polygon, read window by window so memory stays bounded.

Policy (stated once, used everywhere): a pixel belongs to a polygon when its centre is inside it
(`all_touched=False`, GDAL's rasterisation rule); nodata pixels are left out. Class shares are area-weighted
percentages of the polygon's valid pixels: in a projected CRS every pixel has the same area, in a geographic
CRS a pixel row is weighted by cos(latitude). A polygon in another CRS is reprojected to the raster's first.
The part of a polygon outside the raster is not analysed; `outside_raster_pct` says how much of it that was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import shapely
from shapely.geometry import box, mapping, shape
from shapely.geometry.base import BaseGeometry

from geopilot.errors import GeoPilotInputError

MAX_WINDOW_PIXELS = 4_000_000  # pixels read and rasterised at once (~32 MB as float64)


class ZonalError(GeoPilotInputError):
    """The statistics cannot be computed: polygon outside the raster, no valid pixels, unreadable raster."""


@dataclass
class ZonalStats:
    pixels: int = 0  # valid pixels inside the polygon
    weight: float = 0.0  # their summed area weights
    class_weight: dict[int, float] = field(default_factory=dict)  # categorical: value -> summed weight
    total: float = 0.0  # continuous: weighted sum, sum of squares, extremes
    total_sq: float = 0.0
    minimum: float = math.inf
    maximum: float = -math.inf
    outside_raster_pct: float = 0.0

    def class_shares(self) -> dict[int, float]:
        return {value: 100.0 * w / self.weight for value, w in sorted(self.class_weight.items())}

    def summary(self) -> dict[str, float]:
        mean = self.total / self.weight
        variance = max(self.total_sq / self.weight - mean * mean, 0.0)
        return {
            "mean": mean,
            "min": self.minimum,
            "max": self.maximum,
            "std": math.sqrt(variance),
            "count": self.pixels,
        }


def to_raster_crs(geometry: BaseGeometry, geometry_crs: str, raster_crs) -> BaseGeometry:
    from rasterio.crs import CRS
    from rasterio.warp import transform_geom

    if CRS.from_user_input(geometry_crs) == raster_crs:
        return geometry
    return shape(transform_geom(CRS.from_user_input(geometry_crs), raster_crs, mapping(geometry)))


def zonal_stats(
    raster: str | Path,
    geometry: BaseGeometry,
    geometry_crs: str,
    categorical: bool,
    nodata: float | None = None,
    max_window_pixels: int = MAX_WINDOW_PIXELS,
    band: int = 1,
) -> ZonalStats:
    """Statistics of `raster` inside `geometry`; raises ZonalError when nothing of the polygon can be analysed."""
    import rasterio
    from rasterio.features import geometry_mask
    from rasterio.windows import Window, from_bounds

    if geometry.is_empty:
        raise ZonalError("the polygon is empty")
    if not geometry.is_valid:
        geometry = shapely.make_valid(geometry)
    try:
        dataset = rasterio.open(raster)
    except rasterio.errors.RasterioIOError as err:
        raise ZonalError(f"cannot read raster {Path(raster).name}: {err}") from None
    with dataset:
        if not 1 <= band <= dataset.count:
            raise ZonalError(f"raster {Path(raster).name} has {dataset.count} band(s), not {band}")
        polygon = to_raster_crs(geometry, geometry_crs, dataset.crs)
        extent = box(*dataset.bounds)
        inside = polygon.intersection(extent)
        if inside.is_empty or inside.area == 0:
            raise ZonalError("the area lies outside the raster")
        stats = ZonalStats(outside_raster_pct=100.0 * (1.0 - inside.area / polygon.area))
        nodata = dataset.nodata if nodata is None else nodata
        full = from_bounds(*inside.bounds, transform=dataset.transform)
        col0, row0 = max(int(math.floor(full.col_off)), 0), max(int(math.floor(full.row_off)), 0)
        col1 = min(int(math.ceil(full.col_off + full.width)), dataset.width)
        row1 = min(int(math.ceil(full.row_off + full.height)), dataset.height)
        rows_per_chunk = max(1, max_window_pixels // max(col1 - col0, 1))
        geographic = dataset.crs is not None and dataset.crs.is_geographic
        for top in range(row0, row1, rows_per_chunk):
            window = Window(col0, top, col1 - col0, min(rows_per_chunk, row1 - top))
            transform = dataset.window_transform(window)
            values = dataset.read(band, window=window)
            inside_mask = geometry_mask([inside], values.shape, transform, invert=True, all_touched=False)
            valid = inside_mask & ~_nodata_mask(values, nodata)
            if not valid.any():
                continue
            weights = _row_weights(transform, values.shape, geographic)
            _accumulate(stats, values, valid, weights, categorical)
    if stats.pixels == 0:
        raise ZonalError("no valid pixel of the raster lies inside the area")
    return stats


def _nodata_mask(values: np.ndarray, nodata: float | None) -> np.ndarray:
    mask = np.isnan(values) if np.issubdtype(values.dtype, np.floating) else np.zeros(values.shape, bool)
    if nodata is not None and not (isinstance(nodata, float) and math.isnan(nodata)):
        mask |= values == nodata
    return mask


def _row_weights(transform, shape_: tuple[int, int], geographic: bool) -> np.ndarray:
    if not geographic:
        return np.ones(shape_, dtype=np.float64)
    rows = np.arange(shape_[0]) + 0.5
    latitudes = transform.f + rows * transform.e  # north-up rasters: y of each row's centre
    return np.repeat(np.cos(np.radians(latitudes))[:, None], shape_[1], axis=1)


def _accumulate(stats: ZonalStats, values: np.ndarray, valid: np.ndarray, weights: np.ndarray, categorical: bool):
    picked, w = values[valid], weights[valid]
    stats.pixels += int(picked.size)
    stats.weight += float(w.sum())
    if categorical:
        classes, inverse = np.unique(picked.astype(np.int64), return_inverse=True)
        sums = np.bincount(inverse, weights=w)
        for value, total in zip(classes.tolist(), sums.tolist(), strict=True):
            stats.class_weight[value] = stats.class_weight.get(value, 0.0) + total
        return
    as_float = picked.astype(np.float64)
    stats.total += float((as_float * w).sum())
    stats.total_sq += float((as_float * as_float * w).sum())
    stats.minimum = min(stats.minimum, float(as_float.min()))
    stats.maximum = max(stats.maximum, float(as_float.max()))
