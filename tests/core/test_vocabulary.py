"""The one class vocabulary (geopilot/vocabulary.yaml): canonical names, per-dataset aliases, SegEarth-OV prompts,
and its users (tool adapters, the annotation backend, configs/tools.yaml).

Upstream facts checked here: SegEarth-OV (likyoo/SegEarth-OV) `configs/cls_openearthmap.txt` is, line by line,
background / bareland,barren / grass / pavement / road / tree,forest / water,river / cropland / building,roof,house,
and `configs/cfg_openearthmap.py` has prob_thd=0.1 (LoveDA 0.3, iSAID 0.4).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from pydantic import ValidationError

from geopilot.errors import ConfigError, GeoPilotInputError
from geopilot.image import load_image
from geopilot.records import AnnotationRecord, ObjectAnnotation, SemanticSegmentation
from geopilot.tool_output import Detection, SegmentClass
from geopilot.tools.adapters import DetectorAdapter, DetectorOptions, SegmenterAdapter, SegmenterOptions
from geopilot.tools.annotations import AnnotationBackend
from geopilot.tools.registry import backend_options, load_tools_config
from geopilot.tools.task_tools import TASKS_BY_NAME
from geopilot.vocabulary import (
    canonical_class,
    dataset_classes,
    default_vocabulary,
    is_known_class,
    labels_match,
    load_vocabulary,
    segearth_queries,
    segearth_threshold,
)


def test_each_datasets_own_names_become_one_canonical_name():
    assert canonical_class("baseballfield", "DIOR") == "baseball field"
    assert canonical_class("storagetank", "DIOR") == "storage tank"
    assert canonical_class("storage-tank", "DOTA") == "storage tank"
    assert canonical_class("storage_tank", "iSAID") == "storage tank"
    assert canonical_class("small-vehicle", "DOTA v1.5") == "small vehicle"
    assert canonical_class("Small_Vehicle", "iSAID") == "small vehicle"
    assert (
        canonical_class("baseball-diamond", "DOTA") == canonical_class("Baseball Field", "FAIR1M") == "baseball field"
    )
    assert canonical_class("Expressway-Service-area", "DIOR") == "expressway service area"  # raw DIOR casing
    assert [canonical_class(c, "SARDet-100K") for c in ("ship", "aircraft", "car", "tank", "bridge", "harbor")] == [
        "ship",
        "airplane",
        "car",
        "storage tank",
        "bridge",
        "harbor",
    ]
    assert canonical_class("plane", "DOTA") == canonical_class("airplane", "DIOR") == "airplane"
    assert canonical_class("Boeing737", "FAIR1M") == "boeing 737"
    assert canonical_class("agriculture land", "OpenEarthMap") == "agricultural land"
    assert canonical_class("cropland") == "agricultural land"  # OpenEarthMap's older name, known to every lookup


def test_lookup_without_a_dataset_is_case_separator_space_and_plural_tolerant():
    assert canonical_class("STORAGE TANKS") == "storage tank"
    assert canonical_class("storagetank") == "storage tank"
    assert canonical_class("planes") == "airplane"
    assert canonical_class("buses") == "bus"
    assert canonical_class("grass") == "rangeland"  # "grass" is not made singular


def test_a_name_in_no_vocabulary_is_kept_verbatim_and_reported_unknown():
    assert canonical_class("Pier_Crane") == "Pier_Crane" and not is_known_class("Pier_Crane")
    assert canonical_class("Pier_Crane", "DOTA") == "Pier_Crane"
    assert is_known_class("container-crane") and is_known_class("harbor", "SARDet-100K")
    with pytest.raises(GeoPilotInputError):
        canonical_class("  ")
    with pytest.raises(GeoPilotInputError, match="unknown dataset"):
        canonical_class("ship", "NotADataset")


def test_dataset_classes_in_the_datasets_order():
    assert len(dataset_classes("DOTA v1.0")) == 15
    assert dataset_classes("DOTA v1.5")[-1] == "container crane" and len(dataset_classes("DOTA v1.5")) == 16
    assert dataset_classes("DOTA v2.0")[-2:] == ["airport", "helipad"]
    assert len(dataset_classes("DIOR")) == 20 and dataset_classes("DIOR")[2] == "baseball field"
    assert len(dataset_classes("FAIR1M")) == 37 and len(dataset_classes("iSAID")) == 15
    assert dataset_classes("sardet") == ["ship", "airplane", "car", "storage tank", "bridge", "harbor"]
    assert dataset_classes("OpenEarthMap") == [
        "bare land",
        "rangeland",
        "developed space",
        "road",
        "tree",
        "water",
        "agricultural land",
        "building",
    ]


def test_every_name_in_the_file_maps_to_a_canonical_class():
    vocabulary = default_vocabulary()
    for name, entry in vocabulary.data.datasets.items():
        for raw in {**entry.classes, **entry.aliases}:
            assert canonical_class(raw, name) in vocabulary.data.classes, (name, raw)
        assert all(c in vocabulary.data.classes for c in dataset_classes(name))


def test_labels_match_for_evaluation():
    assert labels_match("storage tanks", "storagetank", "DIOR")
    assert labels_match("airplane", "plane", "DOTA") and labels_match("Plane", "aircraft", "SARDet-100K")
    assert not labels_match("ship", "harbor")
    assert not labels_match("vehicle", "Small Car", "FAIR1M")  # coarser prediction: only with allow_parent
    assert labels_match("vehicle", "Small Car", "FAIR1M", allow_parent=True)
    assert labels_match("ship", "Warship", "FAIR1M", allow_parent=True)
    assert not labels_match("warship", "ship", allow_parent=True)  # a finer prediction is not the coarse truth
    assert labels_match("Pier Crane", "pier_crane")  # unknown names compare normalised


def test_segearth_ov_prompts_and_thresholds_are_upstreams():
    table = default_vocabulary().segearth_entry("OpenEarthMap").prompts
    assert list(table.values()) == [
        "background",
        "bareland,barren",
        "grass",
        "pavement",
        "road",
        "tree,forest",
        "water,river",
        "cropland",
        "building,roof,house",
    ]
    assert segearth_queries(["background", *dataset_classes("OpenEarthMap")]) == list(table.values())
    assert segearth_queries(["Rangeland", "cropland", "pier"]) == ["grass", "cropland", "pier"]
    assert segearth_threshold("OpenEarthMap") == 0.1 and segearth_threshold("oem") == 0.1
    assert segearth_threshold("LoveDA") == 0.3 and segearth_threshold("iSAID") == 0.4
    assert segearth_queries(["building", "storage tank"], "iSAID") == ["building,roof,house", "store tank"]


def test_an_inconsistent_vocabulary_file_is_refused(tmp_path):
    data = yaml.safe_load(Path(str(resources.files("geopilot") / "vocabulary.yaml")).read_text())
    clash = {**data, "datasets": {**data["datasets"], "X": {"classes": {"plane": "ship"}}}}
    (tmp_path / "clash.yaml").write_text(yaml.safe_dump(clash))
    with pytest.raises(ConfigError, match="'plane'.*one class"):
        load_vocabulary(tmp_path / "clash.yaml")
    cycle = {**data, "classes": {**data["classes"], "ship": "warship"}}
    (tmp_path / "cycle.yaml").write_text(yaml.safe_dump(cycle))
    with pytest.raises(ConfigError, match="cycle"):
        load_vocabulary(tmp_path / "cycle.yaml")
    dangling = {**data, "datasets": {**data["datasets"], "Y": {"classes": {"pier": "pier"}}}}
    (tmp_path / "dangling.yaml").write_text(yaml.safe_dump(dangling))
    with pytest.raises(ConfigError, match="not a canonical class"):
        load_vocabulary(tmp_path / "dangling.yaml")


def test_the_vocabulary_ships_with_the_package():
    assert (resources.files("geopilot") / "vocabulary.yaml").is_file()
    setup = (Path(__file__).resolve().parents[2] / "setup.py").read_text()
    assert '"vocabulary.yaml"' in setup


# --- users ---------------------------------------------------------------------------------------------------------


class FakeDetector:
    def __init__(self, classes=None):
        self.prompts, self.classes = [], classes or []

    def detect(self, image, categories):
        self.prompts.append(list(categories))
        names = self.classes or categories
        return [Detection(label=n, box=(0.1, 0.1, 0.2 + 0.01 * i, 0.2), score=0.9) for i, n in enumerate(names)]


def _image():
    return load_image(Image.new("RGB", (64, 48)))


def test_tools_yaml_detect_all_vocabulary_comes_from_the_vocabulary():
    config = load_tools_config()
    options = backend_options("detect_all", config.tools["detect_all"])
    assert options.fixed_vocabulary() == dataset_classes("DIOR")
    assert backend_options("segment_semantic", config.tools["segment_semantic"]).class_prompts == "OpenEarthMap"


def test_detector_prompts_are_canonical_and_closed_set_labels_come_out_canonical():
    detector = FakeDetector()
    adapter = DetectorAdapter(
        detector, DetectorOptions(vocabulary=["storagetank"], vocabulary_datasets=["SARDet-100K"])
    )
    params = TASKS_BY_NAME["detect_objects"].params_model.model_validate({"categories": ["planes", "storage-tank"]})
    out = adapter.run("detect_objects", _image(), params)
    assert detector.prompts[-1] == ["airplane", "storage tank"]
    assert {d.label for d in out.detections} == {"airplane", "storage tank"}
    adapter.run("detect_all", _image(), TASKS_BY_NAME["detect_all"].params_model.model_validate({}))
    assert detector.prompts[-1] == ["storage tank", "ship", "airplane", "car", "bridge", "harbor"]
    closed = DetectorAdapter(FakeDetector(classes=["aircraft", "tank"]), DetectorOptions(max_detections=5))
    out = closed.run("sar_detect_all", _image(), TASKS_BY_NAME["sar_detect_all"].params_model.model_validate({}))
    assert sorted(d.label for d in out.detections) == ["airplane", "storage tank"]
    with pytest.raises(ValidationError, match="unknown dataset"):
        DetectorOptions(vocabulary_datasets=["DIOR-X"])


class FakeSegmenter:
    def __init__(self):
        self.calls = []

    def segment(self, image, classes, prob_threshold=None):
        self.calls.append((list(classes), prob_threshold))
        return [SegmentClass(label=c, area=0.5) for c in classes]


def test_segmenter_sends_segearth_prompts_and_threshold_and_answers_in_the_requested_names():
    segmenter = FakeSegmenter()
    params = TASKS_BY_NAME["segment_semantic"].params_model.model_validate({"classes": ["rangeland", "building"]})
    out = SegmenterAdapter(segmenter).run("segment_semantic", _image(), params)
    assert segmenter.calls[-1] == (["grass", "building,roof,house"], 0.1)
    assert [s.label for s in out.segments] == ["rangeland", "building"]
    SegmenterAdapter(segmenter, SegmenterOptions(class_prompts="LoveDA")).run("segment_semantic", _image(), params)
    # LoveDA's own file has no rangeland line: the prompt comes from another class file, the threshold from LoveDA's
    assert segmenter.calls[-1] == (["grass", "building,roof,house"], 0.3)
    SegmenterAdapter(segmenter, SegmenterOptions(class_prompts=None)).run("segment_semantic", _image(), params)
    assert segmenter.calls[-1] == (["rangeland", "building"], None)
    with pytest.raises(ValidationError, match="no SegEarth-OV class file"):
        SegmenterOptions(class_prompts="Potsdam2")


def test_annotation_backend_matches_categories_and_classes_through_the_vocabulary(tmp_path):
    labels = np.array([[7, 7], [8, 0]], dtype=np.uint8)
    Image.fromarray(labels).save(tmp_path / "label.png")
    record = AnnotationRecord(
        "DOTA",
        "x.png",
        2,
        2,
        objects=[
            ObjectAnnotation("airplane", (0.0, 0.0, 0.5, 0.5)),
            ObjectAnnotation("storage tank", (0.5, 0.5, 1.0, 1.0)),
        ],
    )
    record.semantic = SemanticSegmentation(str(tmp_path / "label.png"), {7: "agricultural land", 8: "building"}, (0,))
    backend = AnnotationBackend(record)
    planes = backend.call("detect_objects", {"categories": ["planes"]})
    assert [d.label for d in planes.detections] == ["airplane"]
    assert [d.label for d in backend.call("detect_objects", {"categories": ["storagetank"]}).detections] == [
        "storage tank"
    ]
    seg = backend.call("segment_semantic", {"classes": ["cropland", "building"]})
    assert [(s.label, s.area) for s in seg.segments] == [("cropland", 0.5), ("building", 0.25)]
