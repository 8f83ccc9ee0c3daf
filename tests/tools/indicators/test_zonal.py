"""Zonal statistics against an independent full-raster computation (shapely point-in-polygon on every pixel
centre, plain numpy), for every layer and every area of the synthetic region."""

from __future__ import annotations

import numpy as np
import pytest
from shapely.geometry import Polygon, box

from geopilot.data_gen.synthetic.region import HEIGHT, WIDTH, px_to_xy
from geopilot.tools.indicators.areas import AreaIndex, AreaNotFound, normalise_name
from geopilot.tools.indicators.catalog import load_catalog
from geopilot.tools.indicators.zonal import ZonalError, zonal_stats


def _stats(catalog, layer, area, **kwargs):
    stats = zonal_stats(
        layer.raster_path(catalog.root), area.geometry, area.crs, layer.kind == "categorical", layer.nodata, **kwargs
    )
    if layer.kind == "categorical":
        return stats, {name: stats.class_shares().get(value, 0.0) for value, name in layer.classes.items()}
    return stats, stats.summary()


@pytest.mark.parametrize("window_pixels", [4_000_000, 7_000])  # one window, and many small ones
def test_every_area_and_layer_equals_full_raster_numpy(region, truth, window_pixels):
    catalog = load_catalog(region / "catalog.yaml")
    index = AreaIndex(catalog)
    compared = 0
    for level in index.levels():
        for area in index.all(level):
            expected = truth[level][area.name]
            for layer in catalog.layers:
                if layer.display_only or layer.dates:
                    continue
                stats, got = _stats(catalog, layer, area, max_window_pixels=window_pixels)
                for key, value in expected[layer.id].items():
                    assert got[key] == pytest.approx(value, abs=1e-6), (level, area.name, layer.id, key)
                    compared += 1
                assert stats.outside_raster_pct == pytest.approx(expected["outside_raster_pct"], abs=1e-6)
    assert compared > 200


def test_tile_boundary_and_partly_outside_polygons_are_covered(region, truth):
    catalog = load_catalog(region / "catalog.yaml")
    index = AreaIndex(catalog)
    edges_x = [px_to_xy(col, 0)[0] for col in (256, 512)]  # the COGs' 256-px tile boundaries
    edge_y = px_to_xy(0, 256)[1]
    crossing = [
        a.name
        for a in index.all("municipality")
        if any(a.geometry.bounds[0] < x < a.geometry.bounds[2] for x in edges_x)
        or a.geometry.bounds[1] < edge_y < a.geometry.bounds[3]
    ]
    assert len(crossing) >= 3, crossing  # each is checked against the truth above
    assert truth["municipality"]["Lagoa do Açor"]["outside_raster_pct"] > 10
    # the province file is WGS 84 GeoJSON: reprojected to the raster's EPSG:3035 before rasterising
    assert (
        "4326" in index.find("Serra do Norte", "province").crs or "WGS" in index.find("Serra do Norte", "province").crs
    )


def test_enormous_polygon_is_read_window_by_window(region):
    catalog = load_catalog(region / "catalog.yaml")
    layer = catalog.layer("land_cover")
    huge = box(-1e7, -1e7, 1e7, 1e7)  # far larger than the raster: clipped, then read in small windows
    stats = zonal_stats(layer.raster_path(catalog.root), huge, "EPSG:3035", True, layer.nodata, max_window_pixels=5_000)
    import rasterio

    with rasterio.open(layer.raster_path(catalog.root)) as dataset:
        array = dataset.read(1)
    valid = array[array != 0]
    for value, share in stats.class_shares().items():
        assert share == pytest.approx(100.0 * np.count_nonzero(valid == value) / valid.size, abs=1e-9)
    assert stats.outside_raster_pct > 99.9


def test_polygon_outside_the_raster_and_empty_polygons_are_clear_errors(region):
    catalog = load_catalog(region / "catalog.yaml")
    path = catalog.layer("land_cover").raster_path(catalog.root)
    x, y = px_to_xy(WIDTH + 500, HEIGHT + 500)
    with pytest.raises(ZonalError, match="outside the raster"):
        zonal_stats(path, box(x, y - 1000, x + 1000, y), "EPSG:3035", True)
    with pytest.raises(ZonalError, match="empty"):
        zonal_stats(path, Polygon(), "EPSG:3035", True)


def test_self_intersecting_polygon_is_repaired_not_a_crash(region):
    catalog = load_catalog(region / "catalog.yaml")
    path = catalog.layer("erosion_probability").raster_path(catalog.root)
    (ax, ay), (bx, by) = px_to_xy(10, 10), px_to_xy(100, 100)
    bowtie = Polygon([(ax, ay), (bx, by), (bx, ay), (ax, by)])
    assert not bowtie.is_valid
    stats = zonal_stats(path, bowtie, "EPSG:3035", False)
    assert stats.pixels > 1000


def test_names_match_without_accents_or_case_and_never_guess(region):
    index = AreaIndex(load_catalog(region / "catalog.yaml"))
    assert index.find("ANORA DE RIOS", "municipality").name == "Añora de Ríos"
    assert index.find("LUS-S-2", "municipality").name == "Braçal"
    assert normalise_name("  São  Tomé ") == "sao tome"
    with pytest.raises(AreaNotFound, match="closest names: Braçal"):
        index.find("Bracall", "municipality")
    with pytest.raises(AreaNotFound, match="unknown level"):
        index.all("parish")


@pytest.mark.parametrize(
    ("typed", "first"),
    [("Anora", "Añora de Ríos"), ("Bracall", "Braçal"), ("rios", "Añora de Ríos"), ("Sao Tome", "São Tomé da Serra")],
)
def test_an_unknown_name_lists_the_closest_names(region, typed, first):
    """docs/indicators.md: an unknown name is an error listing the closest names ("Anora" gave no hint before)."""
    index = AreaIndex(load_catalog(region / "catalog.yaml"))
    with pytest.raises(AreaNotFound) as raised:
        index.find(typed, "municipality")
    listed = str(raised.value).split("; closest names: ")[1].split(", ")
    assert listed[0] == first and len(listed) == 3
