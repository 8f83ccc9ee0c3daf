"""SpaceNet roads reader, three layouts (picked by what is on disk):

- SpaceNet-3 on AWS (`SN3_roads_train_AOI_2_Vegas.tar.gz`, torchgeo): `<AOI>/geojson_roads[_speed]/
  SN3_roads_train_<AOI>_geojson_roads_img<N>.geojson` next to `<AOI>/PS-RGB/SN3_roads_train_<AOI>_PS-RGB_img<N>.tif`.
- the 2018 challenge release (`AOI_2_Vegas_Roads_Train.tar.gz`, CosmiQ apls / CRESI):
  `AOI_2_Vegas_Roads_Train/geojson/spacenetroads/spacenetroads_AOI_2_Vegas_img<N>.geojson` next to
  `AOI_2_Vegas_Roads_Train/RGB-PanSharpen/RGB-PanSharpen_AOI_2_Vegas_img<N>.tif` (16-bit, read through GDAL).
- Sat2Graph-processed: `RGB_1.0_meter/<name>__rgb.png` + `<name>__gt_graph.p` + `data_split.json`; graph keys
  (a, b) map to x = b, y = H - a (a flipped y), read with the restricted unpickler.

GeoJSON roads are LineStrings / MultiLineStrings in WGS84 lon/lat (often with a z value); they go to pixels through
the GeoTIFF's CRS and affine transform (rasterio). Images without a CRS are taken to have pixel coordinates.
Run: `read_spacenet(Path("SpaceNet"), split="train")`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from geopilot.data_gen.readers.cityscale import read_graph_pickle
from geopilot.data_gen.readers.common import (
    BAD_GEOMETRY,
    MALFORMED_FILE,
    MISSING_LABEL,
    DatasetRootError,
    ReadResult,
    checked_image,
    finish,
    load_json,
    parse_json,
    read_limited,
    require_dir,
)
from geopilot.data_gen.readers.graphs import polyline_graph
from geopilot.records import AnnotationRecord, ReadReport

SAT2GRAPH_FOLDER = "RGB_1.0_meter"
LAYOUTS = (
    "<AOI>/geojson_roads/*.geojson + <AOI>/PS-RGB/*.tif (SpaceNet-3, SN3_roads_train_<AOI>.tar.gz)",
    "AOI_*_Roads_Train/geojson/spacenetroads/*.geojson + AOI_*_Roads_Train/RGB-PanSharpen/*.tif (2018 release)",
    f"{SAT2GRAPH_FOLDER}/<name>__rgb.png + <name>__gt_graph.p + data_split.json (Sat2Graph)",
)
_SPLIT_ALIASES = {"val": "validation"}


def _source_crs(geojson: dict) -> str:
    """GeoJSON is lon/lat WGS84 (RFC 7946); old files name their CRS in a `crs` member."""
    name = str(((geojson.get("crs") or {}).get("properties") or {}).get("name", ""))
    if not name or name.endswith("CRS84") or name.endswith("4326"):
        return "EPSG:4326"
    return "EPSG:" + name.rsplit(":", 1)[-1]


def _lines(geojson: dict, report: ReadReport, where: str) -> list[list[tuple[float, float]]]:
    lines = []
    for index, feature in enumerate(geojson.get("features") or []):
        geometry = feature.get("geometry") if isinstance(feature, dict) else None
        geometry = geometry if isinstance(geometry, dict) else {}
        kind, coords = geometry.get("type"), geometry.get("coordinates")
        parts = [coords] if kind == "LineString" else coords if kind == "MultiLineString" else None
        try:
            parsed = [[(float(p[0]), float(p[1])) for p in part] for part in parts]  # drop any z value
        except (TypeError, IndexError, ValueError):
            report.skip(BAD_GEOMETRY, f"{where} feature {index}: {kind!r} geometry is not a (Multi)LineString")
            continue
        lines.extend(parsed)
    return lines


def _to_pixels(lines, image_path: Path, geojson: dict) -> list[list[tuple[float, float]]]:
    import rasterio
    from rasterio.errors import NotGeoreferencedWarning
    from rasterio.warp import transform as reproject

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        with rasterio.open(image_path) as dataset:
            if dataset.crs is None:
                return lines  # no georeference: the file is already in pixel coordinates
            inverse, crs = ~dataset.transform, dataset.crs
    source_crs = _source_crs(geojson)
    out = []
    for line in lines:
        xs, ys = [p[0] for p in line], [p[1] for p in line]
        if rasterio.crs.CRS.from_user_input(source_crs) != crs:
            xs, ys = reproject(source_crs, crs, xs, ys)
        out.append([inverse @ (x, y) for x, y in zip(xs, ys, strict=False)])
    return out


def _sn3_image(geojson_path: Path, image_folder: str) -> Path:
    stem = geojson_path.stem.replace("geojson_roads_speed", image_folder).replace("geojson_roads", image_folder)
    return geojson_path.parent.parent / image_folder / f"{stem}.tif"


def _release2018_image(geojson_path: Path, image_folder: str) -> Path:
    """`<AOI>/geojson/spacenetroads/spacenetroads_AOI_2_Vegas_img1.geojson` -> `<AOI>/RGB-PanSharpen/
    RGB-PanSharpen_AOI_2_Vegas_img1.tif`."""
    stem = geojson_path.stem.removeprefix("spacenetroads_")
    return geojson_path.parent.parent.parent / image_folder / f"{image_folder}_{stem}.tif"


def read_geojson_layout(root: Path, split: str, image_folder: str | None) -> ReadResult:
    base = root / split if (root / split).is_dir() else root
    files = sorted(base.glob("**/geojson_roads/*.geojson")) or sorted(base.glob("**/geojson_roads_speed/*.geojson"))
    image_for, layout, folder = _sn3_image, LAYOUTS[0], image_folder or "PS-RGB"
    if not files:
        files = sorted(base.glob("**/geojson/spacenetroads/*.geojson"))
        image_for, layout, folder = _release2018_image, LAYOUTS[1], image_folder or "RGB-PanSharpen"
    if not files:
        raise DatasetRootError(
            f"SpaceNet: no geojson_roads/*.geojson, no geojson/spacenetroads/*.geojson and no {SAT2GRAPH_FOLDER}/ under {base}"
        )
    report = ReadReport(layout=layout)
    records: list[AnnotationRecord] = []
    for path in files:
        try:
            geojson = parse_json(read_limited(path).decode("utf-8-sig"))
            if not isinstance(geojson, dict) or not isinstance(geojson.get("features", []), list):
                raise ValueError("not a GeoJSON FeatureCollection")
        except (OSError, UnicodeDecodeError, ValueError) as err:
            report.skip(MALFORMED_FILE, f"{path.name}: {err}")
            continue
        image = checked_image(image_for(path, folder), report, path.name)
        if image is None:
            continue
        image_path, width, height = image
        lines = _to_pixels(_lines(geojson, report, path.name), image_path, geojson)
        record = AnnotationRecord("SpaceNet", str(image_path), width, height, "optical", split, image_path.stem)
        record.roads = polyline_graph(lines, width, height)
        records.append(record)
    return finish(records, report)


def _flipped_y(height: int):
    return lambda ab: (ab[1], height - ab[0])  # Sat2Graph keys (a, b): x = b, y = H - a


def read_sat2graph_layout(root: Path, split: str) -> ReadResult:
    split_file = root / "data_split.json"
    try:
        names = load_json(split_file, "SpaceNet")[_SPLIT_ALIASES.get(split, split)]
    except (KeyError, TypeError) as err:
        raise DatasetRootError(f"SpaceNet: cannot read split {split!r} from {split_file}: {err}") from err
    folder = root / SAT2GRAPH_FOLDER
    report = ReadReport(layout=LAYOUTS[2])
    records: list[AnnotationRecord] = []
    for name in names:
        image = checked_image(folder / f"{name}__rgb.png", report, f"{split_file.name} {name}")
        if image is None:
            continue
        image_path, width, height = image
        graph_path = folder / f"{name}__gt_graph.p"
        if not graph_path.is_file():
            report.skip(MISSING_LABEL, f"{name}: {graph_path.name} not found")
            continue
        flip = _flipped_y(height)
        roads = read_graph_pickle(graph_path, flip, width, height, report, name)
        if roads is None:
            continue
        record = AnnotationRecord("SpaceNet", str(image_path), width, height, "optical", split, str(name))
        record.roads = roads
        records.append(record)
    return finish(records, report)


def read_spacenet(root: Path, split: str = "train", image_folder: str | None = None) -> ReadResult:
    """`image_folder`: which imagery the roads are paired with (default PS-RGB, or RGB-PanSharpen in the 2018 layout)."""
    root = require_dir(root, "SpaceNet")
    if (root / SAT2GRAPH_FOLDER).is_dir():
        return read_sat2graph_layout(root, split)
    return read_geojson_layout(root, split, image_folder)
