"""Canonical tool outputs on a georeferenced image -> geometry a GIS opens as it is: RFC 7946 GeoJSON in WGS 84.

Geometry is built once, in source pixels (the full-resolution raster; x right, y down), from the unrounded pixel
geometry the output keeps (`Detection.pixel_box` / `pixel_polygon`), else from the normalised values scaled by the
raster's size (normalised coordinates do not depend on a decimated read):
- a detection with a mask -> the mask's outline (`rasterio.features.shapes`, 4-connected, holes kept, simplified
  within `SIMPLIFY_PX` mask pixels, Douglas-Peucker with topology kept, so every vertex is a pixel corner); a mask of
  zero pixels gives no feature and is counted; without a mask -> its polygon, else its box;
- a road graph -> one LineString per edge, with its node ids;
- semantic classes -> one MultiPolygon per class, only when asked (`class_polygons`; the class raster is the product).
Pixels go to the raster's CRS by its affine transform, then to WGS 84 longitude/latitude with
`rasterio.warp.transform_geom` (cut at the antimeridian into Multi* parts), exteriors counter-clockwise and holes
clockwise (`shapely.orient_polygons`), rounded to `COORDINATE_DECIMALS`, and no `crs` member (RFC 7946 §4).
`geopilot.tools.geo_files` writes the same features to a GeoPackage in the native CRS and the class raster.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import shapely
from PIL import Image
from shapely.geometry import LineString, MultiPolygon, Polygon, box, mapping, shape
from shapely.geometry.base import BaseGeometry

from geopilot.errors import GeoPilotInputError
from geopilot.loaded_image import GeoRef
from geopilot.tool_output import MASK_MAX_PIXELS, RLE, Detection, ToolOutput, decode_mask

SIMPLIFY_PX = 0.5  # mask outlines: Douglas-Peucker tolerance in mask pixels (stair steps of diagonal edges go)
COORDINATE_DECIMALS = 7  # ~1 cm in degrees; RFC 7946 §11.2 says 6 (~10 cm) is enough
WGS84 = "EPSG:4326"  # rasterio gives (lon, lat) for it: longitude first, as RFC 7946 wants


@dataclass(frozen=True)
class PixelFeature:
    layer: str  # "detections", "roads" or "classes": one GeoPackage layer each
    geometry: BaseGeometry  # in source pixels
    properties: dict


@dataclass
class PixelFeatures:
    features: list[PixelFeature] = field(default_factory=list)
    empty_masks: int = 0  # masks of zero pixels: no feature


@functools.lru_cache(maxsize=64)
def wgs84_problem(georef: GeoRef) -> str | None:
    """Why this raster's outputs cannot be put in WGS 84 (no CRS, a CRS PROJ cannot reproject), or None."""
    from geopilot.raster import wgs84_problem as problem

    return problem(georef)


def mask_fit_problem(size: tuple[int, int], georef: GeoRef) -> str | None:
    """Why a mask of `size` (height, width) is not of this raster: larger than it, or not its shape (a mask of a
    decimated read is the raster scaled down, each side within a pixel of rounding). None when it fits."""
    height, width = size
    if not (0 < height <= georef.height and 0 < width <= georef.width) or abs(
        height * georef.width - width * georef.height
    ) > max(georef.width, georef.height):
        return f"a {height}x{width} mask does not fit the {georef.height}x{georef.width} image it belongs to"
    return None


def mask_array(rle: RLE, georef: GeoRef, max_pixels: int = MASK_MAX_PIXELS) -> np.ndarray:
    """The mask of `rle`, checked to be of this raster and within `max_pixels` before anything is decoded."""
    problem = mask_fit_problem(tuple(rle.size), georef)
    if problem is not None:
        raise GeoPilotInputError(problem)
    return decode_mask(rle, max_pixels)


def mask_geometry(rle: RLE, georef: GeoRef, max_pixels: int = MASK_MAX_PIXELS) -> MultiPolygon | None:
    """A mask's outline in source pixels (the mask may be of a decimated read), or None for an empty mask."""
    from rasterio.features import shapes

    mask = np.ascontiguousarray(mask_array(rle, georef, max_pixels))
    if not mask.any():
        return None
    parts = [shape(geom) for geom, _ in shapes(mask, mask=mask.astype(bool), connectivity=4)]
    outline = MultiPolygon(parts).simplify(SIMPLIFY_PX, preserve_topology=True)
    height, width = rle.size
    sx, sy = georef.width / width, georef.height / height
    scaled = shapely.transform(outline, lambda xy: xy * np.array([sx, sy]))
    return scaled if isinstance(scaled, MultiPolygon) else MultiPolygon([scaled])


def detection_geometry(
    det: Detection, georef: GeoRef, max_pixels: int = MASK_MAX_PIXELS
) -> tuple[str, BaseGeometry | None]:
    """(kind, geometry in source pixels) of one detection; a zero-pixel mask gives ("mask", None)."""
    if det.mask is not None:
        return "mask", mask_geometry(det.mask, georef, max_pixels)
    scale = np.array([georef.width, georef.height])
    if det.pixel_polygon is not None:
        return "polygon", Polygon(det.pixel_polygon)
    if det.polygon is not None:
        return "polygon", Polygon(np.array(det.polygon) * scale)
    if det.pixel_box is not None:
        return "box", box(*det.pixel_box)
    x1, y1, x2, y2 = det.box
    return "box", box(x1 * georef.width, y1 * georef.height, x2 * georef.width, y2 * georef.height)


def pixel_features(
    output: ToolOutput, georef: GeoRef, tool: str, class_polygons: bool = False, max_pixels: int = MASK_MAX_PIXELS
) -> PixelFeatures:
    """Every geometry of a tool output, in source pixels, with the properties a GIS shows."""
    found = PixelFeatures()
    for index, det in enumerate(output.detections):
        kind, geometry = detection_geometry(det, georef, max_pixels)
        if geometry is None:
            found.empty_masks += 1
            continue
        properties = {"tool": tool, "kind": kind, "index": index, "label": det.label}
        if det.score is not None:
            properties["score"] = det.score
        found.features.append(PixelFeature("detections", geometry, properties))
    if output.roads is not None:
        nodes = np.array(output.roads.nodes, dtype=np.float64).reshape(-1, 2) * [georef.width, georef.height]
        for index, (a, b) in enumerate(output.roads.edges):
            properties = {"tool": tool, "kind": "road", "edge": index, "from_node": a, "to_node": b}
            found.features.append(PixelFeature("roads", LineString([nodes[a], nodes[b]]), properties))
    if class_polygons:
        for class_id, segment in enumerate(output.segments, start=1):
            geometry = mask_geometry(segment.mask, georef, max_pixels) if segment.mask is not None else None
            if geometry is None:
                found.empty_masks += segment.mask is not None
                continue
            properties = {"tool": tool, "kind": "class", "class_id": class_id, "label": segment.label}
            found.features.append(PixelFeature("classes", geometry, {**properties, "area": segment.area}))
    return found


def to_native(geometry: BaseGeometry, georef: GeoRef) -> BaseGeometry:
    """Source pixels -> the raster's CRS, by its affine transform."""
    a, b, c, d, e, f = georef.transform
    matrix = np.array([[a, d], [b, e]])
    return shapely.transform(geometry, lambda xy: xy @ matrix + np.array([c, f]))


def to_wgs84(geometries: Iterable[BaseGeometry], crs: str) -> list[dict]:
    """Native-CRS geometries -> RFC 7946 GeoJSON geometries (lon/lat, cut at the antimeridian, right-hand rings)."""
    from rasterio.warp import transform_geom

    native = [mapping(g) for g in geometries]
    if not native:
        return []
    out = []
    for geom in transform_geom(crs, WGS84, native):
        oriented = shapely.orient_polygons(shape(geom), exterior_cw=False)
        rounded = shapely.transform(oriented, lambda xy: np.round(xy, COORDINATE_DECIMALS))
        out.append(_lists(mapping(rounded)))
    return out


def to_geojson(
    output: ToolOutput, georef: GeoRef, tool: str, class_polygons: bool = False, max_pixels: int = MASK_MAX_PIXELS
) -> dict | None:
    """An RFC 7946 FeatureCollection of the output, or None when the raster cannot be put in WGS 84."""
    if wgs84_problem(georef) is not None:
        return None
    return feature_collection(pixel_features(output, georef, tool, class_polygons, max_pixels), georef)


def feature_collection(found: PixelFeatures, georef: GeoRef) -> dict:
    """The RFC 7946 FeatureCollection of features already found (the raster must be one WGS 84 can hold)."""
    geometries = to_wgs84((to_native(f.geometry, georef) for f in found.features), georef.crs)
    features = [
        {"type": "Feature", "geometry": geometry, "properties": f.properties}
        for f, geometry in zip(found.features, geometries, strict=True)
    ]
    return {"type": "FeatureCollection", "features": features}


def _lists(value):
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_lists(v) for v in value]
    return value


def rfc7946_problems(collection: dict) -> list[str]:
    """What keeps a FeatureCollection from being RFC 7946: a `crs` member, positions that are not [lon, lat(, h)] in
    range, rings that are not closed or not right-handed (exterior counter-clockwise, holes clockwise)."""
    problems = ["a `crs` member (RFC 7946 §4 removed it)"] if "crs" in collection else []
    for index, feature in enumerate(collection.get("features", [])):
        if "crs" in feature:
            problems.append(f"feature {index}: a `crs` member")
        geometry = feature.get("geometry") or {}
        for where, problem in _geometry_problems(geometry):
            problems.append(f"feature {index}{where}: {problem}")
    return problems


def _geometry_problems(geometry: dict):
    kind, coords = geometry.get("type"), geometry.get("coordinates")
    polygons = {"Polygon": [coords], "MultiPolygon": coords}.get(kind, [])
    lines = {"LineString": [coords], "MultiLineString": coords, "Point": [[coords]], "MultiPoint": [coords]}.get(kind)
    for position in (p for part in (lines or []) for p in part):
        yield from _position_problems(position)
    for p_index, rings in enumerate(polygons):
        for r_index, ring in enumerate(rings):
            where = f" polygon {p_index} ring {r_index}"
            for position in ring:
                yield from ((where, problem) for _, problem in _position_problems(position))
            if len(ring) < 4 or ring[0] != ring[-1]:
                yield where, "a ring needs >= 4 positions, the last equal to the first"
            elif shapely.is_ccw(shapely.LinearRing(ring)) != (r_index == 0):
                yield where, "exterior rings run counter-clockwise, holes clockwise"


def _position_problems(position):
    if not 2 <= len(position) <= 3:
        yield "", f"a position has {len(position)} numbers (lon, lat and at most a height)"
    elif not (-180.0 <= position[0] <= 180.0 and -90.0 <= position[1] <= 90.0):
        yield "", f"position {position[:2]} is not [longitude, latitude] in degrees"


def save_geotiff(image: Image.Image, georef: GeoRef, path: str | Path) -> None:
    """Write an RGB image covering the raster's footprint, with its CRS; the transform is rescaled when the image
    was read decimated (pixel sizes grow by full size / image size)."""
    import rasterio
    from rasterio.transform import Affine

    width, height = image.size
    a, b, c, d, e, f = georef.transform
    sx, sy = georef.width / width, georef.height / height
    pixels = np.moveaxis(np.asarray(image.convert("RGB")), 2, 0)
    profile = {"driver": "GTiff", "width": width, "height": height, "count": 3, "dtype": "uint8", "crs": georef.crs}
    with rasterio.open(path, "w", transform=Affine(a * sx, b * sy, c, d * sx, e * sy, f), **profile) as dst:
        dst.write(pixels)
