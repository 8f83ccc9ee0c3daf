"""`geopilot synth-region --out DIR`: a synthetic two-country region whose statistics are known exactly.

Writes Cloud-Optimised GeoTIFFs (EPSG:3035, 100 m pixels, 256-px tiles) and administrative areas (GeoPackage
in EPSG:3035, provinces also as GeoJSON in WGS 84 so one level needs reprojection), a `catalog.yaml`, and
`truth.json`: every layer's statistics per area computed independently of the tools, by testing every pixel
centre against the polygon with shapely over the full raster. The traps a benchmark needs are built in:
a display-only layer, a dated layer only the time-series tool covers whole, municipalities with accented names,
municipalities that cross the raster's east edge, and pairs of municipalities with near-equal class shares.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

PIXEL_M = 100.0
WIDTH, HEIGHT = 640, 448  # 2.5 x 1.75 tiles of 256 px
ORIGIN = (3_500_000.0, 2_100_000.0)  # top-left corner in EPSG:3035 metres
EAST_OVERHANG_PX = 48  # the region reaches past the raster's east edge
CRS = "EPSG:3035"
SEED = 20261201

COUNTRIES = {"VAL": "Valdoria", "LUS": "Lusavia"}
PROVINCES = {  # id -> (name, country id)
    "VAL-N": ("Montaña Alta", "VAL"),
    "VAL-S": ("Ribera Baja", "VAL"),
    "LUS-N": ("Serra do Norte", "LUS"),
    "LUS-S": ("Vale do Sul", "LUS"),
}
MUNICIPALITIES = {  # province id -> three names, west to east
    "VAL-N": ["Añora de Ríos", "Vilanova de Órrega", "Zumárraga Berri"],
    "VAL-S": ["Cáceres Alto", "San Ginés", "Mondoñedo Novo"],
    "LUS-N": ["São Tomé da Serra", "Évora Nova", "Lagoa do Açor"],
    "LUS-S": ["Guimarães Velho", "Braçal", "Ponte da Lezíria"],
}
LAND_COVER = {1: "forest", 2: "cropland", 3: "grassland", 4: "urban", 5: "water"}
CO2 = {1: "eligible", 2: "eligible with conditions", 3: "not eligible"}
NDVI_DATES = ["2021", "2022", "2023", "2024"]
NEAR_EQUAL_PAIRS = [(0, 1), (4, 5), (6, 7), (10, 11)]  # municipality indices whose forest shares differ slightly


def px_to_xy(col: float, row: float) -> tuple[float, float]:
    return ORIGIN[0] + col * PIXEL_M, ORIGIN[1] - row * PIXEL_M


def _polygon(points_px):
    from shapely.geometry import Polygon

    return Polygon([px_to_xy(c, r) for c, r in points_px])


def build_areas():
    """Countries, provinces and municipalities as shapely polygons (EPSG:3035), split along slanted lines."""
    east = WIDTH + EAST_OVERHANG_PX

    def border(row):  # the country border: a column that drifts east going south
        return 300 + 40 * row / HEIGHT

    def west_edge(row):
        return 0.0

    def east_edge(row):
        return float(east)

    def top(col):
        return 0.0

    def bottom(col):
        return float(HEIGHT)

    province_cut = {"VAL": lambda col: 200 + 30 * col / east, "LUS": lambda col: 236 - 24 * col / east}
    countries = {
        "VAL": _polygon(_province_ring(west_edge, border, top, bottom)),
        "LUS": _polygon(_province_ring(border, east_edge, top, bottom)),
    }
    provinces, municipalities = {}, []
    for pid, (_, country) in PROVINCES.items():
        left, right = (west_edge, border) if country == "VAL" else (border, east_edge)
        upper, lower = (top, province_cut[country]) if pid.endswith("-N") else (province_cut[country], bottom)
        provinces[pid] = _polygon(_province_ring(left, right, upper, lower))
        for k, name in enumerate(MUNICIPALITIES[pid]):
            municipalities.append((pid, k, name, _municipality(provinces[pid], k)))
    return countries, provinces, municipalities


def _province_ring(left, right, top_row, bottom_row):
    """The quadrilateral between two slanted columns and two slanted rows (pixel coordinates)."""
    corners = []
    for col_of, row_of in ((left, top_row), (right, top_row), (right, bottom_row), (left, bottom_row)):
        col = col_of(0)
        for _ in range(20):  # fixed point: the column depends on the row and the row on the column
            row = row_of(col)
            col = col_of(row)
        corners.append((col, row))
    return corners


def _municipality(province, k: int):
    """Third k (west to east) of a province, cut along two slanted lines."""
    from shapely.geometry import LineString
    from shapely.ops import split

    minx, miny, maxx, maxy = province.bounds
    pieces = [province]
    for fraction, lean in ((1 / 3, 0.08), (2 / 3, -0.06)):
        x = minx + fraction * (maxx - minx)
        line = LineString([(x - lean * (maxy - miny), maxy + 1), (x + lean * (maxy - miny), miny - 1)])
        last = pieces.pop()
        parts = sorted(split(last, line).geoms, key=lambda g: g.centroid.x)
        pieces.extend(parts)
    return pieces[k]


def pixel_centres() -> tuple[np.ndarray, np.ndarray]:
    cols, rows = np.meshgrid(np.arange(WIDTH) + 0.5, np.arange(HEIGHT) + 0.5)
    x, y = px_to_xy(cols, rows)
    return x, y


def label_raster(polygons) -> np.ndarray:
    """Index of the polygon holding each pixel centre (-1 for none), by shapely point-in-polygon tests."""
    import shapely

    x, y = pixel_centres()
    labels = np.full((HEIGHT, WIDTH), -1, dtype=np.int32)
    for i, polygon in enumerate(polygons):
        labels[shapely.contains_xy(polygon, x, y)] = i
    return labels


def make_layers(labels: np.ndarray, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    probs = rng.dirichlet(np.full(5, 2.0), size=n)
    for a, b in NEAR_EQUAL_PAIRS:  # b copies a, with one point moved from cropland to forest
        probs[b] = probs[a]
        probs[b, 0] += 0.01
        probs[b, 1] = max(probs[b, 1] - 0.01, 0.0)
        probs[b] /= probs[b].sum()
    land = np.zeros((HEIGHT, WIDTH), np.uint8)
    erosion = np.full((HEIGHT, WIDTH), -9999.0, np.float32)
    co2 = np.full((HEIGHT, WIDTH), 255, np.uint8)
    base_erosion = rng.uniform(0.05, 0.8, size=n)
    co2_probs = rng.dirichlet(np.full(3, 1.5), size=n)
    for m in range(n):
        where = labels == m
        count = int(where.sum())
        land[where] = rng.choice(np.arange(1, 6), size=count, p=probs[m])
        erosion[where] = np.clip(base_erosion[m] + rng.normal(0, 0.1, count), 0, 1)
        co2[where] = rng.choice(np.arange(1, 4), size=count, p=co2_probs[m])
    land[rng.random(land.shape) < 0.01] = 0  # scattered nodata
    erosion[rng.random(erosion.shape) < 0.005] = -9999.0
    ndvi_base = rng.uniform(0.2, 0.7, size=n)
    ndvi_trend = rng.uniform(-0.05, 0.05, size=n)
    layers = {"land_cover": land, "erosion_probability": erosion, "co2_suitability": co2}
    for t, date in enumerate(NDVI_DATES):
        ndvi = np.full((HEIGHT, WIDTH), np.nan, np.float32)
        for m in range(n):
            where = labels == m
            ndvi[where] = np.clip(ndvi_base[m] + t * ndvi_trend[m] + rng.normal(0, 0.05, int(where.sum())), -1, 1)
        layers[f"ndvi_{date}"] = ndvi
    rows, cols = np.mgrid[0:HEIGHT, 0:WIDTH]
    layers["hillshade"] = (127 + 100 * np.sin(cols / 37.0) * np.cos(rows / 23.0)).astype(np.uint8)
    return layers


NODATA = {"land_cover": 0, "co2_suitability": 255, "erosion_probability": -9999.0, "hillshade": None}


def write_cog(path: Path, array: np.ndarray, nodata: float | None) -> None:
    import rasterio
    from rasterio.transform import from_origin

    profile = {
        "driver": "COG",
        "width": WIDTH,
        "height": HEIGHT,
        "count": 1,
        "dtype": array.dtype.name,
        "crs": CRS,
        "transform": from_origin(ORIGIN[0], ORIGIN[1], PIXEL_M, PIXEL_M),
        "blocksize": 256,
        "compress": "deflate",
    }
    if nodata is not None:
        profile["nodata"] = nodata
    path.parent.mkdir(parents=True, exist_ok=True)
    with rasterio.open(path, "w", **profile) as out:
        out.write(array, 1)


def write_areas(out: Path, countries, provinces, municipalities) -> None:
    import pyogrio.raw
    import shapely
    from rasterio.crs import CRS as RasterioCRS
    from rasterio.warp import transform_geom
    from shapely.geometry import mapping, shape

    gpkg = out / "areas" / "region.gpkg"
    gpkg.parent.mkdir(parents=True, exist_ok=True)
    if gpkg.exists():
        gpkg.unlink()

    def write(path, layer, geoms, fields: dict[str, list[str]], crs, driver):
        pyogrio.raw.write(
            path,
            shapely.to_wkb(np.array(geoms, dtype=object)),
            [np.array(v, dtype=object) for v in fields.values()],
            list(fields),
            layer=layer,
            driver=driver,
            geometry_type="Polygon",
            crs=crs,
            append=path.exists(),
        )

    write(
        gpkg,
        "countries",
        list(countries.values()),
        {"code": list(countries), "name": [COUNTRIES[c] for c in countries]},
        CRS,
        "GPKG",
    )
    write(
        gpkg,
        "provinces",
        list(provinces.values()),
        {
            "code": list(provinces),
            "name": [PROVINCES[p][0] for p in provinces],
            "country": [COUNTRIES[PROVINCES[p][1]] for p in provinces],
        },
        CRS,
        "GPKG",
    )
    write(
        gpkg,
        "municipalities",
        [m[3] for m in municipalities],
        {
            "code": [f"{pid}-{k + 1}" for pid, k, _, _ in municipalities],
            "name": [m[2] for m in municipalities],
            "province": [PROVINCES[pid][0] for pid, _, _, _ in municipalities],
        },
        CRS,
        "GPKG",
    )
    wgs84 = [
        shape(transform_geom(RasterioCRS.from_user_input(CRS), "EPSG:4326", mapping(p))) for p in provinces.values()
    ]
    geojson = out / "areas" / "provinces_wgs84.geojson"
    if geojson.exists():
        geojson.unlink()
    write(
        geojson,
        None,
        wgs84,
        {
            "code": list(provinces),
            "name": [PROVINCES[p][0] for p in provinces],
            "country": [COUNTRIES[PROVINCES[p][1]] for p in provinces],
        },
        "EPSG:4326",
        "GeoJSON",
    )


CATALOG = {
    "layers": [
        {
            "id": "land_cover",
            "path": "rasters/land_cover.tif",
            "kind": "categorical",
            "classes": LAND_COVER,
            "description": "Land cover classes (forest, cropland, grassland, urban, water)",
        },
        {
            "id": "co2_suitability",
            "path": "rasters/co2_suitability.tif",
            "kind": "categorical",
            "classes": CO2,
            "description": "Eligibility of land for CO2 afforestation credits",
        },
        {
            "id": "erosion_probability",
            "path": "rasters/erosion_probability.tif",
            "kind": "continuous",
            "units": "probability",
            "description": "Probability of soil erosion (0-1)",
        },
        {
            "id": "ndvi",
            "path": "rasters/ndvi_{date}.tif",
            "kind": "continuous",
            "units": "NDVI",
            "dates": NDVI_DATES,
            "description": "Mean summer NDVI, one raster per year",
        },
        {
            "id": "hillshade",
            "path": "rasters/hillshade.tif",
            "kind": "continuous",
            "display_only": True,
            "description": "Hillshade relief for display under the other layers",
        },
    ],
    "areas": [
        {
            "level": "country",
            "path": "areas/region.gpkg",
            "layer": "countries",
            "name_field": "name",
            "id_field": "code",
        },
        {
            "level": "province",
            "path": "areas/provinces_wgs84.geojson",
            "name_field": "name",
            "id_field": "code",
            "parent_field": "country",
        },
        {
            "level": "municipality",
            "path": "areas/region.gpkg",
            "layer": "municipalities",
            "name_field": "name",
            "id_field": "code",
            "parent_field": "province",
        },
    ],
}


def truth_for(array: np.ndarray, mask: np.ndarray, categorical: bool, classes: dict[int, str], nodata) -> dict:
    """Independent reference statistics: plain numpy over the pixels whose centre lies in the polygon."""
    valid = mask.copy()
    if nodata is not None:
        valid &= array != nodata
    if np.issubdtype(array.dtype, np.floating):
        valid &= ~np.isnan(array)
    values = array[valid]
    if categorical:
        return {name: 100.0 * float((values == v).sum()) / values.size for v, name in classes.items()}
    as_float = values.astype(np.float64)
    return {
        "mean": float(as_float.mean()),
        "min": float(as_float.min()),
        "max": float(as_float.max()),
        "std": float(as_float.std()),
        "count": int(values.size),
    }


def synth_region(out: Path, seed: int = SEED) -> Path:
    """Write the region under `out`; returns the catalogue path."""
    import shapely
    import yaml

    rng = np.random.default_rng(seed)
    countries, provinces, municipalities = build_areas()
    labels = label_raster([m[3] for m in municipalities])
    layers = make_layers(labels, len(municipalities), rng)
    for name, array in layers.items():
        write_cog(out / "rasters" / f"{name}.tif", array, NODATA.get(name, np.nan if name.startswith("ndvi") else None))
    write_areas(out, countries, provinces, municipalities)
    (out / "catalog.yaml").write_text(yaml.safe_dump(CATALOG, sort_keys=False, allow_unicode=True), encoding="utf-8")
    x, y = pixel_centres()
    areas = [("country", COUNTRIES[c], c, g) for c, g in countries.items()]
    areas += [("province", PROVINCES[p][0], p, g) for p, g in provinces.items()]
    areas += [("municipality", name, f"{pid}-{k + 1}", g) for pid, k, name, g in municipalities]
    truth: dict = {}
    for level, name, code, geometry in areas:
        mask = shapely.contains_xy(geometry, x, y)
        entry = {
            "id": code,
            "outside_raster_pct": 100.0 * (1 - geometry.intersection(_raster_box()).area / geometry.area),
        }
        for layer in CATALOG["layers"]:
            if layer.get("display_only"):
                continue
            categorical = layer["kind"] == "categorical"
            if layer.get("dates"):
                entry[layer["id"]] = {d: truth_for(layers[f"ndvi_{d}"], mask, False, {}, None) for d in layer["dates"]}
            else:
                nodata = NODATA[layer["id"]]
                entry[layer["id"]] = truth_for(layers[layer["id"]], mask, categorical, layer.get("classes", {}), nodata)
        truth.setdefault(level, {})[name] = entry
    (out / "truth.json").write_text(json.dumps(truth, ensure_ascii=False, indent=1), encoding="utf-8")
    return out / "catalog.yaml"


def _raster_box():
    from shapely.geometry import box

    x0, y0 = px_to_xy(0, HEIGHT)
    x1, y1 = px_to_xy(WIDTH, 0)
    return box(x0, y0, x1, y1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="folder for rasters/, areas/, catalog.yaml and truth.json")
    parser.add_argument("--seed", type=int, default=SEED, help="seed of the synthetic region")


def run(args: argparse.Namespace) -> int:
    catalog = synth_region(Path(args.out), args.seed)
    print(f"wrote {catalog} ({len(CATALOG['layers'])} layers, {sum(map(len, MUNICIPALITIES.values()))} municipalities)")
    return 0
