"""`geopilot tools list|run`: machine-readable listing, and one-line errors with exit code 2 for bad input."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from geopilot.cli import main


@pytest.fixture
def png(tmp_path):
    path = tmp_path / "small.png"
    Image.new("RGB", (16, 12), (10, 20, 30)).save(path)
    return path


def test_list_json_has_every_tool_with_schema_and_status(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(tmp_path))
    (tmp_path / "spa_gan" / "RICE1").mkdir(parents=True)
    (tmp_path / "spa_gan" / "RICE1" / "gen_model_epoch_200.pth").write_bytes(b"x")
    assert main(["tools", "list", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert len(rows) == 11
    assert rows["remove_clouds"]["status"] == "ready"
    assert rows["detect_objects"]["status"] == "weights missing" and rows["detect_objects"]["status_detail"].startswith(
        "weights not found: put lae_dino at"
    )
    assert rows["ground"]["status"] == "weights missing" and rows["ground"]["status_detail"].startswith(
        "weights not found: put remotesam/checkpoint.pth at"
    )
    assert rows["detect_objects"]["input_schema"]["required"] == ["categories"]


def test_list_human_readable(capsys):
    assert main(["tools", "list"]) == 0
    out = capsys.readouterr().out
    assert "sar_detect_all" in out and "denodet" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "count_cars", "--params", "{}"], "unknown tool 'count_cars'"),
        (["run", "detect_objects", "--params", "{not json"], "--params: not JSON"),
        (["run", "detect_objects", "--params", "[1]"], "--params: expected a JSON object, got list"),
        (["run", "detect_objects", "--params", '{"categories": []}'], "categories: List should have at least 1 item"),
        (["run", "ground", "--params", '{"expression": "x", "k": 1}'], "k: unexpected parameter"),
        (
            ["run", "ground", "--params", '{"expression": "the ship"}'],
            "weights not found: put remotesam/checkpoint.pth",
        ),
        (["run", "detect_objects", "--params", '{"categories": ["ship"]}'], "weights not found: put lae_dino at"),
        (["run", "remove_clouds", "max_pixels=100"], "exceeds the limit of 100"),
        (["run", "remove_clouds", "tools.remove_clouds.options.variant=RICE3"], "variant"),
        (["run", "remove_clouds", "--set", "device=cpu"], "key=value words, no --set"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(argv, message, png, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(tmp_path))
    code = main(["tools", *argv[:2], "--image", str(png), *argv[2:]])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_missing_image_file_is_exit_code_2(capsys, tmp_path):
    assert main(["tools", "run", "remove_clouds", "--image", str(tmp_path / "nope.png")]) == 2
    assert "image not found" in capsys.readouterr().err


def test_usage_errors_and_help(capsys):
    assert main(["tools"]) == 2
    assert main(["tools", "run", "detect_all"]) == 2  # --image is required
    assert main(["tools", "run", "--help"]) == 0
    assert "--params" in capsys.readouterr().out


def test_run_takes_several_images_in_order_and_names_the_one_a_tool_reads(capsys, tmp_path):
    """With the example tools (they answer from the annotations of examples/images/, recognising each by its
    pixels), `"image": "input:2"` runs on the second --image; two sizes are one line and exit 2."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    examples = root / "examples" / "images"
    base = ["tools", "run", "detect_all", "--tools-config", str(root / "configs" / "tools_examples.yaml"), "--json"]
    pair = ["--image", str(examples / "town.png"), "--image", str(examples / "airport.png")]
    assert main([*base, *pair, "--params", '{"image": "input:2"}']) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["output"]["computed_on"] == "input:2"
    assert main([*base, "--image", str(examples / "airport.png")]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert alone["output"]["detections"] and second["output"]["detections"] == alone["output"]["detections"]
    assert main([*base, *pair]) == 0
    assert json.loads(capsys.readouterr().out)["output"]["computed_on"] == "input"
    small = tmp_path / "small.png"
    Image.new("RGB", (16, 12)).save(small)
    assert main([*base, "--image", str(examples / "town.png"), "--image", str(small)]) == 2
    err = capsys.readouterr().err
    assert "image 2 is 16x12 px but image 1 is 256x256" in err and len(err.strip().splitlines()) == 1
