"""`geopilot image info FILE [--json]`: what GeoPilot will do with an image, without running a model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from geopilot.cli import main

rasterio = pytest.importorskip("rasterio")
from helpers.geo_fixtures import S2_NAMES, distinct_bands, write_tif  # noqa: E402
from rasterio.transform import from_origin  # noqa: E402

KEYS = [
    "width",
    "height",
    "count",
    "dtype",
    "bands",
    "bands_reason",
    "modality",
    "modality_source",
    "crs",
    "bounds_wgs84",
    "gsd_m",
    "nodata",
    "decimation",
]


def info(capsys, *argv) -> dict:
    assert main(["image", "info", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_sentinel2_file(tmp_path, capsys):
    report = info(capsys, str(write_tif(tmp_path / "s2.tif", distinct_bands(13), S2_NAMES, nodata=0)))
    assert list(report) == KEYS
    assert (report["width"], report["height"], report["count"], report["dtype"]) == (50, 40, 13, "uint16")
    assert report["bands"] == [4, 3, 2] and report["bands_reason"] == "band names B04/B03/B02 (Sentinel-2)"
    assert (report["modality"], report["modality_source"]) == ("optical", "band names")
    assert report["crs"] == "EPSG:32633" and report["gsd_m"] == 10.0 and report["nodata"] == 0
    west, south, east, north = report["bounds_wgs84"]
    assert 14.9 < west < east < 15.1 and 37.8 < south < north < 38.0
    assert report["decimation"] == {"factor": 1.0, "picture": [50, 40], "overviews": []}


def test_explicit_bands_and_out_of_range_bands(tmp_path, capsys):
    path = str(write_tif(tmp_path / "s2.tif", distinct_bands(13), S2_NAMES))
    assert info(capsys, path, "--bands", "8,4,3")["bands"] == [8, 4, 3]
    assert main(["image", "info", path, "--bands", "4,3,20"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "band 20 is out of range; the image has 13 bands (1-13)" in err[0]


def test_dual_pol_sar_by_band_names(tmp_path, capsys):
    data = np.random.default_rng(0).normal(-15, 3, (2, 40, 50)).astype(np.float32)
    report = info(capsys, str(write_tif(tmp_path / "s1.tif", data, ["VV", "VH"])))
    assert report["bands"] == [1] and (report["modality"], report["modality_source"]) == ("sar", "band names")


def test_large_scene_is_decimated_and_geographic_gsd_is_in_metres(tmp_path, capsys):
    path = tmp_path / "big.tif"
    profile = {"driver": "GTiff", "width": 6000, "height": 3000, "count": 1, "dtype": "uint8", "tiled": True}
    with rasterio.open(path, "w", crs="EPSG:4326", transform=from_origin(10.0, 50.0, 1e-4, 1e-4), **profile) as dst:
        dst.write(np.full((1, 3000, 6000), 9, np.uint8))
    report = info(capsys, str(path))
    assert report["decimation"]["picture"] == [2048, 1024] and report["decimation"]["factor"] == pytest.approx(
        2.93, 0.01
    )
    assert report["gsd_m"] == pytest.approx((1e-4 * 111_195 * np.cos(np.radians(49.85)) + 1e-4 * 111_195) / 2, rel=1e-3)


def test_no_crs_is_said_once_and_maps_nothing(tmp_path, capsys):
    path = write_tif(tmp_path / "plain.tif", distinct_bands(3), crs=None)
    assert main(["image", "info", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("no CRS") == 1 and "bounds_wgs84     None" in captured.out


def test_a_png(tmp_path, capsys):
    Image.new("RGB", (30, 20), (90, 90, 90)).save(tmp_path / "x.png")
    report = info(capsys, str(tmp_path / "x.png"))
    assert list(report) == KEYS and report["count"] == 3 and report["bands_reason"] == "RGB image"
    assert report["crs"] is None and report["modality"] == "sar"  # grey pixels read as SAR (rule 4)
