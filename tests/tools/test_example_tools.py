"""The example tools (configs/tools_examples.yaml): every tool answers on every example image from its annotations,
with no weights; other images and broken annotation files are one clear line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from geopilot.cli import main
from geopilot.image import load_image
from geopilot.sample import Action
from geopilot.tool_output import decode_mask
from geopilot.tools.example_images import NO_ANNOTATIONS, QUESTIONS, ExampleAnnotationsError, ExampleSet
from geopilot.tools.registry import EXAMPLES_CONFIG, build_registry
from geopilot.tools.task_tools import TASKS

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "examples" / "images"
ANNOTATIONS = IMAGES / "annotations.json"
PARAMS = {
    "detect_objects": {"categories": ["plane", "ship", "small vehicle"]},
    "segment_instances": {"categories": ["ship", "storage tank"]},
    "segment_semantic": {"classes": ["water", "tree", "building"]},
    "ground": {"expression": "the ship"},
    "segment_referring": {"expression": "the ship"},
    "sar_ground": {"expression": "the ship"},
}


@pytest.fixture(scope="module")
def registry():
    config_overrides = [f"tools.{spec.name}.options.annotations={ANNOTATIONS}" for spec in TASKS]
    return build_registry(EXAMPLES_CONFIG, config_overrides)


def example_images() -> list[Path]:
    return [IMAGES / entry["file_name"] for entry in json.loads(ANNOTATIONS.read_text())["images"]]


def test_the_examples_cover_every_tool_and_both_modalities():
    images = json.loads(ANNOTATIONS.read_text())["images"]
    questions = json.loads((IMAGES / QUESTIONS).read_text())
    assert len(images) >= 8 and {i["modality"] for i in images} == {"optical", "sar"}
    assert {q["tool"] for q in questions} == {spec.name for spec in TASKS if spec.image_count == 1}
    assert all((IMAGES / q["image"]).is_file() for q in questions)
    assert "CC0" in (IMAGES / "README.md").read_text()


@pytest.mark.parametrize("image", example_images(), ids=lambda p: p.stem)
def test_every_tool_runs_on_every_example_image(registry, image):
    loaded = load_image(image)
    for spec in TASKS:  # a two-image tool on the picture twice: annotated change, or "nothing of this kind"
        action = Action(tool=spec.name, params=PARAMS.get(spec.name, {}))
        pair = [load_image(IMAGES / "changes_after.png") if image.name == "changes_before.png" else loaded]
        result = registry.call(action, loaded, images=[loaded, *pair] if spec.image_count == 2 else None)
        assert result.ok, (spec.name, image.name, result.error)
        assert result.output.provenance == "annotations"


def test_the_tools_answer_the_truth(registry):
    record = {r.record_id: r for r in ExampleSet.read(ANNOTATIONS).records}
    planes = sum(o.label == "airplane" for o in record["airport"].objects)
    result = registry.call(
        Action(tool="detect_objects", params={"categories": ["planes"]}), load_image(IMAGES / "airport.png")
    )
    assert planes >= 1 and len(result.output.detections) == planes
    cloudy = registry.call(Action(tool="remove_clouds", params={}), load_image(IMAGES / "cloudy.png"))
    assert Path(cloudy.output.artifacts[0].path).name == "cloudy_clear.png"
    roads = registry.call(Action(tool="extract_roads", params={}), load_image(IMAGES / "roads.png"))
    assert len(roads.output.roads.edges) >= 1
    sar = registry.call(
        Action(tool="sar_ground", params={"expression": "the ship"}), load_image(IMAGES / "sar_port.png")
    )
    assert [d.label for d in sar.output.detections] == ["ship"]


def test_the_change_pair_answers_its_label_and_refuses_another_after_image(registry):
    before, after = load_image(IMAGES / "changes_before.png"), load_image(IMAGES / "changes_after.png")
    result = registry.call(Action(tool="detect_changes", params={}), before, images=[before, after])
    label = np.asarray(Image.open(IMAGES / "change" / "changes.png")) > 0
    (segment,) = result.output.segments
    assert np.array_equal(decode_mask(segment.mask).astype(bool), label) and label.any()
    assert result.output.data["changed_objects"] == len(result.output.detections) >= 1
    wrong = registry.call(Action(tool="detect_changes", params={}), before, images=[before, before])
    assert not wrong.ok and "image 2 is not the after image annotated for changes_before" in wrong.error


def test_a_user_image_is_a_tool_error_and_the_loop_goes_on(registry):

    user = load_image(Image.new("RGB", (64, 64), (90, 120, 60)))
    result = registry.call(Action(tool="detect_all", params={}), user)
    assert not result.ok and NO_ANNOTATIONS in result.error and "\n" not in result.error
    again = registry.call(Action(tool="detect_all", params={}), load_image(IMAGES / "parking.png"))
    assert again.ok


def test_tools_list_shows_every_tool_ready(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["tools", "list", "--tools-config", "configs/tools_examples.yaml", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == len(TASKS) and {row["status"] for row in rows} == {"ready"}
    assert {row["backend"] for row in rows} == {"annotations"}


def test_tools_run_says_provenance(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = ["tools", "run", "detect_all", "--tools-config", "configs/tools_examples.yaml"]
    assert main([*args, "--image", "examples/images/parking.png"]) == 0
    assert "(provenance: annotations)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda text: text.replace('"bbox": [', '"bbox": [[', 1), "not valid JSON"),
        (lambda text: text.replace('"category_id": 1,', '"category_id": 999,', 1), "category_id 999"),
        (lambda text: text.replace('"file_name": "harbour.png", ', "", 1), "missing key 'file_name'"),
        (lambda text: text.replace('"file_name": "harbour.png"', '"file_name": "gone.png"', 1), "gone.png"),
    ],
)
def test_a_broken_annotation_file_is_one_line_naming_file_and_line(tmp_path, edit, message):
    folder = tmp_path / "images"
    shutil.copytree(IMAGES, folder)
    path = folder / "annotations.json"
    text = path.read_text()
    broken = edit(text)
    path.write_text(broken)
    changed = next(i for i, (a, b) in enumerate(zip(text.splitlines(), broken.splitlines(), strict=True), 1) if a != b)
    with pytest.raises(ExampleAnnotationsError) as caught:
        ExampleSet.read(path)
    assert str(caught.value).startswith(f"{path}:{changed}: ") and message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_chat_on_a_user_image_gets_the_error_per_call_and_still_answers(tiny, registry):
    """The loop hands the model the one-line error for each call and goes on to the answer turn."""
    import numpy as np
    from helpers.scripted import Scripts, answer, plan

    from geopilot.agent import GeoPilot

    model, processor = tiny
    script = Scripts(processor.tokenizer, [plan("detect_all", "extract_roads"), answer("No annotations here.")])
    pilot = GeoPilot(model, processor, registry, session_factory=script)
    user_image = np.random.default_rng(1).integers(0, 255, (48, 48, 3), dtype=np.uint8)
    result = pilot.chat(user_image, "What is there?")
    assert [call.tool for call in result.tool_calls] == ["detect_all", "extract_roads"]
    assert all(NO_ANNOTATIONS in call.error and "\n" not in call.error for call in result.tool_calls)
    assert result.answer == "No annotations here."
    assert script.fed[0][0].count(NO_ANNOTATIONS) == 2  # each call's error went back to the model
