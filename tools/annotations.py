"""The annotation-backed backend: ground truth of one `AnnotationRecord`, returned as the canonical tool output.

data_gen uses it to write tool turns whose content is exactly right. Every output says
`provenance="annotations"`. Two ways in:

    backend = AnnotationBackend(record, root="/data/dota")       # root: base of relative mask/image paths
    output = backend.call("detect_objects", {"categories": ["plane"]})     # params checked by the tool's model

    registry = build_registry(annotations=record)                 # geopilot.tools.registry: all ten tools
    result = registry.call(Action(tool="ground", params={"expression": "the red car"}), loaded_image)

What each tool returns: detect_objects / segment_instances -> objects whose label names the same class as a category
(through the class vocabulary, `geopilot.vocabulary`: "planes", "plane" and "airplane" are one class; names in no
vocabulary compare case-insensitively, singular or plural); detect_all / sar_detect_all -> all objects; ground / sar_ground /
segment_referring -> the objects of the referring expression equal to the query (normalised spaces and case);
segment_* add COCO RLE masks (the annotated mask, else the filled polygon, else the box) and area fractions;
segment_semantic -> per class area + RLE from the mask file (classes matched through the vocabulary too:
"cropland" finds OpenEarthMap's "agricultural land"); extract_roads -> the road graph; remove_clouds ->
the paired cloud-free image as an artefact; detect_changes -> the pair's change label (`record.change_mask`, image 2
`record.after_image`) through `geopilot.tools.change_output`, with the model's artefacts (the after image with its
unchanged pixels black, written to this process's artefact folder, and the label file as the mask).

Chains (docs/chains.md): the restored image of a cloudy scene is its clean original, whose geometry the record's
annotations describe, so a call on `"image": "result:N"` (that artefact, resolved by the registry) answers from the
same record; `segment_semantic` with `objects` counts the referenced detections per class region (`TaskTool`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image
from pydantic import BaseModel, ValidationError

from geopilot.artifacts import private_artifacts_dir, publish_artifact
from geopilot.errors import GeoPilotInputError, describe_validation_error
from geopilot.loaded_image import LoadedImage
from geopilot.records import AnnotationRecord, ObjectAnnotation
from geopilot.tool_output import RLE, Artifact, Detection, RoadGraph, ToolOutput
from geopilot.tool_protocol import UNEXPECTED_PARAMETER
from geopilot.tools.canonical import (
    box_mask,
    coco_rle,
    polygon_mask,
    rle_area_fraction,
    segment_class,
    unit_box,
    unit_polygon,
)
from geopilot.tools.task_tools import TASKS_BY_NAME
from geopilot.vocabulary import canonical_class, is_known_class, normalise

PROVENANCE = "annotations"
# What a changed region of a source is: LEVIR-CD labels building change, as BIT (trained on it) reports it.
CHANGE_CLASSES = {"LEVIR-CD": "building"}


class AnnotationMissingError(GeoPilotInputError):
    """The record has no annotation of the kind a tool needs (e.g. no road graph for extract_roads)."""


def normalise_name(text: str) -> str:
    words = normalise(text).split()
    if words and len(words[-1]) > 3 and words[-1].endswith("s") and not words[-1].endswith("ss"):
        words[-1] = words[-1][:-1]  # "planes" ~ "plane", "storage tanks" ~ "storage tank"; "grass" stays
    return " ".join(words)


def class_key(text: str) -> str:
    """What a category or label means: its canonical class, or the normalised words of a name in no vocabulary."""
    if not text.strip():
        return ""
    return canonical_class(text) if is_known_class(text) else normalise_name(text)


def normalise_expression(text: str) -> str:
    return " ".join(text.lower().split()).rstrip(".")


class AnnotationBackend:
    def __init__(self, record: AnnotationRecord, root: str | Path | None = None):
        self.record = record
        self.root = Path(root) if root is not None else None

    # -- entry points -------------------------------------------------------------------------------------------
    def call(self, tool: str, params: dict | BaseModel | None = None) -> ToolOutput:
        """Validate `params` with the tool's input model and return the ground-truth output."""
        if tool not in TASKS_BY_NAME:
            raise GeoPilotInputError(f"unknown tool {tool!r}; available: {', '.join(TASKS_BY_NAME)}")
        if not isinstance(params, BaseModel):
            try:
                params = TASKS_BY_NAME[tool].params_model.model_validate(params or {})
            except ValidationError as err:
                problem = describe_validation_error(err, unknown_key=UNEXPECTED_PARAMETER)
                raise GeoPilotInputError(f"invalid params for {tool!r}: {problem}") from None
        return self.run(tool, None, params)

    def run(self, tool: str, image: LoadedImage | None, params: BaseModel, **images: list[LoadedImage]) -> ToolOutput:
        handlers = {
            "detect_objects": lambda: self._detections(self._by_category(params.categories)),
            "detect_all": lambda: self._detections(range(len(self.record.objects))),
            "ground": lambda: self._referred(params.expression, with_masks=False),
            "segment_semantic": lambda: self._semantic(params.classes),
            "segment_instances": lambda: self._detections(self._by_category(params.categories), with_masks=True),
            "segment_referring": lambda: self._referred(params.expression, with_masks=True),
            "extract_roads": self._roads,
            "remove_clouds": self._cloud_free,
            "sar_detect_all": lambda: self._detections(range(len(self.record.objects))),
            "sar_ground": lambda: self._referred(params.expression, with_masks=False),
            "detect_changes": lambda: self._changes(params.classes),
        }
        if tool not in handlers:
            raise GeoPilotInputError(f"the annotation backend has no rule for tool {tool!r}")
        return handlers[tool]()

    # -- objects --------------------------------------------------------------------------------------------------
    def _by_category(self, categories: list[str]) -> list[int]:
        wanted = {class_key(c) for c in categories}
        return [i for i, obj in enumerate(self.record.objects) if class_key(obj.label) in wanted]

    def _mask(self, obj: ObjectAnnotation) -> RLE:
        width, height = self.record.width, self.record.height
        if obj.mask is not None:
            return coco_rle(obj.mask)
        if obj.polygon is not None and len(obj.polygon) >= 3:
            return polygon_mask(obj.polygon, width, height)
        return box_mask(obj.box, width, height)

    def _detection(self, obj: ObjectAnnotation, with_mask: bool) -> Detection:
        polygon = unit_polygon(obj.polygon) if obj.polygon is not None and len(obj.polygon) >= 3 else None
        mask = self._mask(obj) if with_mask else None
        area = round(rle_area_fraction(mask), 6) if mask is not None else None
        return Detection(label=obj.label, box=unit_box(*obj.box), polygon=polygon, mask=mask, area=area)

    def _detections(self, indices, with_masks: bool = False) -> ToolOutput:
        objects = self.record.objects
        return ToolOutput(provenance=PROVENANCE, detections=[self._detection(objects[i], with_masks) for i in indices])

    def _referred(self, expression: str, with_masks: bool) -> ToolOutput:
        query = normalise_expression(expression)
        for ref in self.record.referring:
            if normalise_expression(ref.expression) == query:
                return self._detections(ref.object_indices, with_masks)
        return ToolOutput(provenance=PROVENANCE, message=f"no annotated object matches {expression!r}")

    # -- rasters and graphs -------------------------------------------------------------------------------------------
    def _path(self, path: str) -> Path:
        candidate = Path(path)
        return candidate if candidate.is_absolute() or self.root is None else self.root / candidate

    def _label_map(self, mask_path: str, what: str) -> tuple[Path, np.ndarray]:
        """A label image of the record's size (AnnotationMissingError naming it otherwise)."""
        path = self._path(mask_path)
        try:
            with Image.open(path) as handle:
                if handle.size != (self.record.width, self.record.height):  # from the header, before decoding
                    size = f"{handle.width}x{handle.height}"
                    raise AnnotationMissingError(
                        f"{what} {path} is {size}, its image {self.record.width}x{self.record.height}"
                    )
                labels = np.asarray(handle)
        except OSError as err:
            raise AnnotationMissingError(f"{what} {path} cannot be read: {err}") from None
        return path, labels

    def _semantic(self, classes: list[str]) -> ToolOutput:
        semantic = self.record.semantic
        if semantic is None:
            raise AnnotationMissingError(f"record {self.record.record_id!r} has no semantic mask for segment_semantic")
        path, labels = self._label_map(semantic.mask_path, "semantic mask")
        if labels.ndim != 2:
            raise AnnotationMissingError(f"semantic mask {path} must be single-channel, got shape {labels.shape}")
        values_by_name: dict[str, list[int]] = {}
        for value, name in semantic.class_names.items():
            values_by_name.setdefault(class_key(name), []).append(int(value))
        segments, unknown = [], []
        for name in classes:
            values = values_by_name.get(class_key(name))
            if values is None:
                unknown.append(name)
                continue
            segments.append(segment_class(name, np.isin(labels, values)))
        message = f"classes not in this dataset's annotations: {', '.join(unknown)}" if unknown else None
        return ToolOutput(provenance=PROVENANCE, segments=segments, message=message)

    def _changes(self, classes: list[str] | None) -> ToolOutput:
        from geopilot.tools.change_output import change_output, label_mask

        record = self.record
        if record.change_mask is None or record.after_image is None:
            raise AnnotationMissingError(f"record {record.record_id!r} has no change label for detect_changes")
        path, labels = self._label_map(record.change_mask, "change label")
        label = CHANGE_CLASSES.get(record.source, "change")
        if classes and class_key(label) not in {class_key(c) for c in classes}:
            return ToolOutput(provenance=PROVENANCE, message=f"the annotations label {label} change only")
        changed = label_mask(labels)
        with Image.open(self._path(record.after_image)) as after:
            kept = np.asarray(after.convert("RGB")).copy()
        kept[~changed] = 0
        regions = publish_artifact(
            private_artifacts_dir(), "detect_changes", ".png", lambda to: Image.fromarray(kept).save(to, "PNG")
        )
        artifacts = [Artifact(kind="image", path=str(regions)), Artifact(kind="mask", path=str(path.resolve()))]
        return change_output(changed, label=label, artifacts=artifacts, provenance=PROVENANCE)

    def _roads(self) -> ToolOutput:
        roads = self.record.roads
        if roads is None:
            raise AnnotationMissingError(f"record {self.record.record_id!r} has no road graph for extract_roads")
        edges = sorted({(min(a, b), max(a, b)) for a, b in roads.edges if a != b})
        return ToolOutput(provenance=PROVENANCE, roads=RoadGraph(nodes=unit_polygon(roads.nodes), edges=edges))

    def _cloud_free(self) -> ToolOutput:
        if self.record.cloud_free_image is None:
            raise AnnotationMissingError(f"record {self.record.record_id!r} has no cloud-free image for remove_clouds")
        path = self._path(self.record.cloud_free_image)
        if not path.is_file():
            raise AnnotationMissingError(f"cloud-free image {path} does not exist")
        return ToolOutput(
            provenance=PROVENANCE,
            artifacts=[Artifact(kind="image", path=str(path.resolve()))],
            message="cloud-free image (paired ground truth)",
        )
