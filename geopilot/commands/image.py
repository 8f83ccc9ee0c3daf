"""`geopilot image info FILE [--json] [--bands 4,3,2]`: what GeoPilot will do with an image, without running a model.

    {"width", "height", "count", "dtype", "bands": [1-based band numbers shown as RGB; one = shown grey],
     "bands_reason", "modality", "modality_source" ("band names" | "pixels"), "crs", "bounds_wgs84": [west, south,
     east, north] (west > east across the antimeridian), "gsd_m", "nodata", "decimation": {"factor", "picture",
     "overviews"}}

`gsd_m` is the mean pixel size in metres: the transform's for a projected CRS, the ground distance between
neighbouring pixel centres at the scene's centre for a geographic one; null without a CRS. Notes (a guessed band
choice, no CRS, a CRS that cannot be reprojected) go to stderr once. Exit 2 for an unreadable file or bad bands.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from geopilot.argtypes import bands as bands_type
from geopilot.cli import Command

EARTH_RADIUS_M = 6_371_008.8  # mean radius (IUGG)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="image file (GeoTIFF, PNG, JPEG, TIFF, WebP)")
    parser.add_argument("--bands", type=bands_type, default=None, help="band numbers to show, e.g. 4,3,2")
    parser.add_argument("--json", action="store_true", help="one JSON object")


def run(args: argparse.Namespace) -> int:
    report, notes = image_info(Path(args.file), args.bands)
    for note in notes:
        print(f"geopilot image info: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:<16} {json.dumps(value) if isinstance(value, (list, dict)) else value}")
    return 0


def image_info(path: Path, bands: list[int] | None = None) -> tuple[dict, tuple[str, ...]]:
    """The `image info` report and the image's notes."""
    from geopilot.image import infer_modality, load_image, open_header

    loaded = load_image(path, bands=bands)
    choice = loaded.bands
    width, height = loaded.source_size
    report = {
        "width": width,
        "height": height,
        "count": None,
        "dtype": "uint8",
        "bands": list(choice.bands),
        "bands_reason": choice.reason,
        "modality": infer_modality(loaded),
        "modality_source": "band names" if choice.modality is not None else "pixels",
        "crs": None,
        "bounds_wgs84": None,
        "gsd_m": None,
        "nodata": None,
        "decimation": {**_decimation(loaded), "overviews": []},
    }
    if loaded.raster is not None:
        report.update(_raster_facts(path, loaded))
    else:
        with open_header(path, str(path)) as handle:
            report["count"] = len(handle.getbands())
    return report, loaded.notes


def _raster_facts(path: Path, loaded) -> dict:
    import rasterio

    from geopilot.raster import wgs84_problem

    with rasterio.open(path) as dataset:
        nodata = dataset.nodata
        facts = {
            "count": dataset.count,
            "dtype": dataset.dtypes[0],
            "crs": dataset.crs.to_string() if dataset.crs else None,
            "nodata": "nan" if nodata is not None and math.isnan(nodata) else nodata,
        }
        facts["decimation"] = {**_decimation(loaded), "overviews": dataset.overviews(loaded.bands.bands[0])}
        if dataset.crs is not None and wgs84_problem(loaded.georef) is None:
            from rasterio.warp import transform_bounds

            facts["bounds_wgs84"] = [round(v, 7) for v in transform_bounds(dataset.crs, "EPSG:4326", *dataset.bounds)]
            facts["gsd_m"] = _gsd_m(dataset)
    return facts


def _decimation(loaded) -> dict:
    width, height = loaded.source_size
    return {"factor": round(max(width, height) / max(loaded.image.size), 3), "picture": list(loaded.image.size)}


def _gsd_m(dataset) -> float:
    t = dataset.transform
    size_x, size_y = math.hypot(t.a, t.d), math.hypot(t.b, t.e)
    if dataset.crs.is_projected:
        return round((size_x + size_y) / 2 * dataset.crs.linear_units_factor[1], 3)
    from rasterio.warp import transform

    cx, cy = dataset.width / 2, dataset.height / 2
    cols, rows = [cx, cx + 1, cx], [cy, cy, cy + 1]
    xs, ys = zip(*(t * (c, r) for c, r in zip(cols, rows, strict=True)), strict=True)
    lons, lats = transform(dataset.crs, "EPSG:4326", list(xs), list(ys))
    steps = [_haversine_m(lons[0], lats[0], lons[i], lats[i]) for i in (1, 2)]
    return round(sum(steps) / 2, 3)


def _haversine_m(lon1: float, lat1: float, lon2: float, lat2: float) -> float:
    p1, p2 = math.radians(lat1), math.radians(lat2)
    a = math.sin((p2 - p1) / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(math.radians(lon2 - lon1) / 2) ** 2
    return 2 * EARTH_RADIUS_M * math.asin(math.sqrt(a))


COMMANDS = {
    "info": Command("size, bands shown, modality, CRS, footprint and decimation of an image", add_arguments, run)
}
