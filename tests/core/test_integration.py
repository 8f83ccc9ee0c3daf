"""End to end with a real tiny random model from `geopilot init-model`: the API and the `geopilot chat` CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.scripted import Detector
from PIL import Image

from geopilot.agent import ChatResult, GeoPilot
from geopilot.cli import main

SHORT = ["--max-new-tokens", "24"]  # room for the shortest plan of the tiny vocabulary (19 tokens)


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    path = tmp_path_factory.mktemp("images") / "scene.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (60, 80, 3), dtype=np.uint8)).save(path)
    return str(path)


def test_chat_with_a_random_model_handles_its_garbage(tiny_model_dir, scene):
    from geopilot.tool_protocol import ToolRegistry

    pilot = GeoPilot.from_pretrained(tiny_model_dir, tools=ToolRegistry([Detector()]), device="cpu")
    result = pilot.chat(scene, "How many planes?", generation={"max_new_tokens": 24})  # room for a plan (19)
    assert isinstance(result, ChatResult) and result.outcome in ("unparsable", "direct", "tools", "round_limit")
    assert result.turns and result.tokens.prompt > result.tokens.image == 16 and result.timings.think > 0
    assert ChatResult.model_validate_json(result.model_dump_json()).answer == result.answer
    results = pilot.chat_batch(
        [{"image": scene, "query": "Ships?"}, {"image": scene, "query": "Count the tanks please."}],
        generation={"max_new_tokens": 24},
    )
    assert len(results) == 2 and all(isinstance(r, ChatResult) for r in results)


def test_cli_chat_prints_json_and_saves_a_visualisation(tiny_model_dir, scene, tmp_path, capsys):
    vis = tmp_path / "vis.png"
    code = main(
        [
            "chat",
            "--model",
            str(tiny_model_dir),
            "--image",
            scene,
            "How many planes?",
            "--json",
            "--out",
            str(vis),
            "--device",
            "cpu",
            *SHORT,
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert {"answer", "outcome", "turns", "tool_calls", "timings", "tokens", "plans"} <= set(data)
    assert Image.open(vis).size == (80, 60)
    assert (
        main(["chat", "--model", str(tiny_model_dir), "--image", scene, "What is this?", "--device", "cpu", *SHORT])
        == 0
    )
    out = capsys.readouterr().out
    assert "answer" in out and "timings:" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--image", "IMAGE_IS_TEXT", "q"], "not an image"),
        (["--image", "SCENE", "   "], "question is empty"),
        (["--image", "SCENE", "q", "--max-rounds", "-1"], "max-rounds"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(tiny_model_dir, scene, tmp_path, capsys, args, message):
    text = tmp_path / "notes.png"
    text.write_text("hello")
    args = [str(text) if a == "IMAGE_IS_TEXT" else scene if a == "SCENE" else a for a in args]
    assert main(["chat", "--model", str(tiny_model_dir), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_missing_model_exits_2(scene, tmp_path, capsys):
    assert main(["chat", "--model", str(tmp_path / "nope"), "--image", scene, "q"]) == 2
    assert "no model at" in capsys.readouterr().err


def test_human_output_shows_reasoning_calls_summaries_answer_and_timings(make_pilot, image):
    from helpers.scripted import answer, plan
    from rich.console import Console

    from geopilot.commands.chat import _print_human

    pilot, _ = make_pilot(
        [plan(("detect_objects", {"categories": ["plane"]}), ("remove_clouds", {})), answer("1 plane.")]
    )
    console = Console(record=True, width=200)
    _print_human(pilot.chat(image, "How many planes?"), console)
    text = console.export_text()
    for expected in (
        "reasoning: I will use a tool.",
        '→ detect_objects {"categories":["plane"]}',
        '✓ {"count":1',
        "✗ tool_error",
        "backend exploded",
        "answer (tools): 1 plane.",
        "timings:",
        "tokens: prompt",
    ):
        assert expected in text, expected
