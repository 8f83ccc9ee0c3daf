"""Files a GIS opens as they are, from a canonical tool output on a georeferenced image (`geopilot.tools.geo`):

- `.geojson`: RFC 7946, WGS 84 longitude/latitude (what `ToolOutput.geojson` holds);
- `.gpkg`: a GeoPackage in the raster's own CRS (metres for UTM), written with pyogrio: layers `detections`
  (MultiPolygon: boxes, rotated polygons, mask outlines), `roads` (LineString, with node ids), `classes`
  (MultiPolygon per semantic class, with `class_polygons`);
Every file is written to a temp file beside it and renamed (`geopilot.fileio.staged`): a failed export leaves no
half file. Masks are checked against the image and `max_pixels` before they are decoded (`geopilot.tools.geo`).
- `.tif`: semantic segmentation as a single-band Cloud-Optimised GeoTIFF of class ids (uint8, 0 = no class = nodata;
  a later class wins where masks overlap) with the source's CRS and transform (scaled when the masks are of a
  decimated read), the class table as tags `CLASS_<id>=<label>` and a colour map.

    export(output, georef, "segment_semantic", Path("classes.tif"))
    write_beside(output, georef, "detect_objects", Path("out/"))   # what `geopilot tools run --out` writes
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from geopilot.errors import GeoPilotInputError
from geopilot.fileio import staged
from geopilot.loaded_image import GeoRef
from geopilot.tool_output import MASK_MAX_PIXELS, ToolOutput
from geopilot.tools.geo import PixelFeatures, feature_collection, mask_array, pixel_features, to_native, wgs84_problem

GEOJSON_SUFFIXES = (".geojson", ".json")
GPKG_SUFFIXES = (".gpkg",)
RASTER_SUFFIXES = (".tif", ".tiff")
LAYER_TYPES = {"detections": "MultiPolygon", "roads": "LineString", "classes": "MultiPolygon"}
PALETTE = [  # class colours, repeated past 12 classes
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
    (174, 199, 232),
    (255, 187, 120),
]


class GeoExportError(GeoPilotInputError):
    """An output that cannot become the file asked for (no georeference, no classes, an unknown suffix)."""


@dataclass(frozen=True)
class Written:
    path: Path
    features: int  # features, or classes for the class raster
    empty_masks: int = 0  # masks of zero pixels: no feature


def export(
    output: ToolOutput,
    georef: GeoRef | None,
    tool: str,
    path: Path,
    class_polygons: bool = False,
    max_pixels: int = MASK_MAX_PIXELS,
) -> Written:
    """Write `output` to `path`, the format chosen by its suffix; GeoExportError says why it cannot be."""
    suffix = path.suffix.lower()
    if suffix not in GEOJSON_SUFFIXES + GPKG_SUFFIXES + RASTER_SUFFIXES:
        raise GeoExportError(f"{path}: unknown format; use .geojson (RFC 7946), .gpkg (native CRS) or .tif (classes)")
    if georef is None or georef.crs is None:
        raise GeoExportError("the image has no CRS: tool outputs are in pixel coordinates only, nothing to map")
    if suffix in RASTER_SUFFIXES:
        return write_class_raster(output, georef, path, max_pixels)
    if suffix in GEOJSON_SUFFIXES and (problem := wgs84_problem(georef)) is not None:
        raise GeoExportError(f"{problem}; write a .gpkg instead")
    found = pixel_features(output, georef, tool, class_polygons, max_pixels)
    return write_gpkg(found, georef, path) if suffix in GPKG_SUFFIXES else write_geojson(found, georef, path)


def write_beside(
    output: ToolOutput,
    georef: GeoRef,
    tool: str,
    folder: Path,
    class_polygons: bool = False,
    max_pixels: int = MASK_MAX_PIXELS,
):
    """The files `geopilot tools run --out` writes next to output.json: GeoJSON and GeoPackage when the output has
    geometry, the class raster when it has semantic masks. Returns what was written."""
    written = []
    has_geometry = output.detections or output.roads is not None or (class_polygons and output.segments)
    if has_geometry and georef.crs is not None:
        found = pixel_features(output, georef, tool, class_polygons, max_pixels)
        if wgs84_problem(georef) is None:
            written.append(write_geojson(found, georef, folder / "output.geojson"))
        written.append(write_gpkg(found, georef, folder / "output.gpkg"))
    if georef.crs is not None and any(s.mask is not None for s in output.segments):
        written.append(write_class_raster(output, georef, folder / "classes.tif", max_pixels))
    return written


def write_geojson(found: PixelFeatures, georef: GeoRef, path: Path) -> Written:
    """The features as an RFC 7946 FeatureCollection (the raster must be one WGS 84 can hold)."""
    collection = feature_collection(found, georef)
    with staged(path) as staging:
        staging.write_text(json.dumps(collection) + "\n", encoding="utf-8")
    return Written(path, len(collection["features"]), found.empty_masks)


def write_gpkg(found: PixelFeatures, georef: GeoRef, path: Path) -> Written:
    """The features as a GeoPackage in the raster's own CRS, one layer a feature kind."""
    import shapely
    from pyogrio import raw

    layers = dict.fromkeys(f.layer for f in found.features) or {"detections": None}
    with staged(path) as staging:  # a fresh file, not layers appended to an old one
        for layer in layers:
            rows = [f for f in found.features if f.layer == layer]
            geometry = np.array([shapely.to_wkb(to_native(f.geometry, georef)) for f in rows], dtype=object)
            names = list(dict.fromkeys(key for f in rows for key in f.properties)) or ["tool"]
            columns = [_column([f.properties.get(name) for f in rows]) for name in names]
            kind = LAYER_TYPES[layer]
            raw.write(
                str(staging),
                geometry,
                columns,
                names,
                layer=layer,
                driver="GPKG",
                geometry_type=kind,
                crs=georef.crs,
                promote_to_multi=kind.startswith("Multi"),
            )
    return Written(path, len(found.features), found.empty_masks)


def _column(values: list) -> np.ndarray:
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        kind = np.int64 if all(isinstance(v, int) for v in present) and len(present) == len(values) else np.float64
        return np.array([np.nan if v is None else v for v in values], dtype=kind)
    return np.array(["" if v is None else str(v) for v in values], dtype=object)


def write_class_raster(output: ToolOutput, georef: GeoRef, path: Path, max_pixels: int = MASK_MAX_PIXELS) -> Written:
    import rasterio
    from rasterio.transform import Affine

    masked = [(class_id, s) for class_id, s in enumerate(output.segments, start=1) if s.mask is not None]
    if not masked:
        raise GeoExportError("the output has no semantic class masks (segment_semantic): no class raster to write")
    sizes = {tuple(s.mask.size) for _, s in masked}
    if len(sizes) != 1 or len(output.segments) > 255:
        shown = sorted(sizes)[:5]
        raise GeoExportError(f"class masks must share one size and be at most 255 classes, got sizes {shown}")
    height, width = next(iter(sizes))
    ids = np.zeros((0, 0), dtype=np.uint8)
    for class_id, segment in masked:
        mask = mask_array(segment.mask, georef, max_pixels)  # its size checked before anything is allocated
        ids = ids if ids.size else np.zeros((height, width), dtype=np.uint8)
        ids[mask.astype(bool)] = class_id
    transform = Affine(*georef.transform) * Affine.scale(georef.width / width, georef.height / height)
    profile = {"driver": "COG", "width": width, "height": height, "count": 1, "dtype": "uint8", "nodata": 0}
    options = {"blocksize": 256, "compress": "deflate", "overview_resampling": "nearest"}
    with staged(path) as staging:
        with rasterio.open(staging, "w", crs=georef.crs, transform=transform, **profile, **options) as dst:
            dst.write(ids, 1)
            dst.set_band_description(1, "class id")
            dst.update_tags(**{f"CLASS_{class_id}": s.label for class_id, s in enumerate(output.segments, start=1)})
            colours = {i: (*PALETTE[(i - 1) % len(PALETTE)], 255) for i in range(1, len(output.segments) + 1)}
            dst.write_colormap(1, {0: (0, 0, 0, 0), **colours})
    return Written(path, len(output.segments))
