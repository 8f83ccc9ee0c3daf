"""Map coordinates for georeferenced inputs: canonical outputs -> a GeoJSON FeatureCollection in the raster's CRS.

Normalised coordinates do not depend on a decimated read, so a point (u, v) in [0, 1] is pixel
(u * W, v * H) of the full raster (W, H from `GeoRef`), and map (X, Y) = (a*px + b*py + c, d*px + e*py + f).
Detections become Polygons (the rotated polygon when there is one, else the box), road edges LineStrings.
The CRS is named in a top-level `crs` member (GeoJSON 2008 style) because RFC 7946 allows only WGS 84.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from geopilot.image import GeoRef
from geopilot.tool_output import ToolOutput


def to_map(georef: GeoRef, u: float, v: float) -> list[float]:
    a, b, c, d, e, f = georef.transform
    px, py = u * georef.width, v * georef.height
    return [a * px + b * py + c, d * px + e * py + f]


def _ring(georef: GeoRef, points: Sequence[Sequence[float]]) -> list[list[float]]:
    ring = [to_map(georef, u, v) for u, v in points]
    return ring + [ring[0]]


def to_geojson(output: ToolOutput, georef: GeoRef, tool: str) -> dict:
    features = []
    for det in output.detections:
        x1, y1, x2, y2 = det.box
        outline = det.polygon or [(x1, y1), (x2, y1), (x2, y2), (x1, y2)]
        properties = {"tool": tool, "label": det.label, **({"score": det.score} if det.score is not None else {})}
        features.append(
            {
                "type": "Feature",
                "geometry": {"type": "Polygon", "coordinates": [_ring(georef, outline)]},
                "properties": properties,
            }
        )
    if output.roads is not None:
        for index, (a, b) in enumerate(output.roads.edges):
            line = [to_map(georef, *output.roads.nodes[a]), to_map(georef, *output.roads.nodes[b])]
            features.append(
                {
                    "type": "Feature",
                    "geometry": {"type": "LineString", "coordinates": line},
                    "properties": {"tool": tool, "edge": index},
                }
            )
    collection: dict = {"type": "FeatureCollection", "features": features}
    if georef.crs:
        collection["crs"] = {"type": "name", "properties": {"name": georef.crs}}
    return collection


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
