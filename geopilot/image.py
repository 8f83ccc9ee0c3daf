"""Image input: PNG/JPEG/TIFF (GeoTIFF through rasterio when installed), SAR and 16-bit data, size limits, bands.

Rules, in order:
1. The size is checked from the header, before anything is decoded, against `max_pixels` twice: the pixel count,
   and the square of the longest side, because the model pads every image to a square of its long side (a 143-byte
   1 x 20000 PNG would otherwise cost a 20000 x 20000 buffer). A GeoTIFF over the limit is read decimated to fit it
   (GDAL reads overviews or subsamples); any other format is refused (`ImageTooLargeError`, 413 in the API), as is
   one over Pillow's own decompression-bomb limit, and one longer than `PAD_FREE_SIDE` whose long side is over
   `MAX_ASPECT_RATIO` times its short one (an 86-byte 6324 x 1 PNG would cost a 40 M-pixel square per request). A GeoTIFF is never decoded whole: its picture is a decimated read
   of at most 2048 px a side, and tools read it through `LoadedImage.raster` (`geopilot.raster`).
2. Data deeper than 8 bits (16-bit, 32-bit int, float) is stretched to 8 bits per band with a percentile rule:
   `lo, hi = percentile(band, 2), percentile(band, 98)` over valid values (finite, and not the GeoTIFF's nodata),
   `out = clip((x - lo) / (hi - lo), 0, 1) * 255`; nodata pixels are black. 8-bit data is used as is.
3. Which bands are shown is `geopilot.bands` (explicit `bands=`, colour interpretation, known band names, else the
   first three); one band (SAR amplitude, grayscale) is replicated to 3; alpha is dropped.
4. Modality, when the caller does not say (`infer_modality`): what the band names say (VV/VH: SAR; a known optical
   sensor: optical), else an image without colour is SAR, one with colour is optical. "Without colour" means the
   loaded 8-bit RGB has (nearly) equal channels: mean per-pixel spread
   max(R, G, B) - min(R, G, B) below `GREY_SPREAD` levels (lossy codecs leave a little chroma noise). So one band
   at any depth (SAR amplitude, 16-bit included), two bands (dual-pol: the first is shown) and grey stored as RGB
   (SSDD/HRSID JPEGs) read as SAR; 16-bit or float data with distinct bands (multispectral) reads as optical, since
   bit depth alone does not tell SAR from optical. A panchromatic optical image also reads as SAR by this rule:
   declare `modality="optical"` for those. The agent gates tools by modality only when the caller declared it.
Decoders: only those GeoPilot needs are reachable. Pillow is opened with `formats=PILLOW_FORMATS` (PNG, JPEG, TIFF,
WebP), so EPS (which hands the bytes to Ghostscript) and Pillow's other decoders never see the input; GeoTIFFs (files
named .tif/.tiff, and TIFF bytes) go to rasterio with the GTiff driver only. An empty (0-pixel) image, a directory or
an object that is not an image is a one-line `ImageInputError`.
The model-side geometry (pad to a square with the CLIP mean colour, resize to 336) is the image processor's.
5. Several images of one chat or sample (before, after) are loaded one by one by these rules and must then be one
   size (`check_same_size`): a pair of different sizes is refused, never resampled (docs/design.md §3).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, UnidentifiedImageError

from geopilot.bands import BandChoice, choose_bands
from geopilot.errors import GeoPilotInputError, ImageInputError, ImageTooLargeError
from geopilot.fileio import regular_file
from geopilot.loaded_image import STRETCH_PERCENTILES, LoadedImage, percentile_limits

if TYPE_CHECKING:
    from geopilot.sample import Modality

DEFAULT_MAX_PIXELS = 100_000_000  # 10k x 10k; training data and the API can set their own
MAX_ASPECT_RATIO = 20  # long side / short side, for images with a side over PAD_FREE_SIDE (rule 1)
PAD_FREE_SIDE = 2048  # up to this long side the padded square is cheap, whatever the shape
GREY_SPREAD = 2.0  # rule 4: mean max-min channel spread (8-bit levels) below which an image has no colour
MODALITY_SAMPLE_PIXELS = 1_000_000  # rule 4 looks at a regular subsample of at most this many pixels
GEOTIFF_SUFFIXES = {".tif", ".tiff"}
PILLOW_FORMATS = ("PNG", "JPEG", "TIFF", "WEBP")  # the decoders Pillow may use; every other one is unreachable
TIFF_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # classic and BigTIFF, both byte orders


def stretch_to_uint8(band: np.ndarray, percentiles: tuple[float, float] = STRETCH_PERCENTILES) -> np.ndarray:
    """Percentile stretch of one band to uint8 (rule 2 above); NaN pixels are black."""
    values = band.astype(np.float64)
    finite = np.isfinite(values)
    limits = percentile_limits(values[finite], percentiles)
    if limits is None:
        return np.zeros(band.shape, dtype=np.uint8)
    lo, hi = limits
    scaled = np.clip((np.nan_to_num(values, nan=lo) - lo) / (hi - lo), 0.0, 1.0)
    return np.where(finite, np.round(scaled * 255.0), 0).astype(np.uint8)


def to_rgb_uint8(bands: np.ndarray, choice: BandChoice | None = None) -> np.ndarray:
    """(H, W) or (H, W, C) array of any dtype -> (H, W, 3) uint8 (rules 2 and 3), showing `choice` (default: rule 3)."""
    if bands.ndim == 2:
        bands = bands[:, :, None]
    if bands.ndim != 3 or bands.shape[2] == 0:
        raise ImageInputError(f"expected an (H, W) or (H, W, C) image array, got shape {bands.shape}")
    choice = choice or array_choice(bands.shape[2])
    bands = bands[:, :, [b - 1 for b in choice.bands]]
    if bands.dtype != np.uint8:
        bands = np.stack([stretch_to_uint8(bands[:, :, c]) for c in range(bands.shape[2])], axis=2)
    if bands.shape[2] == 1:
        bands = np.repeat(bands, 3, axis=2)
    return np.ascontiguousarray(bands)


def array_choice(channels: int, explicit: Sequence[int] | None = None, name: str = "image") -> BandChoice:
    """The bands shown of an array or a Pillow image: RGB as it is, else `geopilot.bands.choose_bands`."""
    if explicit is None and channels == 3:
        return BandChoice((1, 2, 3), "RGB image")
    return choose_bands(channels, explicit, name=name)


def _loaded(array: np.ndarray, bands: Sequence[int] | None, name: str) -> LoadedImage:
    choice = array_choice(1 if array.ndim == 2 else array.shape[2], bands, name)
    size = (array.shape[1], array.shape[0])
    notes = (choice.note,) if choice.note else ()
    return LoadedImage(Image.fromarray(to_rgb_uint8(array, choice), "RGB"), None, size, choice, None, notes)


def _pil_to_array(image: Image.Image) -> np.ndarray:
    if image.mode in ("RGB", "L"):
        return np.asarray(image)
    if image.mode in ("RGBA", "LA", "P", "PA", "CMYK", "YCbCr", "1", "LAB", "HSV"):
        return np.asarray(image.convert("RGB"))
    return np.asarray(image)  # I;16*, I, F: deeper than 8 bits, stretched by to_rgb_uint8


def check_size(width: int, height: int, max_pixels: int, name: str) -> None:
    """Rule 1: refuse an empty image, more than `max_pixels` pixels, a padded square over `max_pixels`, or a long
    strip (over `PAD_FREE_SIDE` and `MAX_ASPECT_RATIO`). Every entry point calls it on the header, before decoding."""
    if width <= 0 or height <= 0:
        raise ImageInputError(f"{name}: the image is empty ({width}x{height} pixels)")
    if width * height > max_pixels:
        raise ImageTooLargeError(
            f"{name}: {width}x{height} = {width * height:,} pixels exceeds the limit of {max_pixels:,} "
            "(a decompression bomb or a scene to tile; raise max_pixels or crop it)"
        )
    side = max(width, height)
    if side * side > max_pixels:
        raise ImageTooLargeError(
            f"{name}: {width}x{height} is padded to a {side}x{side} square for the model ({side * side:,} pixels), "
            f"over the limit of {max_pixels:,}; crop it into tiles closer to square"
        )
    if side > PAD_FREE_SIDE and side > MAX_ASPECT_RATIO * min(width, height):
        raise ImageTooLargeError(
            f"{name}: {width}x{height} is over {MAX_ASPECT_RATIO}:1 with a side over {PAD_FREE_SIDE} px (the model "
            f"pads it to a {side}x{side} square); crop it into tiles closer to square"
        )


def open_header(data: Path | bytes, name: str) -> Image.Image:
    """The image opened for its header, no pixel decoded yet (the caller closes it): the one place a header is read.
    Only `PILLOW_FORMATS` open; Pillow's own decompression-bomb limit is refused as too large."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # check_size is the limit that counts
        try:
            return Image.open(io.BytesIO(data) if isinstance(data, bytes) else data, formats=PILLOW_FORMATS)
        except UnidentifiedImageError:
            raise ImageInputError(
                f"{name}: not an image file in a format GeoPilot reads (PNG, JPEG, TIFF, WebP)"
            ) from None
        except Image.DecompressionBombError as err:
            raise ImageTooLargeError(f"{name}: refused as a decompression bomb ({err})") from None
        except OSError as err:
            raise ImageInputError(f"{name}: cannot be opened: {err}") from None


def read_size(data: Path | bytes, name: str) -> tuple[int, int]:
    """(width, height) from the header alone."""
    with open_header(data, name) as handle:
        return handle.size


def _open_with_pil(data: Path | bytes, max_pixels: int, name: str, bands: Sequence[int] | None) -> LoadedImage:
    handle = open_header(data, name)
    with handle:
        check_size(handle.width, handle.height, max_pixels, name)
        try:
            handle.load()
        except (OSError, SyntaxError, ValueError) as err:  # truncated or corrupt data
            raise ImageInputError(f"{name}: corrupt or truncated image data ({err})") from None
        array = _pil_to_array(handle)
    return _loaded(array, bands, name)


def rasterio_available() -> bool:
    try:
        import rasterio  # noqa: F401
    except ImportError:
        return False
    return True


def load_image(
    source: str | Path | bytes | Image.Image | np.ndarray,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    bands: Sequence[int] | None = None,
) -> LoadedImage:
    """Any supported input -> 8-bit RGB (+ georeference for GeoTIFFs), showing `bands` (1-based; default: rule 3).
    Raises ImageInputError with the reason."""
    if isinstance(source, Image.Image):
        check_size(source.width, source.height, max_pixels, "image")
        return _loaded(_pil_to_array(source), bands, "image")
    if isinstance(source, np.ndarray):
        if source.ndim not in (2, 3) or source.dtype.kind not in "biuf":
            raise ImageInputError(
                f"array: expected an (H, W) or (H, W, C) array of numbers, got shape {source.shape} of {source.dtype}"
            )
        check_size(source.shape[1], source.shape[0], max_pixels, "array")
        pixels = source.astype(np.uint8) if source.dtype.kind == "b" else source
        return _loaded(pixels, bands, "array")
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        if data[:4] in TIFF_MAGIC and rasterio_available():
            from geopilot.raster import open_raster

            return open_raster(data, "image bytes", max_pixels, bands)
        return _open_with_pil(data, max_pixels, "image bytes", bands)
    if not isinstance(source, (str, Path)):
        raise ImageInputError(
            f"the image must be a file path, bytes, a PIL image or a numpy array, got {type(source).__name__}"
        )
    path = Path(source)
    if path.is_dir():
        raise ImageInputError(f"{path}: is a directory, not an image file")
    try:
        regular_file(path, "image")  # missing, a directory, a FIFO (it would hang), a device: said as what it is
    except GeoPilotInputError as err:
        raise ImageInputError(str(err)) from None
    if path.suffix.lower() in GEOTIFF_SUFFIXES and rasterio_available():
        from geopilot.raster import open_raster

        return open_raster(path, str(path), max_pixels, bands)
    return _open_with_pil(path, max_pixels, str(path), bands)


def infer_modality(image: LoadedImage | Image.Image) -> Modality:
    """Rule 4: what the band names say, else "sar" for an image without colour (one or two bands, or equal
    channels), else "optical"."""
    if isinstance(image, LoadedImage) and image.bands is not None and image.bands.modality is not None:
        return image.bands.modality
    pixels = image.image if isinstance(image, LoadedImage) else image
    array = np.asarray(pixels.convert("RGB") if pixels.mode != "RGB" else pixels)
    step = max(1, int((array.shape[0] * array.shape[1] / MODALITY_SAMPLE_PIXELS) ** 0.5))
    sample = array[::step, ::step].astype(np.int16)
    if sample.size == 0:
        return "optical"
    spread = sample.max(axis=2) - sample.min(axis=2)
    return "sar" if float(spread.mean()) < GREY_SPREAD else "optical"


def check_same_size(images: Sequence[LoadedImage]) -> None:
    """Several images of one chat or sample must be one size: they are a co-registered pair (or series), which a
    change tool compares pixel by pixel. ImageInputError naming the sizes; nothing is resampled."""
    width, height = images[0].image.size
    for number, loaded in enumerate(images[1:], start=2):
        if loaded.image.size != (width, height):
            other = "x".join(map(str, loaded.image.size))
            raise ImageInputError(
                f"image {number} is {other} px but image 1 is {width}x{height}: the images of one chat must be the "
                "same size (a co-registered pair); resample one onto the other's grid first"
            )
