"""`geopilot geo export` under hostile input (issue 37): every case is exit 2, one line on stderr, no traceback, in
bounded time and memory (a fresh process, measured), and nothing the user owns is overwritten or left half written.
The inputs are tiny files that claim huge sizes: a 100000 x 100000 sparse GeoTIFF, masks claiming 10^10 pixels.
Each case starts a process (~2 s here), so the variations of a case already covered are marked slow."""

from __future__ import annotations

import json
import os

import pytest
from helpers.hostile import not_a_small_file, run_cli

rasterio = pytest.importorskip("rasterio")
pytest.importorskip("pyogrio")
from helpers.geo_fixtures import write_scene  # noqa: E402
from rasterio.transform import from_origin  # noqa: E402

HUGE = 100_000  # a side: 10^10 pixels claimed


def huge_scene(path):
    """A 100000 x 100000 GeoTIFF of a few hundred KB on disk (no block written)."""
    profile = {"driver": "GTiff", "width": HUGE, "height": HUGE, "count": 1, "dtype": "uint8", "tiled": True}
    transform = from_origin(500_000, 4_200_000, 10, 10)
    with rasterio.open(path, "w", crs="EPSG:32633", transform=transform, sparse_ok=True, **profile):
        pass
    return path


def segments(size, counts="0"):
    return {"segments": [{"label": "water", "area": 0.5, "mask": {"size": size, "counts": counts}}]}


def detection(**fields):
    return {"detections": [{"label": "ship", "box": [0.1, 0.1, 0.2, 0.2], **fields}]}


@pytest.fixture
def scene(tmp_path):
    return write_scene(tmp_path / "scene.tif")  # 700 x 500, UTM


def export(tmp_path, image, output, out, *extra):
    return run_cli(["geo", "export", "--image", image, "--tool-output", output, "--out", out, *extra], tmp_path)


def saved(tmp_path, data, name="output.json") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


@pytest.mark.parametrize("suffix", [pytest.param(".geojson", marks=pytest.mark.slow), ".tif"])
def test_a_mask_claiming_ten_billion_pixels_is_refused_before_decoding(tmp_path, suffix):
    image = huge_scene(tmp_path / "huge.tif")
    line = export(tmp_path, image, saved(tmp_path, segments([HUGE, HUGE])), tmp_path / f"o{suffix}", "--class-polygons")
    assert "over the limit of 100,000,000 pixels" in line.refused()
    assert not (tmp_path / f"o{suffix}").exists()


def test_the_pixel_limit_is_configurable(tmp_path, scene):
    line = export(tmp_path, scene, saved(tmp_path, segments([500, 700])), tmp_path / "o.tif", "--max-pixels", "1000")
    assert "over the limit of 1,000 pixels" in line.refused()


@pytest.mark.parametrize(
    ("size", "counts", "message"),
    [
        ([HUGE, HUGE], "0", "does not fit the 500x700 image"),  # a mask must be of its image
        pytest.param([-5, 3], "0", "greater than or equal to 0", marks=pytest.mark.slow),
        pytest.param([500, 700], "zzzz", "not a COCO RLE character", marks=pytest.mark.slow),
        pytest.param([500, 700], "9", "cover 9 pixels", marks=pytest.mark.slow),  # pycocotools reads past the runs
        ([500, 700], "P`0" * 1000, "cover"),  # runs past the size: pycocotools would write past its buffer
        pytest.param([500, 700], "1O", "negative run", marks=pytest.mark.slow),
        pytest.param([500, 700], "\u00ff", "not a COCO RLE character", marks=pytest.mark.slow),
    ],
)
@pytest.mark.parametrize("out", ["o.tif", pytest.param("o.geojson", marks=pytest.mark.slow)])
def test_bad_masks_are_one_line(tmp_path, scene, size, counts, message, out):
    line = export(tmp_path, scene, saved(tmp_path, segments(size, counts)), tmp_path / out, "--class-polygons")
    assert message in line.refused(), line


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (detection(pixel_box=[float("nan"), 1, 2, 3]), "finite number"),
        pytest.param(detection(pixel_polygon=[[0, 0], [1, float("inf")], [2, 2]]), "finite", marks=pytest.mark.slow),
        (detection(box=[0.1, 0.1, 1.5, 0.2]), "outside [0, 1]"),  # a box outside [0, 1]
        pytest.param(detection(box=[-0.5, 0.1, 0.2, 0.2]), "outside [0, 1]", marks=pytest.mark.slow),
        ("[" * 100_000 + "]" * 100_000, "nested too deep"),
        pytest.param('{"detections": ' + "[" * 50_000 + "]" * 50_000 + "}", "too deep", marks=pytest.mark.slow),
        pytest.param("{not json", "cannot be read as JSON", marks=pytest.mark.slow),
        pytest.param(b"\xff\xfe\x00garbage", "cannot be read as JSON", marks=pytest.mark.slow),
    ],
)
def test_bad_tool_outputs_are_one_line(tmp_path, scene, output, message):
    if isinstance(output, bytes):
        (tmp_path / "output.json").write_bytes(output)
        path = str(tmp_path / "output.json")
    else:
        path = saved(tmp_path, json.dumps(output) if isinstance(output, dict) else output)
    assert message in export(tmp_path, scene, path, tmp_path / "o.geojson").refused()


def test_a_long_input_is_echoed_at_most_200_characters(tmp_path, scene):
    output = detection(box=[0.1, 0.1, 0.2, 0.2], **{"x" * 100_000: 1})
    line = export(tmp_path, scene, saved(tmp_path, output), tmp_path / "o.geojson").refused()
    assert "unknown key" in line and len(line) < 600


@pytest.mark.parametrize(
    "target", ["image", "image link", pytest.param("output", marks=pytest.mark.slow), "output link"]
)
def test_out_never_writes_over_an_input(tmp_path, scene, target):
    output = saved(tmp_path, detection())
    source = scene if target.startswith("image") else tmp_path / "output.json"
    out = source
    if target.endswith("link"):
        out = tmp_path / f"link{source.suffix if hasattr(source, 'suffix') else '.json'}"
        os.symlink(source, out)
    before = (tmp_path / "scene.tif").read_bytes(), (tmp_path / "output.json").read_bytes()
    line = export(tmp_path, scene, output, out).refused()
    assert "refusing to write over it" in line
    assert ((tmp_path / "scene.tif").read_bytes(), (tmp_path / "output.json").read_bytes()) == before


def test_the_same_file_given_as_image_and_output_is_refused(tmp_path, scene):
    assert "same file" in export(tmp_path, scene, scene, tmp_path / "o.geojson").refused()


@pytest.mark.parametrize(
    "kind", ["fifo", "dev_zero", "sparse", pytest.param("folder", marks=pytest.mark.slow), "missing"]
)
def test_tool_outputs_that_are_not_small_regular_files(tmp_path, scene, kind):
    given = not_a_small_file(tmp_path / "output.json", kind)
    line = export(tmp_path, scene, given, tmp_path / "o.geojson").refused()
    expected = {
        "fifo": "is a FIFO",
        "dev_zero": "is a character device",
        "sparse": "over the limit of",
        "folder": "is a directory",
        "missing": "not found",
    }[kind]
    assert expected in line


@pytest.mark.slow
def test_an_image_that_is_a_fifo_is_refused(tmp_path):
    os.mkfifo(tmp_path / "scene.tif")
    line = export(tmp_path, tmp_path / "scene.tif", saved(tmp_path, detection()), tmp_path / "o.geojson").refused()
    assert "is a FIFO" in line


@pytest.mark.parametrize(
    ("out", "message"), [("no/such/o.geojson", "does not exist"), ("file/o.geojson", "not a folder")]
)
def test_out_folders_that_cannot_hold_the_file(tmp_path, scene, out, message):
    (tmp_path / "file").write_text("a file, not a folder")
    assert message in export(tmp_path, scene, saved(tmp_path, detection()), tmp_path / out).refused()


def test_a_failed_export_leaves_no_half_file(tmp_path, scene):
    good = segments([500, 700], "0`ie:")["segments"][0]  # every pixel water: a valid mask
    bad = {"label": "field", "area": 0.5, "mask": {"size": [500, 700], "counts": "9"}}
    (tmp_path / "o.tif").write_bytes(b"the user's earlier file")
    line = export(tmp_path, scene, saved(tmp_path, {"segments": [good, bad]}), tmp_path / "o.tif").refused()
    assert "cover 9 pixels" in line
    assert (tmp_path / "o.tif").read_bytes() == b"the user's earlier file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.tif", "output.json", "scene.tif"]
