"""Which bands make the picture (geopilot.bands), nodata in the stretch, and GeoTIFFs read decimated / in windows."""

from __future__ import annotations

import numpy as np
import pytest

from geopilot.bands import band_name, choose_bands, parse_bands
from geopilot.errors import ImageInputError
from geopilot.image import infer_modality, load_image

rasterio = pytest.importorskip("rasterio")
from helpers.geo_fixtures import S2_NAMES, distinct_bands, write_tif  # noqa: E402
from rasterio.enums import ColorInterp  # noqa: E402


def shows(loaded, data, bands):
    """The picture's channels are the stretch of exactly these bands."""
    from geopilot.image import stretch_to_uint8

    picture = np.asarray(loaded.image)
    return all(np.array_equal(picture[:, :, c], stretch_to_uint8(data[b - 1])) for c, b in enumerate(bands))


def test_sentinel2_band_names_read_as_b04_b03_b02(tmp_path):
    data = distinct_bands(13)
    loaded = load_image(write_tif(tmp_path / "s2.tif", data, S2_NAMES))
    assert loaded.bands.bands == (4, 3, 2) and "B04/B03/B02" in loaded.bands.reason and not loaded.notes
    assert shows(loaded, data, (4, 3, 2)) and infer_modality(loaded) == "optical"


def test_colour_interpretation_wins_over_band_names(tmp_path):
    colours = [ColorInterp.undefined] * 13
    colours[7], colours[4], colours[1] = ColorInterp.red, ColorInterp.green, ColorInterp.blue
    data = distinct_bands(13)
    loaded = load_image(write_tif(tmp_path / "s2.tif", data, S2_NAMES, colorinterp=colours))
    assert loaded.bands.bands == (8, 5, 2) and loaded.bands.reason == "colour interpretation"
    assert shows(loaded, data, (8, 5, 2))


def test_explicit_bands_win_over_colour_interpretation_and_names(tmp_path):
    colours = [ColorInterp.red, ColorInterp.green, ColorInterp.blue] + [ColorInterp.undefined] * 10
    data = distinct_bands(13)
    loaded = load_image(write_tif(tmp_path / "s2.tif", data, S2_NAMES, colorinterp=colours), bands=[12, 8, 4])
    assert loaded.bands.bands == (12, 8, 4) and loaded.bands.reason == "explicit"
    assert shows(loaded, data, (12, 8, 4))


def test_landsat_names_in_any_order(tmp_path):
    names = ["SR_B7", "SR_B6", "SR_B5", "SR_B4", "SR_B3", "SR_B2", "SR_B1"]
    loaded = load_image(write_tif(tmp_path / "l8.tif", distinct_bands(7), names))
    assert loaded.bands.bands == (4, 5, 6) and "Landsat 8/9" in loaded.bands.reason


@pytest.mark.parametrize(
    "descriptions, tags, expected",
    [  # GDAL's SENTINEL2 driver (10 m subdataset: B4, B3, B2, B8), its BANDNAME tags, stack exporters, SAFE L2A stems
        (
            ["B4, central wavelength 665 nm", "B3, central wavelength 560 nm", "B2, central wavelength 490 nm", "B8"],
            {},
            (1, 2, 3),
        ),
        ([None, None, None, None], {1: {"BANDNAME": "B4"}, 2: {"BANDNAME": "B3"}, 3: {"BANDNAME": "B2"}}, (1, 2, 3)),
        (["S2_B8", "S2_B02", "S2_B03", "S2_B04"], {}, (4, 3, 2)),
        (["B08_10m", "B02_10m", "B03_10m", "B04_10m"], {}, (4, 3, 2)),
    ],
)
def test_gdal_safe_and_exporter_spellings(tmp_path, descriptions, tags, expected):
    loaded = load_image(write_tif(tmp_path / "x.tif", distinct_bands(4), descriptions, tags=tags))
    assert loaded.bands.reason.startswith("band names") and loaded.bands.bands == expected


@pytest.mark.parametrize("how", ["descriptions", "tags"])
def test_dual_pol_sar_shows_vv_grey_and_reads_as_sar(tmp_path, how):
    rng = np.random.default_rng(1)
    data = np.stack([rng.normal(-22, 3, (40, 50)), rng.normal(-12, 3, (40, 50))]).astype(np.float32)  # VH, VV in dB
    if how == "descriptions":
        path = write_tif(tmp_path / "s1.tif", data, ["VH", "VV"])
    else:
        path = write_tif(tmp_path / "s1.tif", data, tags={1: {"POLARISATION": "VH"}, 2: {"POLARISATION": "VV"}})
    loaded = load_image(path)
    assert loaded.bands.bands == (2,) and "VV shown" in loaded.bands.reason
    picture = np.asarray(loaded.image)
    assert np.array_equal(picture[:, :, 0], picture[:, :, 2]) and infer_modality(loaded) == "sar"


def test_bands_out_of_range_is_one_clear_error(tmp_path):
    path = write_tif(tmp_path / "s2.tif", distinct_bands(13), S2_NAMES)
    with pytest.raises(
        ImageInputError, match=r"bands 4,3,20: band 20 is out of range; the image has 13 bands \(1-13\)"
    ):
        load_image(path, bands=[4, 3, 20])
    with pytest.raises(ImageInputError, match="3 band numbers"):
        load_image(path, bands=[4, 3])
    with pytest.raises(ValueError, match="comma-separated"):
        parse_bands("4,x,2")


def test_many_unnamed_bands_show_the_first_three_with_a_note(tmp_path):
    loaded = load_image(write_tif(tmp_path / "ms.tif", distinct_bands(5)))
    assert loaded.bands.bands == (1, 2, 3) and loaded.bands.reason == "first three bands"
    assert len(loaded.notes) == 1 and "5 bands without colour interpretation" in loaded.notes[0]


def test_arrays_take_explicit_bands_too():
    array = np.stack([np.full((4, 5), v, np.uint8) for v in (10, 20, 30, 40, 50)], axis=2)
    loaded = load_image(array, bands=[5, 1, 3])
    assert np.asarray(loaded.image)[0, 0].tolist() == [50, 10, 30] and loaded.bands.reason == "explicit"
    assert load_image(array[:, :, :3]).bands.reason == "RGB image"


def test_nodata_and_nan_are_left_out_of_the_stretch_and_shown_black(tmp_path):
    data = np.full((1, 40, 50), 60000, np.uint16)  # nodata 60000 would dominate the 98th percentile
    data[0, :, :25] = np.arange(25 * 40).reshape(40, 25) % 200 + 100
    loaded = load_image(write_tif(tmp_path / "n.tif", data, nodata=60000))
    picture = np.asarray(loaded.image)[:, :, 0]
    assert picture[:, 25:].max() == 0 and picture[:, :25].max() == 255  # valid data spans the whole 8-bit range
    floats = data.astype(np.float32)
    floats[0, :, 25:] = np.nan
    picture_nan = np.asarray(load_image(write_tif(tmp_path / "f.tif", floats)).image)[:, :, 0]
    assert np.array_equal(picture_nan, picture)


def test_tiff_bytes_are_read_by_rasterio_with_their_georeference(tmp_path):
    path = write_tif(tmp_path / "s2.tif", distinct_bands(13), S2_NAMES)
    loaded = load_image(path.read_bytes())
    assert loaded.georef is not None and loaded.georef.crs == "EPSG:32633" and loaded.bands.bands == (4, 3, 2)
    assert loaded.raster.crop((10, 10, 20, 30)).size == (10, 20)


def test_a_large_geotiff_gives_a_small_picture_and_full_resolution_windows(tmp_path):
    data = (np.arange(64 * 5000) % 251).astype(np.uint8).reshape(1, 64, 5000)
    loaded = load_image(write_tif(tmp_path / "wide.tif", data))
    assert loaded.image.size == (2048, 26) and loaded.source_size == (5000, 64)
    window = loaded.raster.crop((1000, 8, 1300, 40))
    assert window.size == (300, 32) and np.array_equal(np.asarray(window)[:, :, 0], data[0, 8:40, 1000:1300])
    assert loaded.scene().size == (5000, 64)  # the tools' whole scene: decimated only to fit max_pixels


def test_windows_use_the_pictures_stretch(tmp_path):
    data = distinct_bands(4)
    loaded = load_image(write_tif(tmp_path / "ms.tif", data))
    window = np.asarray(loaded.raster.crop((5, 5, 30, 25)))
    assert np.array_equal(window, np.asarray(loaded.image)[5:25, 5:30])  # a tile looks like the picture


def test_an_all_nodata_window_reads_as_none(tmp_path):
    data = np.zeros((1, 40, 50), np.uint16)
    data[0, :20] = 500 + np.arange(20 * 50).reshape(20, 50)
    loaded = load_image(write_tif(tmp_path / "half.tif", data, nodata=0))
    assert loaded.raster.crop((0, 20, 50, 40)) is None and loaded.raster.crop((0, 0, 50, 20)) is not None


def test_band_names_are_normalised():
    assert band_name("B4, central wavelength 665 nm") == "B4" and band_name(" sr_b4 ") == "SR_B4"
    assert band_name(None, {"POLARISATION": "VV"}) == "VV" and band_name("") is None
    assert choose_bands(2, names=["HH", "HV"]).bands == (1,)


def test_chat_takes_bands_and_reports_them(tmp_path, make_pilot):
    from helpers.scripted import answer

    path = write_tif(tmp_path / "ms.tif", distinct_bands(5))
    pilot, _ = make_pilot([answer("Fields.")], [answer("Fields.")], [answer("Fields.")])
    guessed = pilot.chat(str(path), "What is this?")
    assert guessed.bands == [1, 2, 3] and guessed.bands_reason == "first three bands"
    assert len(guessed.image_notes) == 1 and "bands=[r, g, b]" in guessed.image_notes[0]
    chosen = pilot.chat(str(path), "What is this?", bands=[5, 4, 3])
    assert chosen.bands == [5, 4, 3] and chosen.bands_reason == "explicit" and chosen.image_notes == []
    (batched,) = pilot.chat_batch([{"image": str(path), "query": "What is this?", "bands": [2]}])
    assert batched.bands == [2]
    with pytest.raises(ImageInputError, match="band 9 is out of range"):
        pilot.chat(str(path), "What is this?", bands=[9, 4, 3])


def test_chunked_decimated_reads_give_the_pixels_of_one_read(tmp_path, monkeypatch):
    import geopilot.raster

    data = np.random.default_rng(3).integers(0, 60000, (3, 300, 500), dtype=np.uint16)
    path = write_tif(tmp_path / "c.tif", data, nodata=7)
    whole = load_image(path, max_pixels=200 * 200)
    monkeypatch.setattr(geopilot.raster, "CHUNK_SOURCE_PX", 64)  # ~9 x 5 chunks instead of one read
    chunked = load_image(path, max_pixels=200 * 200)
    assert whole.image.size == (200, 120) and np.array_equal(np.asarray(whole.image), np.asarray(chunked.image))
    assert whole.raster.stretch == chunked.raster.stretch
