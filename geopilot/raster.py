"""GeoTIFFs through rasterio: the model's picture as a decimated read, and a `RasterSource` that tools read from.

A GeoTIFF is never decoded whole. Loading reads the chosen bands (`geopilot.bands`) decimated to the picture size
(at most `PICTURE_MAX_SIDE` on the long side and within `max_pixels`, rule 1 of `geopilot.image`; GDAL uses
overviews when the file has them), and fixes the percentile stretch from that read, nodata and NaN excluded.
Tools then read through `LoadedImage.raster`: full-resolution windows (`crop`, what tiled detection uses; None
for a window that is all nodata) or the whole scene decimated to fit `max_pixels` (`scene`, for the tools that
see the image whole), both with the same bands and stretch, so a tile looks like the picture. GDAL's block cache is
capped at `GDAL_CACHE_BYTES` while GeoPilot reads (its default is 5% of the machine's memory), so memory stays
bounded by the picture, one window and the cache, whatever the scene's size (benchmarks/geo_memory.py).
"""

from __future__ import annotations

import math
import re
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from geopilot.bands import BandChoice, band_name, choose_bands
from geopilot.errors import ImageInputError
from geopilot.loaded_image import GeoRef, LoadedImage, percentile_limits

RASTERIO_DRIVER = "GTiff"  # the one GDAL driver rasterio may use
PICTURE_MAX_SIDE = 2048  # the model sees 336 px; the picture is also what is drawn on and sent to a vLLM server
GDAL_CACHE_BYTES = 64 * 2**20
CHUNK_SOURCE_PX = 2048  # decimated reads go chunk by chunk of about this many source pixels a side, so GDAL's
# cache holds the blocks one output row needs (a whole-width read re-decodes a 20k-px block row for every row)

Limits = tuple[float, float] | None  # per band: (lo, hi) of the stretch, None = no valid pixel (black)


@dataclass(frozen=True)
class Stretch:
    """How the shown bands become 8 bits: None = 8-bit data as is; else (lo, hi) per band, from the picture."""

    limits: tuple[Limits, ...] | None


def fit_size(width: int, height: int, max_pixels: int, max_side: int | None = None) -> tuple[int, int]:
    """The largest size of the same shape whose padded square fits `max_pixels` (and whose long side <= max_side)."""
    scale = min(1.0, max_pixels**0.5 / max(width, height))
    if max_side is not None:
        scale = min(scale, max_side / max(width, height))
    return max(1, int(width * scale)), max(1, int(height * scale))


def to_rgb(data: np.ma.MaskedArray, stretch: Stretch) -> np.ndarray:
    """(C, H, W) band data read with masked=True -> (H, W, 3) uint8; nodata and NaN pixels are black."""
    invalid = np.ma.getmaskarray(data)
    values = np.ma.getdata(data)
    if values.dtype.kind == "f":
        invalid = invalid | ~np.isfinite(values)
    if stretch.limits is None:
        out = np.where(invalid, 0, values).astype(np.uint8)
    else:
        out = np.zeros(values.shape, dtype=np.uint8)
        for c, limits in enumerate(stretch.limits):
            if limits is None:
                continue
            lo, hi = limits
            scaled = (values[c].astype(np.float32) - np.float32(lo)) / np.float32(hi - lo)
            scaled[invalid[c]] = 0.0  # NaN would not cast
            out[c] = np.round(np.clip(scaled, 0.0, 1.0) * 255.0).astype(np.uint8)
        out[invalid] = 0
    if out.shape[0] == 1:
        out = np.repeat(out, 3, axis=0)
    return np.ascontiguousarray(np.moveaxis(out, 0, 2))


def stretch_of(data: np.ma.MaskedArray) -> Stretch:
    """The stretch rule 2 of `geopilot.image` over the valid (not nodata, finite) pixels of each band."""
    if data.dtype == np.uint8:
        return Stretch(None)
    limits = []
    for band in data:
        valid = np.ma.compressed(band)
        limits.append(percentile_limits(valid[np.isfinite(valid)] if valid.dtype.kind == "f" else valid))
    return Stretch(tuple(limits))


class RasterSource:
    """A GeoTIFF kept openable for the tools: windows at full resolution, the whole scene decimated."""

    def __init__(
        self,
        source: Path | bytes,
        name: str,
        size: tuple[int, int],
        choice: BandChoice,
        stretch: Stretch,
        max_pixels: int,
    ):
        self.name, self.size, self.choice, self.stretch, self.max_pixels = name, size, choice, stretch, max_pixels
        self._source = source
        self._memory = None  # bytes: one MemoryFile, opened under a lock (GDAL datasets are not shared across threads)
        self._lock = threading.Lock()
        self._scene: Image.Image | None = None

    @property
    def scene_size(self) -> tuple[int, int]:
        return fit_size(*self.size, self.max_pixels)

    def crop(self, box: Sequence[int]) -> Image.Image | None:
        """Pixels [x0, x1) x [y0, y1) at full resolution (the PIL `crop` box), or None when all of it is nodata."""
        x0, y0, x1, y1 = (int(v) for v in box)
        return self.read((x0, y0, x1, y1), (x1 - x0, y1 - y0))

    def scene(self) -> Image.Image:
        """The whole scene decimated to fit `max_pixels` (read once; all nodata reads black)."""
        with self._lock:
            if self._scene is None:
                width, height = self.size
                picture = self.read((0, 0, width, height), self.scene_size, locked=True)
                self._scene = picture if picture is not None else Image.new("RGB", self.scene_size)
            return self._scene

    def read(self, box: Sequence[int], out_size: tuple[int, int], locked: bool = False) -> Image.Image | None:
        import rasterio

        with rasterio.Env(GDAL_CACHEMAX=GDAL_CACHE_BYTES), self._open(locked) as dataset:
            data = read_chunked(dataset, self.choice.bands, box, out_size)
        if np.ma.getmaskarray(data).all() or (data.dtype.kind == "f" and not np.isfinite(np.ma.getdata(data)).any()):
            return None
        return Image.fromarray(to_rgb(data, self.stretch), "RGB")

    def _open(self, locked: bool):
        if isinstance(self._source, Path):
            return _open_dataset(self._source, self.name)
        return _LockedMemoryDataset(self, locked)


def read_chunked(dataset, bands: Sequence[int], box: Sequence[float], out_size: tuple[int, int]) -> np.ma.MaskedArray:
    """Source pixels `box` (x0, y0, x1, y1) of `bands`, read at `out_size` (nearest, masked), in chunks of about
    CHUNK_SOURCE_PX source pixels: the same pixels as one read, with a bounded working set in GDAL's cache."""
    from rasterio.windows import Window

    x0, y0, x1, y1 = box
    out_w, out_h = out_size
    sx, sy = (x1 - x0) / out_w, (y1 - y0) / out_h
    step_x, step_y = max(1, int(CHUNK_SOURCE_PX / sx)), max(1, int(CHUNK_SOURCE_PX / sy))
    if step_x >= out_w and step_y >= out_h:
        window = Window(x0, y0, x1 - x0, y1 - y0)
        return dataset.read(list(bands), window=window, out_shape=(len(bands), out_h, out_w), masked=True)
    values = np.empty((len(bands), out_h, out_w), dtype=dataset.dtypes[bands[0] - 1])
    invalid = np.empty(values.shape, dtype=bool)
    for oy in range(0, out_h, step_y):
        for ox in range(0, out_w, step_x):
            cw, ch = min(step_x, out_w - ox), min(step_y, out_h - oy)
            window = Window(x0 + ox * sx, y0 + oy * sy, cw * sx, ch * sy)  # fractional: GDAL samples as one read
            part = dataset.read(list(bands), window=window, out_shape=(len(bands), ch, cw), masked=True)
            values[:, oy : oy + ch, ox : ox + cw] = np.ma.getdata(part)
            invalid[:, oy : oy + ch, ox : ox + cw] = np.ma.getmaskarray(part)
    return np.ma.MaskedArray(values, mask=invalid)


class _LockedMemoryDataset:
    def __init__(self, raster: RasterSource, locked: bool):
        self.raster, self.locked = raster, locked

    def __enter__(self):
        from rasterio.io import MemoryFile

        if not self.locked:
            self.raster._lock.acquire()
        if self.raster._memory is None:
            self.raster._memory = MemoryFile(self.raster._source)
        self.dataset = self.raster._memory.open(driver=RASTERIO_DRIVER)
        return self.dataset

    def __exit__(self, *exc):
        self.dataset.close()
        if not self.locked:
            self.raster._lock.release()


def _open_dataset(path: Path, name: str):
    import rasterio
    from rasterio.errors import NotGeoreferencedWarning, RasterioIOError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotGeoreferencedWarning)  # a plain TIFF: georef stays None
            return rasterio.open(path, driver=RASTERIO_DRIVER)
    except RasterioIOError as err:
        raise ImageInputError(f"{name}: cannot be read as a raster: {err}") from None


def _open_any(source: Path | bytes, name: str):
    if isinstance(source, Path):
        return None, _open_dataset(source, name)
    from rasterio.errors import NotGeoreferencedWarning, RasterioIOError
    from rasterio.io import MemoryFile

    memory = MemoryFile(source)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotGeoreferencedWarning)
            return memory, memory.open(driver=RASTERIO_DRIVER)
    except RasterioIOError as err:
        memory.close()
        raise ImageInputError(f"{name}: cannot be read as a raster: {err}") from None


def dataset_choice(dataset, explicit: Sequence[int] | None, name: str) -> BandChoice:
    """`geopilot.bands.choose_bands` for an open rasterio dataset (alpha bands never shown unless asked for)."""
    colours = [c.name.lower() for c in dataset.colorinterp]
    names = [band_name(d, dataset.tags(i + 1)) for i, d in enumerate(dataset.descriptions)]
    return choose_bands(dataset.count, explicit, colours, names, name)


def georef_of(dataset) -> GeoRef | None:
    if dataset.crs is None and dataset.transform.is_identity:
        return None
    t = dataset.transform
    crs = dataset.crs.to_string() if dataset.crs else None
    return GeoRef((t.a, t.b, t.c, t.d, t.e, t.f), crs, dataset.width, dataset.height)


def read_georef(path: Path) -> GeoRef | None:
    """A GeoTIFF's georeference from its header alone (nothing decoded)."""
    with _open_dataset(path, str(path)) as dataset:
        return georef_of(dataset)


def wgs84_problem(georef: GeoRef | None) -> str | None:
    """Why outputs of this raster cannot be put on the map in WGS 84 (said once per image), or None."""
    if georef is None:
        return None
    if georef.crs is None:
        return "the GeoTIFF has no CRS: tool outputs are in pixel coordinates only"
    from rasterio.warp import transform

    a, b, c, d, e, f = georef.transform
    px, py = georef.width / 2, georef.height / 2
    try:
        lon, lat = transform(georef.crs, "EPSG:4326", [a * px + b * py + c], [d * px + e * py + f])
        reason = None if math.isfinite(lon[0]) and math.isfinite(lat[0]) else "no finite coordinates"
    except Exception as err:  # noqa: BLE001 - PROJ/GDAL raise several types; any of them means "cannot"
        reason = str(err).split(" from ", 1)[0]  # the rest repeats the whole CRS as PROJJSON
    if reason is None:
        return None
    return (
        f"the CRS {crs_label(georef.crs)} cannot be reprojected to WGS 84 ({reason}): no GeoJSON; a GeoPackage keeps it"
    )


def crs_label(crs: str) -> str:
    """ "EPSG:32633", or the name a WKT gives its CRS ("Mars 2000")."""
    named = re.match(r'^\s*[A-Z_]+\["([^"]+)"', crs)
    return named.group(1) if named else crs[:80]


def open_raster(source: Path | bytes, name: str, max_pixels: int, bands: Sequence[int] | None) -> LoadedImage:
    """A GeoTIFF (path or bytes) -> LoadedImage with its picture, georeference, band choice and RasterSource."""
    from rasterio.errors import RasterioIOError

    memory, dataset = _open_any(source, name)
    try:
        with dataset:
            choice = dataset_choice(dataset, bands, name)
            width, height = dataset.width, dataset.height
            out_w, out_h = fit_size(width, height, max_pixels, PICTURE_MAX_SIDE)
            import rasterio

            try:
                with rasterio.Env(GDAL_CACHEMAX=GDAL_CACHE_BYTES):
                    data = read_chunked(dataset, choice.bands, (0, 0, width, height), (out_w, out_h))
            except RasterioIOError as err:
                raise ImageInputError(f"{name}: corrupt raster data: {err}") from None
            georef = georef_of(dataset)
    finally:
        if memory is not None:
            memory.close()
    stretch = stretch_of(data)
    raster = RasterSource(source, name, (width, height), choice, stretch, max_pixels)
    notes = tuple(note for note in (choice.note, wgs84_problem(georef)) if note)
    return LoadedImage(Image.fromarray(to_rgb(data, stretch), "RGB"), georef, (width, height), choice, raster, notes)
