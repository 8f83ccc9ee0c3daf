"""The example tools: every task-level tool answers from the annotations of the shipped example images.

`configs/tools_examples.yaml` binds all ten tools to the `annotations` backend, so the tool loop runs on a fresh
machine without any specialist weights. The annotations are one COCO JSON file (`examples/images/annotations.json`,
the format `examples/images/README.md` describes): COCO objects (`bbox`, polygon `segmentation`), RefCOCO-style `refs`
for referring expressions, and per image an optional land-cover label PNG, a GeoJSON road file (pixel coordinates),
a cloud-free pair and an after image with its change label (detect_changes, whose image 1 is the entry's own
picture and whose image 2 must be the annotated after image). An image is recognised by its pixels (the same picture from a path, upload or artefact), so
`geopilot chat`, `serve`, `tools run` and MCP all find it; any other image gets the tool error "no annotations for
this image". Every output says `provenance: "annotations"` (`geopilot.tools.annotations.AnnotationBackend`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from geopilot.errors import GeoPilotInputError
from geopilot.image import LoadedImage, load_image
from geopilot.records import (
    AnnotationRecord,
    ObjectAnnotation,
    ReferringExpression,
    RoadGraphAnnotation,
    SemanticSegmentation,
)
from geopilot.tool_output import ToolOutput
from geopilot.tools.annotations import PROVENANCE, AnnotationBackend, AnnotationMissingError

NO_ANNOTATIONS = "no annotations for this image"
QUESTIONS = "questions.json"  # beside the annotations: one question per example image (the demo's worked examples)
SECTIONS = ("images", "categories", "annotations", "refs")


class ExampleAnnotationsError(GeoPilotInputError):
    """The example annotations cannot be used: one line naming the file and the line."""


def annotations_file(configured: str) -> Path:
    """The configured path from the current folder, else from this checkout's root (an editable install run elsewhere)."""
    path = Path(configured)
    if path.is_absolute() or path.is_file():
        return path
    in_checkout = Path(__file__).resolve().parents[1] / path
    return in_checkout if in_checkout.is_file() else path


def _entries_with_lines(text: str, path: Path) -> tuple[dict, dict[str, list[int]]]:
    """The top-level JSON object, and for each list under it the line each entry starts on (for error messages)."""
    decoder = json.JSONDecoder()

    def fail(position: int, message: str):
        line = text.count("\n", 0, position) + 1
        raise ExampleAnnotationsError(f"{path}:{line}: {message}")

    def skip(position: int) -> int:
        while position < len(text) and text[position] in " \t\r\n":
            position += 1
        return position

    def value(position: int):
        try:
            return decoder.raw_decode(text, position)
        except json.JSONDecodeError as err:
            fail(err.pos, f"not valid JSON ({err.msg})")

    data: dict = {}
    lines: dict[str, list[int]] = {}
    position = skip(0)
    if not text.startswith("{", position):
        fail(position, "a COCO annotation file is one JSON object")
    position = skip(position + 1)
    while not text.startswith("}", position):
        key, position = value(position)
        position = skip(position)
        if not isinstance(key, str) or not text.startswith(":", position):
            fail(position, "not valid JSON (expected a key and ':')")
        position = skip(position + 1)
        if text.startswith("[", position):
            items, starts = [], []
            position = skip(position + 1)
            while not text.startswith("]", position):
                starts.append(text.count("\n", 0, position) + 1)
                item, position = value(position)
                items.append(item)
                position = skip(position)
                if text.startswith(",", position):
                    position = skip(position + 1)
                elif not text.startswith("]", position):
                    fail(position, "not valid JSON (expected ',' or ']')")
            data[key], lines[key] = items, starts
            position += 1
        else:
            data[key], position = value(position)
        position = skip(position)
        if text.startswith(",", position):
            position = skip(position + 1)
        elif not text.startswith("}", position):
            fail(position, "not valid JSON (expected ',' or '}')")
    return data, lines


def _points(flat, what: str) -> list[tuple[float, float]]:
    if not isinstance(flat, list) or len(flat) < 6 or len(flat) % 2 or not all(_is_number(v) for v in flat):
        raise ValueError(f"{what} must be a list of x, y pixel numbers with at least 3 points")
    return [(float(x), float(y)) for x, y in zip(flat[0::2], flat[1::2], strict=True)]


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _road_graph(path: Path, width: int, height: int) -> RoadGraphAnnotation:
    """GeoJSON LineStrings in pixel coordinates -> nodes (shared vertices merged) and edges."""
    try:
        collection = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"road file {path} cannot be read ({type(err).__name__})") from None
    except json.JSONDecodeError as err:
        raise ExampleAnnotationsError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    nodes: dict[tuple[float, float], int] = {}
    edges: list[tuple[int, int]] = []
    for feature in collection.get("features", []) if isinstance(collection, dict) else []:
        geometry = feature.get("geometry") if isinstance(feature, dict) else None
        if not isinstance(geometry, dict) or geometry.get("type") != "LineString":
            raise ValueError(f"road file {path}: every feature must be a LineString")
        ids = [nodes.setdefault((float(x) / width, float(y) / height), len(nodes)) for x, y in geometry["coordinates"]]
        edges.extend(zip(ids, ids[1:], strict=False))
    return RoadGraphAnnotation(nodes=tuple(nodes), edges=tuple(edges))


def _record(image: dict, root: Path, land_cover: dict[int, str]) -> AnnotationRecord:
    width, height = image["width"], image["height"]
    if not (isinstance(width, int) and isinstance(height, int) and width > 0 and height > 0):
        raise ValueError("width and height must be positive integers")
    modality = image.get("modality", "optical")
    if modality not in ("optical", "sar"):
        raise ValueError(f"modality must be 'optical' or 'sar', not {modality!r}")
    record = AnnotationRecord("examples", str(root / image["file_name"]), width, height, modality)
    record.record_id = Path(image["file_name"]).stem
    if image.get("land_cover"):
        record.semantic = SemanticSegmentation(str(root / image["land_cover"]), land_cover)
    if image.get("roads"):
        record.roads = _road_graph(root / image["roads"], width, height)
    if image.get("cloud_free"):
        record.cloud_free_image = str(root / image["cloud_free"])
    if image.get("after_image") or image.get("change_mask"):
        if not (image.get("after_image") and image.get("change_mask")):
            raise ValueError("after_image and change_mask go together (the pair's image 2 and its change label)")
        record.after_image = str(root / image["after_image"])
        record.change_mask = str(root / image["change_mask"])
    return record


def _object(annotation: dict, record: AnnotationRecord, labels: dict) -> ObjectAnnotation:
    if annotation.get("category_id") not in labels:
        raise ValueError(f"category_id {annotation.get('category_id')!r} is not in 'categories'")
    box = annotation.get("bbox")
    if not isinstance(box, list) or len(box) != 4 or not all(_is_number(v) for v in box) or min(box[2:]) <= 0:
        raise ValueError("bbox must be [x, y, width, height] in pixels with a positive size")
    w, h = record.width, record.height
    x, y, bw, bh = box
    polygon = None
    if annotation.get("segmentation"):
        parts = annotation["segmentation"]
        outline = _points(parts[0] if isinstance(parts, list) and parts else None, "segmentation")
        polygon = tuple((px / w, py / h) for px, py in outline)
    unit = (max(0.0, x / w), max(0.0, y / h), min(1.0, (x + bw) / w), min(1.0, (y + bh) / h))
    return ObjectAnnotation(labels[annotation["category_id"]], unit, polygon, object_id=str(annotation.get("id")))


@dataclass
class ExampleSet:
    path: Path
    records: list[AnnotationRecord]
    by_pixels: dict[str, AnnotationRecord]  # picture digest -> its record (a cloud-free pair maps to its scene)

    @classmethod
    def read(cls, path: str | Path) -> ExampleSet:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ExampleAnnotationsError(f"{path}: cannot be read ({type(err).__name__})") from None
        data, lines = _entries_with_lines(text, path)
        for section in SECTIONS:
            if not isinstance(data.get(section, []), list):
                raise ExampleAnnotationsError(f"{path}: {section!r} must be a list")
        root = path.parent

        def checked(section: str, build):
            for index, entry in enumerate(data.get(section, [])):
                try:
                    if not isinstance(entry, dict):
                        raise ValueError("must be a JSON object")
                    build(entry)
                except (KeyError, TypeError, ValueError) as err:
                    problem = f"missing key {err}" if isinstance(err, KeyError) else str(err)
                    raise ExampleAnnotationsError(
                        f"{path}:{lines[section][index]}: {section} entry: {problem}"
                    ) from None

        labels: dict = {}
        checked("categories", lambda c: labels.__setitem__(c["id"], _name(c["name"])))
        land_cover = {int(k): _name(v) for k, v in data.get("land_cover_classes", {}).items()}
        records: dict = {}
        by_pixels: dict[str, AnnotationRecord] = {}

        def add_image(entry: dict) -> None:
            record = records[entry["id"]] = _record(entry, root, land_cover)
            for picture in (record.image, record.cloud_free_image):
                if picture is not None:
                    by_pixels[pixel_digest(_load(picture))] = record

        checked("images", add_image)
        checked("annotations", lambda a: _image(records, a).objects.append(_object(a, _image(records, a), labels)))
        checked("refs", lambda r: _image(records, r).referring.append(_referring(r, _image(records, r))))
        return cls(path, list(records.values()), by_pixels)

    def record_for(self, image: LoadedImage) -> AnnotationRecord:
        record = self.by_pixels.get(pixel_digest(image))
        if record is None:
            raise GeoPilotInputError(f"{NO_ANNOTATIONS} (the example tools know only the images of {self.path})")
        return record


def _name(value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("a class name must be a non-empty string")
    return value.strip()


def _image(records: dict, entry: dict) -> AnnotationRecord:
    if entry.get("image_id") not in records:
        raise ValueError(f"image_id {entry.get('image_id')!r} is not in 'images'")
    return records[entry["image_id"]]


def _referring(ref: dict, record: AnnotationRecord) -> ReferringExpression:
    ids = [obj.object_id for obj in record.objects]
    wanted = [str(i) for i in ref["ann_ids"]]
    if not wanted or any(i not in ids for i in wanted):
        raise ValueError(f"ann_ids {ref['ann_ids']} must name annotations of image {ref['image_id']}")
    sentences = [s["sent"] if isinstance(s, dict) else s for s in ref["sentences"]]
    if not sentences or not all(isinstance(s, str) and s.strip() for s in sentences):
        raise ValueError("sentences must be non-empty strings")
    return ReferringExpression(sentences[0], tuple(ids.index(i) for i in wanted))


def _load(picture: str) -> LoadedImage:
    try:
        return load_image(picture)
    except GeoPilotInputError as err:  # named with the line of its `images` entry
        raise ValueError(f"image {picture}: {err}") from None


def pixel_digest(image: LoadedImage) -> str:
    """The picture as the tools see it, hashed: the same file, upload or artefact gives the same digest."""
    picture = image.image
    return hashlib.sha256(f"{picture.size}".encode() + picture.tobytes()).hexdigest()


class ExampleAnnotationsBackend:
    """All ten tools over the example set: the image's record answers, through `AnnotationBackend`."""

    def __init__(self, examples: ExampleSet):
        self.examples = examples

    def run(self, tool: str, image: LoadedImage, params: BaseModel, **images: list[LoadedImage]) -> ToolOutput:
        record = self.examples.record_for(image)
        several = images.get("images") or []
        if len(several) > 1 and record.after_image is not None:
            if pixel_digest(several[1]) != pixel_digest(_load(record.after_image)):
                raise GeoPilotInputError(
                    f"image 2 is not the after image annotated for {record.record_id} ({Path(record.after_image).name})"
                )
        try:
            return AnnotationBackend(record).run(tool, image, params)
        except AnnotationMissingError:  # the annotations hold none of this kind: the truthful answer is "none"
            return ToolOutput(provenance=PROVENANCE, message=f"nothing of this kind is annotated in {record.record_id}")
