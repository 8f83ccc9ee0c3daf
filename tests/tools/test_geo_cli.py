"""`geopilot tools run ... --out DIR` on a GeoTIFF writes the geo files beside output.json; `geopilot geo export`
turns a saved output into .geojson / .gpkg / .tif; bad input is one line and exit 2."""

from __future__ import annotations

import json

import numpy as np
import pytest

from geopilot.cli import main
from geopilot.tool_output import ToolOutput
from geopilot.tool_protocol import ToolRegistry
from geopilot.tools.adapters import DetectorAdapter, DetectorOptions
from geopilot.tools.canonical import segment_class
from geopilot.tools.geo import rfc7946_problems
from geopilot.tools.task_tools import TASKS_BY_NAME, TaskTool

rasterio = pytest.importorskip("rasterio")
pyogrio = pytest.importorskip("pyogrio")
from helpers.geo_fixtures import S2_NAMES, BrightSpotDetector, distinct_bands, write_scene, write_tif  # noqa: E402


class HalvesSegmenter:
    """segment_semantic: the top half is water, the bottom half field (masks of the scene the tool is given)."""

    def run(self, tool, image, params) -> ToolOutput:
        width, height = image.scene_size
        top = np.zeros((height, width), dtype=bool)
        top[: height // 2] = True
        return ToolOutput(segments=[segment_class("water", top), segment_class("field", ~top)])


@pytest.fixture
def fake_tools(monkeypatch):
    options = DetectorOptions(tile_size=256, tile_overlap=64, score_threshold=0.0)
    tools = [
        TaskTool(TASKS_BY_NAME["detect_objects"], DetectorAdapter(BrightSpotDetector(), options), "fake", 10**9),
        TaskTool(TASKS_BY_NAME["segment_semantic"], HalvesSegmenter(), "fake", 10**9),
    ]
    monkeypatch.setattr("geopilot.tools.registry.build_registry", lambda *a, **k: ToolRegistry(tools))


def test_tools_run_out_writes_geojson_and_geopackage_beside_output_json(tmp_path, fake_tools, capsys):
    scene, out = write_scene(tmp_path / "scene.tif"), tmp_path / "out"
    params = '{"categories": ["ship"]}'
    assert main(["tools", "run", "detect_objects", "--image", str(scene), "--params", params, "--out", str(out)]) == 0
    report = json.loads((out / "output.json").read_text())
    assert [f["path"] for f in report["geo_files"]] == [str(out / "output.geojson"), str(out / "output.gpkg")]
    assert report["image"]["bands"] == [1, 2, 3] and report["image"]["bands_reason"] == "colour interpretation"
    collection = json.loads((out / "output.geojson").read_text())
    assert len(collection["features"]) == 1 and rfc7946_problems(collection) == []
    assert collection == report["output"]["geojson"]
    assert pyogrio.raw.read(out / "output.gpkg", layer="detections")[0]["crs"] == "EPSG:32633"
    assert "geo: " in capsys.readouterr().out

    exported = tmp_path / "again.geojson"
    args = ["geo", "export", "--image", str(scene), "--tool-output", str(out / "output.json"), "--out", str(exported)]
    assert main(args) == 0 and json.loads(exported.read_text()) == collection


def test_segment_semantic_writes_the_class_cog(tmp_path, fake_tools):
    scene, out = write_scene(tmp_path / "scene.tif"), tmp_path / "out"
    params = '{"classes": ["water", "field"]}'
    args = ["tools", "run", "segment_semantic", "--image", str(scene), "--params", params, "--out", str(out)]
    assert main([*args, "--class-polygons"]) == 0
    with rasterio.open(out / "classes.tif") as classes, rasterio.open(scene) as source:
        assert classes.transform == source.transform and classes.tags()["CLASS_2"] == "field"
        assert set(np.unique(classes.read(1))) == {1, 2}
    layers = [name for name, _ in pyogrio.list_layers(out / "output.gpkg")]
    assert layers == ["classes"]


@pytest.mark.parametrize(
    ("suffix", "message"),
    [(".shp", "unknown format"), (".tif", "no semantic class masks")],
)
def test_geo_export_bad_input_is_one_line_exit_2(tmp_path, suffix, message, capsys):
    scene = write_scene(tmp_path / "scene.tif")
    saved = tmp_path / "output.json"
    saved.write_text(json.dumps({"tool": "detect_objects", "output": ToolOutput().model_dump(mode="json")}))
    args = ["geo", "export", "--image", str(scene), "--tool-output", str(saved), "--out", str(tmp_path / f"x{suffix}")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_geo_export_of_an_image_without_crs_says_pixel_outputs_only(tmp_path, capsys):
    scene = write_scene(tmp_path / "scene.tif", crs=None)
    saved = tmp_path / "output.json"
    saved.write_text(ToolOutput().model_dump_json())
    args = ["geo", "export", "--image", str(scene), "--tool-output", str(saved), "--out", str(tmp_path / "x.geojson")]
    assert main(args) == 2 and "pixel coordinates only" in capsys.readouterr().err
    saved.write_text("{not json")
    assert main(args) == 2 and "cannot be read as JSON" in capsys.readouterr().err


def test_tools_run_bands_out_of_range_is_one_line_exit_2(tmp_path, fake_tools, capsys):
    path = write_tif(tmp_path / "s2.tif", distinct_bands(13), S2_NAMES)
    args = ["tools", "run", "detect_objects", "--image", str(path), "--params", '{"categories": ["ship"]}']
    assert main([*args, "--bands", "4,3,20"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "band 20 is out of range; the image has 13 bands (1-13)" in err[0]
