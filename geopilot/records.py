"""The shared annotation schema: what every source-dataset reader produces, the annotation-backed tool backend
answers from, the generator consumes and evaluation scores against.

It lives in the core so `geopilot.tools`, `geopilot.data_gen` and `geopilot.eval` all import it from here and none
imports another through it. All geometry is normalised to [0, 1] by the reader (x by the image width, y by its
height), so one record serves every consumer without knowing its source.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from geopilot.sample import Modality


@dataclass(frozen=True)
class ObjectAnnotation:
    # canonical class name (geopilot/vocabulary.py: DOTA "small-vehicle" -> "small vehicle"); a name in no
    # vocabulary is kept verbatim (`is_known_class` False) and counted in the generation report
    label: str
    box: tuple[float, float, float, float]  # axis-aligned [x1, y1, x2, y2], normalised
    polygon: tuple[tuple[float, float], ...] | None = None  # oriented box / outline, normalised, >= 3 points
    mask: dict | None = None  # COCO RLE {"size": [h, w], "counts": str}
    difficult: bool = False
    object_id: str | None = None  # source id, when the source has one


@dataclass(frozen=True)
class ReferringExpression:
    expression: str
    object_indices: tuple[int, ...]  # indices into AnnotationRecord.objects; more than one = "multiple" target


@dataclass(frozen=True)
class SemanticSegmentation:
    mask_path: str  # single-channel label image in the source's on-disk format
    class_names: dict[int, str]  # pixel value -> class name
    ignore_values: tuple[int, ...] = ()


@dataclass(frozen=True)
class RoadGraphAnnotation:
    nodes: tuple[tuple[float, float], ...]  # normalised
    edges: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Dialogue:
    """Source text supervision (GeoChat-Instruct conversations, SARLANG-1M captions/QA)."""

    turns: tuple[tuple[str, str], ...]  # (role in {"user", "assistant"}, text)
    task: str = ""  # the source's own task tag ("caption", "vqa", "grounding", ...)


@dataclass
class AnnotationRecord:
    source: str  # dataset name as in the paper's Table 2 ("DOTA", "SARDet-100K", ...)
    image: str  # path to the image file (absolute, or relative to the reader's root)
    width: int
    height: int
    modality: Modality = "optical"
    split: str = "train"
    record_id: str = ""  # stable id within the source (image stem, plus a suffix when one image yields several)
    objects: list[ObjectAnnotation] = field(default_factory=list)
    referring: list[ReferringExpression] = field(default_factory=list)
    semantic: SemanticSegmentation | None = None
    roads: RoadGraphAnnotation | None = None
    cloud_free_image: str | None = None  # RICE: the paired clear image
    dialogues: list[Dialogue] = field(default_factory=list)
    # a bi-temporal pair (LEVIR-CD, LEVIR-CC): `image` is image 1 (before), `after_image` image 2, the same size
    after_image: str | None = None
    change_mask: str | None = None  # single-channel change label the size of the image, nonzero = changed


@dataclass
class ReadReport:
    """What a reader skipped, by cause: missing images, malformed files, bad polygons, unknown classes."""

    records: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)  # cause -> a few messages naming files
    layout: str = ""  # which of the source's distributed layouts the reader recognised (data_gen readers)
    detected: str = ""  # what the reader inferred that its options did not say, and why ("DOTA v2.0 (...)")

    repaired: dict[str, int] = field(default_factory=dict)  # items kept after a fix, by what was fixed

    def skip(self, cause: str, message: str) -> None:
        self.skipped[cause] = self.skipped.get(cause, 0) + 1
        self._example(cause, message)

    def repair(self, fix: str, message: str) -> None:
        """Count an item that is kept after `fix` (its examples sit beside the skip causes')."""
        self.repaired[fix] = self.repaired.get(fix, 0) + 1
        self._example(fix, message)

    def _example(self, key: str, message: str) -> None:
        self.examples.setdefault(key, [])
        if len(self.examples[key]) < 5:
            self.examples[key].append(message)
