"""The annotation-backed backend: every tool answers with the ground truth of one record, labelled as such."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_utils

from geopilot.errors import GeoPilotInputError
from geopilot.image import load_image
from geopilot.records import (
    AnnotationRecord,
    ObjectAnnotation,
    ReferringExpression,
    RoadGraphAnnotation,
    SemanticSegmentation,
)
from geopilot.sample import Action
from geopilot.tools.annotations import AnnotationBackend
from geopilot.tools.registry import build_registry
from geopilot.tools.task_tools import TASKS

W, H = 40, 20


def _mask_rle(x1: int, y1: int, x2: int, y2: int) -> dict:
    mask = np.zeros((H, W), dtype=np.uint8)
    mask[y1:y2, x1:x2] = 1
    rle = mask_utils.encode(np.asfortranarray(mask))
    return {"size": [H, W], "counts": rle["counts"].decode("ascii")}


@pytest.fixture
def record(tmp_path) -> AnnotationRecord:
    labels = np.zeros((H, W), dtype=np.uint8)
    labels[:, :10] = 1  # water: a quarter
    labels[:5, 10:] = 2  # building: 5 * 30 / 800
    labels[19, 39] = 255  # ignored pixel
    Image.fromarray(labels, "L").save(tmp_path / "mask.png")
    Image.new("RGB", (W, H), (10, 200, 30)).save(tmp_path / "clear.png")
    change = np.zeros((H, W), dtype=np.uint8)
    change[2:6, 3:9] = 255  # LEVIR-CD's 0/255 labels: two regions, 24 and 4 pixels
    change[15:17, 30:32] = 255
    Image.fromarray(change, "L").save(tmp_path / "change.png")
    Image.new("RGB", (W, H), (90, 80, 70)).save(tmp_path / "after.png")
    return AnnotationRecord(
        source="TEST",
        image="scene.png",
        width=W,
        height=H,
        record_id="scene-1",
        objects=[
            ObjectAnnotation("plane", (0.1, 0.1, 0.3, 0.5), mask=_mask_rle(4, 2, 12, 10)),
            ObjectAnnotation("plane", (0.5, 0.5, 0.6, 0.9), polygon=((0.5, 0.5), (0.6, 0.5), (0.6, 0.9), (0.5, 0.9))),
            ObjectAnnotation("storage tank", (0.7, 0.0, 0.8, 0.2)),
        ],
        referring=[ReferringExpression("the plane on the left", (0,)), ReferringExpression("all planes", (0, 1))],
        semantic=SemanticSegmentation("mask.png", {0: "background", 1: "water", 2: "building"}, ignore_values=(255,)),
        roads=RoadGraphAnnotation(
            ((0.0, 0.5), (0.5, 0.5), (1.0, 0.5), (0.5, 1.0)), ((0, 1), (1, 0), (1, 2), (1, 3), (2, 2))
        ),
        cloud_free_image="clear.png",
        after_image="after.png",
        change_mask="change.png",
    )


def test_detect_objects_matches_categories_in_any_case_or_number(record, tmp_path):
    out = AnnotationBackend(record, root=tmp_path).call("detect_objects", {"categories": ["Planes"]})
    assert out.provenance == "annotations"
    assert [d.box for d in out.detections] == [(0.1, 0.1, 0.3, 0.5), (0.5, 0.5, 0.6, 0.9)]
    assert out.detections[0].mask is None  # detection carries no masks
    assert out.detections[1].polygon is not None
    tanks = AnnotationBackend(record).call("detect_objects", {"categories": ["storage tanks", "ship"]})
    assert [d.label for d in tanks.detections] == ["storage tank"]


def test_detect_all_and_sar_detect_all_return_every_object(record):
    backend = AnnotationBackend(record)
    assert len(backend.call("detect_all").detections) == 3
    assert len(backend.call("sar_detect_all").detections) == 3


def test_referring_tools_return_the_expression_targets(record):
    backend = AnnotationBackend(record)
    one = backend.call("ground", {"expression": "The plane on the LEFT."})
    assert [d.box for d in one.detections] == [(0.1, 0.1, 0.3, 0.5)]
    assert len(backend.call("sar_ground", {"expression": "all planes"}).detections) == 2
    none = backend.call("ground", {"expression": "the red car"})
    assert none.detections == [] and "no annotated object" in none.message


def test_instance_masks_come_from_mask_then_polygon_then_box(record):
    out = AnnotationBackend(record).call("segment_instances", {"categories": ["plane", "storage tank"]})
    areas = [d.area for d in out.detections]
    assert areas[0] == pytest.approx(8 * 8 / (W * H))  # the annotated RLE
    assert areas[1] == pytest.approx(4 * 8 / (W * H), abs=0.02)  # rasterised polygon (pycocotools fill rule)
    assert areas[2] == pytest.approx(4 * 4 / (W * H), abs=0.02)  # the box
    assert all(d.mask.size == (H, W) for d in out.detections)
    referred = AnnotationBackend(record).call("segment_referring", {"expression": "the plane on the left"})
    assert referred.detections[0].mask.counts == record.objects[0].mask["counts"]


def test_semantic_areas_and_masks_from_the_mask_file(record, tmp_path):
    out = AnnotationBackend(record, root=tmp_path).call("segment_semantic", {"classes": ["water", "Building", "tree"]})
    assert [(s.label, s.area) for s in out.segments] == [("water", 0.25), ("Building", round(150 / 800, 6))]
    decoded = mask_utils.decode({"size": [H, W], "counts": out.segments[0].mask.counts.encode("ascii")})
    assert decoded[:, :10].all() and not decoded[:, 10:].any()
    assert "tree" in out.message


def test_roads_and_cloud_free_image(record, tmp_path):
    backend = AnnotationBackend(record, root=tmp_path)
    roads = backend.call("extract_roads").roads
    assert roads.edges == [(0, 1), (1, 2), (1, 3)]  # duplicates and self-loops dropped
    clear = backend.call("remove_clouds")
    assert clear.artifacts[0].path == str((tmp_path / "clear.png").resolve())


def test_missing_annotation_kinds_are_clear_errors(record):
    bare = AnnotationRecord(source="TEST", image="x.png", width=W, height=H, record_id="bare")
    with pytest.raises(GeoPilotInputError, match="no road graph"):
        AnnotationBackend(bare).call("extract_roads")
    with pytest.raises(GeoPilotInputError, match="no semantic mask"):
        AnnotationBackend(bare).call("segment_semantic", {"classes": ["water"]})
    with pytest.raises(GeoPilotInputError, match="categories: List should have at least 1 item"):
        AnnotationBackend(record).call("detect_objects", {"categories": []})
    with pytest.raises(GeoPilotInputError, match="unknown tool"):
        AnnotationBackend(record).call("count")


def test_changes_are_exactly_the_labelled_pixels(record, tmp_path):
    out = AnnotationBackend(record, root=tmp_path).call("detect_changes")
    label = np.asarray(Image.open(tmp_path / "change.png")) > 0
    (segment,) = out.segments
    assert np.array_equal(mask_utils.decode({"size": [H, W], "counts": segment.mask.counts.encode()}) > 0, label)
    assert out.data == {"changed_fraction": round(28 / 800, 6), "changed_objects": 2}
    assert [(d.label, d.box, d.area) for d in out.detections] == [
        ("change", (0.075, 0.1, 0.225, 0.3), 0.03),
        ("change", (0.75, 0.75, 0.8, 0.85), 0.005),
    ]
    regions, mask = out.artifacts
    assert (regions.kind, mask.kind, mask.path) == ("image", "mask", str((tmp_path / "change.png").resolve()))
    kept = np.asarray(Image.open(regions.path))
    assert (kept[label] == (90, 80, 70)).all() and not kept[~label].any()
    levir = AnnotationRecord(**{**record.__dict__, "source": "LEVIR-CD"})
    counted = AnnotationBackend(levir, root=tmp_path).call("detect_changes", {"classes": ["buildings"]})
    assert {d.label for d in counted.detections} == {"building"}
    other = AnnotationBackend(levir, root=tmp_path).call("detect_changes", {"classes": ["road"]})
    assert other.detections == [] and other.message == "the annotations label building change only"


def test_registry_built_on_annotations_serves_all_tools(record, tmp_path):
    registry = build_registry(annotations=record, annotations_root=tmp_path)
    image = load_image(Image.new("RGB", (W, H)))
    params = {"categories": ["plane"], "classes": ["water"], "expression": "all planes"}
    for spec in TASKS:
        wanted = {k: v for k, v in params.items() if k in spec.params_model.model_fields and spec.image_count == 1}
        result = registry.call(Action(tool=spec.name, params=wanted), image, images=[image] * spec.image_count)
        assert result.ok, (spec.name, result.error)
        assert result.output.provenance == "annotations"


def test_a_chain_reads_the_cloud_free_original_and_places_objects_in_classes(record, tmp_path):
    """remove_clouds on a cloudy scene gives its clean original; a detection on `result:1` reads that image; a
    segmentation with `objects: result:2` counts the detections inside / outside each class region."""
    from geopilot.tool_chains import ChatCalls

    Image.new("RGB", (W, H)).save(tmp_path / "scene.png")
    registry = build_registry(annotations=record, annotations_root=tmp_path)
    image, calls = load_image(tmp_path / "scene.png"), ChatCalls()
    chain = [
        Action(tool="remove_clouds"),
        Action(tool="detect_objects", params={"categories": ["plane"], "image": "result:1"}),
        Action(tool="segment_semantic", params={"classes": ["water", "building"], "objects": "result:2"}),
    ]
    results = []
    for action in chain:  # one call per round
        results.append(registry.call(action, image, "optical", calls=calls))
        calls.record(results[-1], registry.params_key(action))
        calls.close_round()
    clear, planes, regions = (r.output for r in results)
    assert clear.artifacts[0].path == str((tmp_path / "clear.png").resolve())
    assert planes.computed_on == "result:1" and [d.label for d in planes.detections] == ["plane", "plane"]
    # plane centres (0.2, 0.3) -> column 8 (water, columns 0-9); (0.55, 0.7) -> column 22, row 14 (background)
    assert regions.data == {
        "objects_from": "result:2",
        "objects": 2,
        "inside": {"water": 1, "building": 0},
        "outside": {"water": 1, "building": 2},
    }
    wrong = registry.call(Action(tool="segment_semantic", params={"classes": ["water"], "objects": "result:1"}), image)
    assert wrong.error_kind == "invalid_reference"
    wrong_kind = registry.call(
        Action(tool="segment_semantic", params={"classes": ["water"], "objects": "result:1"}), image, calls=calls
    )
    assert wrong_kind.error_kind == "invalid_reference" and "not a detection" in wrong_kind.error
