"""Image input: PNG/JPEG/TIFF (GeoTIFF through rasterio when installed), SAR and 16-bit data, size limits.

Rules, in order:
1. The pixel count is checked from the header, before anything is decoded (`max_pixels`).
   A GeoTIFF larger than the limit is read decimated to fit it (GDAL reads overviews or subsamples);
   any other format is refused.
2. Data deeper than 8 bits (16-bit, 32-bit int, float) is stretched to 8 bits per band with a percentile rule:
   `lo, hi = percentile(band, 2), percentile(band, 98)` over finite values, `out = clip((x - lo) / (hi - lo), 0, 1) * 255`.
   8-bit data is used as is.
3. One band (SAR amplitude, grayscale) is replicated to 3; 2 bands use the first; more than 3 use the first 3;
   alpha is dropped.
The model-side geometry (pad to a square with the CLIP mean colour, resize to 336) is the image processor's.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from geopilot.errors import ImageInputError

DEFAULT_MAX_PIXELS = 100_000_000  # 10k x 10k; training data and the API can set their own
STRETCH_PERCENTILES = (2.0, 98.0)
GEOTIFF_SUFFIXES = {".tif", ".tiff"}


@dataclass(frozen=True)
class GeoRef:
    """Where a georeferenced image lies: affine transform (GDAL order a, b, c, d, e, f) and CRS of the full raster."""

    transform: tuple[float, float, float, float, float, float]
    crs: str | None
    width: int  # full-resolution size of the raster the transform refers to
    height: int


@dataclass(frozen=True)
class LoadedImage:
    image: Image.Image  # 8-bit RGB
    georef: GeoRef | None = None
    source_size: tuple[int, int] = (0, 0)  # (width, height) before any decimated read


def stretch_to_uint8(band: np.ndarray, percentiles: tuple[float, float] = STRETCH_PERCENTILES) -> np.ndarray:
    """Percentile stretch of one band to uint8 (rule 2 above)."""
    values = band.astype(np.float64)
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return np.zeros(band.shape, dtype=np.uint8)
    lo, hi = np.percentile(finite, percentiles)
    if hi <= lo:  # (nearly) constant band: fall back to the full range, and to black if truly constant
        lo, hi = finite.min(), finite.max()
        if hi <= lo:
            return np.zeros(band.shape, dtype=np.uint8)
    scaled = np.clip((np.nan_to_num(values, nan=lo) - lo) / (hi - lo), 0.0, 1.0)
    return np.round(scaled * 255.0).astype(np.uint8)


def to_rgb_uint8(bands: np.ndarray) -> np.ndarray:
    """(H, W) or (H, W, C) array of any dtype -> (H, W, 3) uint8 (rules 2 and 3)."""
    if bands.ndim == 2:
        bands = bands[:, :, None]
    if bands.ndim != 3 or bands.shape[2] == 0:
        raise ImageInputError(f"expected an (H, W) or (H, W, C) image array, got shape {bands.shape}")
    channels = bands.shape[2]
    bands = bands[:, :, :1] if channels in (1, 2) else bands[:, :, :3]
    if bands.dtype != np.uint8:
        bands = np.stack([stretch_to_uint8(bands[:, :, c]) for c in range(bands.shape[2])], axis=2)
    if bands.shape[2] == 1:
        bands = np.repeat(bands, 3, axis=2)
    return np.ascontiguousarray(bands)


def _pil_to_array(image: Image.Image) -> np.ndarray:
    if image.mode in ("RGB", "L"):
        return np.asarray(image)
    if image.mode in ("RGBA", "LA", "P", "PA", "CMYK", "YCbCr", "1", "LAB", "HSV"):
        return np.asarray(image.convert("RGB"))
    return np.asarray(image)  # I;16*, I, F: deeper than 8 bits, stretched by to_rgb_uint8


def _check_pixels(width: int, height: int, max_pixels: int, name: str) -> None:
    if width * height > max_pixels:
        raise ImageInputError(
            f"{name}: {width}x{height} = {width * height:,} pixels exceeds the limit of {max_pixels:,} "
            "(a decompression bomb or a scene to tile; raise max_pixels or crop it)"
        )


def _open_with_pil(data: Path | bytes, max_pixels: int, name: str) -> LoadedImage:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own limit below is the one that counts
        try:
            handle = Image.open(io.BytesIO(data) if isinstance(data, bytes) else data)
        except UnidentifiedImageError:
            raise ImageInputError(f"{name}: not an image file (or a format Pillow cannot read)") from None
        except Image.DecompressionBombError as err:
            raise ImageInputError(f"{name}: refused as a decompression bomb ({err})") from None
        except OSError as err:
            raise ImageInputError(f"{name}: cannot be opened: {err}") from None
    with handle:
        _check_pixels(handle.width, handle.height, max_pixels, name)
        try:
            handle.load()
        except (OSError, SyntaxError, ValueError) as err:  # truncated or corrupt data
            raise ImageInputError(f"{name}: corrupt or truncated image data ({err})") from None
        array = _pil_to_array(handle)
    return LoadedImage(Image.fromarray(to_rgb_uint8(array), "RGB"), None, (array.shape[1], array.shape[0]))


def _open_with_rasterio(path: Path, max_pixels: int) -> LoadedImage:
    import rasterio
    from rasterio.errors import NotGeoreferencedWarning, RasterioIOError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotGeoreferencedWarning)  # a plain TIFF: georef stays None
            dataset = rasterio.open(path)
    except RasterioIOError as err:
        raise ImageInputError(f"{path}: cannot be read as a raster: {err}") from None
    with dataset:
        width, height = dataset.width, dataset.height
        scale = min(1.0, (max_pixels / float(width * height)) ** 0.5)
        out_w, out_h = max(1, int(width * scale)), max(1, int(height * scale))
        bands = list(range(1, min(dataset.count, 3) + 1))
        try:
            array = dataset.read(bands, out_shape=(len(bands), out_h, out_w))
        except RasterioIOError as err:
            raise ImageInputError(f"{path}: corrupt raster data: {err}") from None
        nodata = dataset.nodata
        georef = None
        if dataset.crs is not None or not dataset.transform.is_identity:
            t = dataset.transform
            georef = GeoRef(
                (t.a, t.b, t.c, t.d, t.e, t.f), dataset.crs.to_string() if dataset.crs else None, width, height
            )
    array = np.moveaxis(array, 0, 2)
    if nodata is not None and array.dtype != np.uint8:
        array = np.where(array == nodata, np.nan, array.astype(np.float64))
    return LoadedImage(Image.fromarray(to_rgb_uint8(array), "RGB"), georef, (width, height))


def _rasterio_available() -> bool:
    try:
        import rasterio  # noqa: F401
    except ImportError:
        return False
    return True


def load_image(
    source: str | Path | bytes | Image.Image | np.ndarray, max_pixels: int = DEFAULT_MAX_PIXELS
) -> LoadedImage:
    """Any supported input -> 8-bit RGB (+ georeference for GeoTIFFs). Raises ImageInputError with the reason."""
    if isinstance(source, Image.Image):
        _check_pixels(source.width, source.height, max_pixels, "image")
        return LoadedImage(Image.fromarray(to_rgb_uint8(_pil_to_array(source)), "RGB"), None, source.size)
    if isinstance(source, np.ndarray):
        _check_pixels(source.shape[1] if source.ndim > 1 else 0, source.shape[0], max_pixels, "array")
        return LoadedImage(Image.fromarray(to_rgb_uint8(source), "RGB"), None, (source.shape[1], source.shape[0]))
    if isinstance(source, bytes):
        return _open_with_pil(source, max_pixels, "image bytes")
    path = Path(source)
    if not path.is_file():
        raise ImageInputError(f"image not found: {path}")
    if path.suffix.lower() in GEOTIFF_SUFFIXES and _rasterio_available():
        return _open_with_rasterio(path, max_pixels)
    return _open_with_pil(path, max_pixels, str(path))
