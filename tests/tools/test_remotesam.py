"""RemoteSAM: tiny forward -> canonical outputs, mask post-processing on hand-made masks, bad input, registry status."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from geopilot.cli import main
from geopilot.errors import GeoPilotInputError
from geopilot.loaded_image import LoadedImage
from geopilot.tool_output import ToolOutput
from geopilot.tools.adapters import MaskSegmenterAdapter
from geopilot.tools.remotesam import RemoteSam, connected_components, instances, remove_inner, union_box
from geopilot.tools.task_tools import TASKS_BY_NAME


@pytest.fixture(scope="module")
def tiny() -> RemoteSam:
    model = RemoteSam.tiny(seed=0, tile_size=96, tile_overlap=16, max_side=128)
    with torch.no_grad():  # a random net predicts nothing: make most pixels foreground so outputs are non-empty
        model.net.decoder.classifier.weight.mul_(0.01)
        model.net.decoder.classifier.bias.copy_(torch.tensor([0.0, 0.5]))
    return model


def _image(width: int = 80, height: int = 60, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(7)
    array = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(array).convert(mode)


@pytest.mark.parametrize(
    ("tool", "params"),
    [
        ("ground", {"expression": "the ship near the dock"}),
        ("segment_referring", {"expression": "the ship near the dock"}),
        ("segment_instances", {"categories": ["storage tanks"]}),
        ("segment_semantic", {"classes": ["water"]}),
    ],
)
def test_tiny_forward_gives_schema_valid_canonical_output(tiny, tool, params):
    adapter = MaskSegmenterAdapter(tiny)
    out = adapter.run(tool, LoadedImage(_image()), TASKS_BY_NAME[tool].params_model(**params))
    assert ToolOutput.model_validate(json.loads(out.model_dump_json())) == out
    for det in out.detections:
        assert det.mask is None or det.mask.size == (60, 80)
    for seg in out.segments:
        assert seg.mask.size == (60, 80)
    if tool == "ground":
        assert len(out.detections) <= 1 and all(d.mask is None for d in out.detections)
    assert out.detections or out.segments


def _three_blobs() -> tuple[np.ndarray, np.ndarray]:
    mask = np.zeros((50, 100), dtype=bool)
    mask[5:15, 10:30] = True  # x 10..30, y 5..15
    mask[20:40, 50:60] = True  # x 50..60, y 20..40
    mask[42:48, 80:95] = True  # x 80..95, y 42..48
    mask[44, 95] = True  # touches the third blob diagonally: 8-connected, so the same object
    prob = np.where(mask, 0.9, 0.1).astype(np.float32)
    prob[20:40, 50:60] = 0.7
    return mask, prob


def test_three_blobs_give_three_instances_and_their_union_box():
    mask, prob = _three_blobs()
    found = instances(mask, prob)
    assert sorted(c.box for c in found) == [(10, 5, 30, 15), (50, 20, 60, 40), (80, 42, 96, 48)]
    assert [round(c.score, 3) for c in found] == [0.9, 0.9, 0.7]  # sorted by confidence = mean prob
    assert union_box(remove_inner(connected_components(mask, prob))) == (10, 5, 96, 48)
    assert union_box([]) is None


def test_inner_boxes_and_low_confidence_components_are_dropped():
    mask = np.zeros((40, 40), dtype=bool)
    mask[5:35, 5:35] = True
    mask[8:32, 8:32] = False  # a ring
    mask[15:20, 15:20] = True  # a blob inside the ring's box
    mask[37:39, 37:39] = True  # a faint speck
    prob = np.where(mask, 0.8, 0.0).astype(np.float32)
    prob[37:39, 37:39] = 0.005
    assert [c.box for c in instances(mask, prob)] == [(5, 5, 35, 35)]


class _HandMadeMask(RemoteSam):
    """RemoteSAM whose network output is replaced by a fixed probability map (post-processing tests)."""

    def __init__(self, model: RemoteSam, prob: np.ndarray):
        super().__init__(model.net, model.tokenizer, model.device)
        self.prob = prob

    def probability(self, image, sentence):
        assert image.size == (self.prob.shape[1], self.prob.shape[0])
        return self.prob


def test_tools_on_a_hand_made_mask_give_normalised_boxes(tiny):
    mask, prob = _three_blobs()
    model = _HandMadeMask(tiny, prob)
    image = LoadedImage(Image.new("RGB", (100, 50)))
    adapter = MaskSegmenterAdapter(model)
    found = adapter.run(
        "segment_instances", image, TASKS_BY_NAME["segment_instances"].params_model(categories=["planes"])
    )
    assert [d.label for d in found.detections] == ["airplane"] * 3  # canonical vocabulary
    assert sorted(d.box for d in found.detections) == [
        (0.1, 0.1, 0.3, 0.3),
        (0.5, 0.4, 0.6, 0.8),
        (0.8, 0.84, 0.96, 0.96),
    ]
    assert sum(d.area for d in found.detections) == pytest.approx(mask.mean(), abs=1e-6)
    grounded = adapter.run("ground", image, TASKS_BY_NAME["ground"].params_model(expression="the planes"))
    assert [d.box for d in grounded.detections] == [(0.1, 0.1, 0.96, 0.96)]
    referred = adapter.run("segment_referring", image, TASKS_BY_NAME["segment_referring"].params_model(expression="x"))
    assert referred.detections[0].box == (0.1, 0.1, 0.96, 0.96)
    assert referred.detections[0].area == pytest.approx(mask.mean())
    threshold = TASKS_BY_NAME["segment_instances"].params_model(categories=["plane"], score_threshold=0.8)
    assert len(adapter.run("segment_instances", image, threshold).detections) == 2


def test_nothing_found_is_a_message(tiny):
    model = _HandMadeMask(tiny, np.zeros((50, 100), dtype=np.float32))
    out = MaskSegmenterAdapter(model).run(
        "ground", LoadedImage(Image.new("RGB", (100, 50))), TASKS_BY_NAME["ground"].params_model(expression="a red car")
    )
    assert out.detections == [] and out.message == "nothing in the image matches 'a red car'"


def test_empty_expression_is_a_clear_error(tiny):
    with pytest.raises(GeoPilotInputError, match="RemoteSAM needs a non-empty expression"):
        tiny.segment_referring(_image(), "   ")


def test_one_channel_image_is_converted_to_three(tiny):
    gray = _image(mode="L")
    assert tiny.probability(gray, "a ship").tolist() == tiny.probability(gray.convert("RGB"), "a ship").tolist()


def test_large_scene_is_tiled_for_categories_and_refused_for_expressions(tiny):
    scene = _image(width=150, height=80)  # two 96 px tiles overlapping by 42 px
    mask, prob = tiny.predict(scene, "ship in the image", tiled=True)
    assert prob.shape == (80, 150) and np.isfinite(prob).all() and (mask == (prob > 0.5)).all()
    with pytest.raises(GeoPilotInputError, match="crop it to at most 128 px per side"):
        tiny.ground(scene, "the ship")


def test_list_reports_remotesam_ready_or_weights_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(tmp_path))
    assert main(["tools", "list", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    for name in ("ground", "segment_instances", "segment_referring"):
        assert rows[name]["backend"] == "remotesam"
        assert rows[name]["status"] == "weights missing" and rows[name]["status_detail"].startswith(
            "weights not found: put remotesam/checkpoint.pth"
        )
    (tmp_path / "remotesam").mkdir()
    (tmp_path / "remotesam" / "checkpoint.pth").write_bytes(b"x")
    assert main(["tools", "list", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert (
        rows["ground"]["status"] == "weights missing"
        and "bert-base-uncased/vocab.txt" in rows["ground"]["status_detail"]
    )
    (tmp_path / "remotesam" / "bert-base-uncased").mkdir()
    (tmp_path / "remotesam" / "bert-base-uncased" / "vocab.txt").write_text("[PAD]\n")
    assert main(["tools", "list", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert {rows[n]["status"] for n in ("ground", "segment_instances", "segment_referring")} == {"ready"}


# 1e12Leon/RemoteSAM data/datasets/DET.py: DIOR_DET.classes (L125, without 'background') and DOTAv2_DET.classes (L130),
# the names tasks/DET.sh and tasks/DET_DOTA.sh pass as --_class and tasks/code/model.py L216 prompts as
# f"{classname} in the image".
UPSTREAM_DIOR = (
    "airplane airport baseballfield basketballcourt bridge chimney dam expressway-service-area "
    "expressway-toll-station golffield groundtrackfield harbor overpass ship stadium storagetank tenniscourt "
    "trainstation vehicle windmill"
).split()
UPSTREAM_DOTA_V2 = (
    "airplane ship storagetank baseballfield tenniscourt basketballcourt groundtrackfield harbor bridge "
    "large-vehicle small-vehicle helicopter roundabout soccer-ball-field swimming-pool container-crane airport helipad"
).split()


def test_class_prompts_use_upstreams_raw_dataset_names():
    from geopilot.tools.remotesam import class_prompt
    from geopilot.vocabulary import canonical_class

    for raw in UPSTREAM_DIOR + UPSTREAM_DOTA_V2 + ["bareland"]:  # AID_MCC (data/datasets/MCC.py L67)
        assert class_prompt(canonical_class(raw)) == f"{raw} in the image"
    assert class_prompt("storage tank") == "storagetank in the image"
    assert class_prompt("rangeland") == "rangeland in the image"  # unknown upstream: the canonical name


def test_segment_instances_prompts_the_raw_name_and_labels_canonically(tiny, monkeypatch):
    prompts = []
    original = tiny.predict

    def spy(image, sentence, tiled=False):
        prompts.append(sentence)
        return original(image, sentence, tiled=tiled)

    monkeypatch.setattr(tiny, "predict", spy)
    found = tiny.segment_instances(_image(), ["storage tanks", "ground track field"])
    semantic = tiny.segment_semantic(_image(), ["bare land"])
    assert prompts == ["storagetank in the image", "groundtrackfield in the image", "bareland in the image"]
    assert {d.label for d in found} <= {"storage tank", "ground track field"}
    assert {s.label for s in semantic} <= {"bare land"}
