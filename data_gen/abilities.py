"""The abilities of the paper's Table 2 and what each one asks of a source annotation record.

`ABILITIES` is the one table: ability name -> the task-level tool it trains (per modality, docs/design.md §4), the Table 2
title, and which records can feed it. `plan_target` turns one record into the *target* of one sample: the canonical
tool call (params consistent with the annotation) plus the descriptive facts the query and answer are written from.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from geopilot.data_gen.change_traces import (
    CHANGE_CAPTIONING,
    CHANGE_DETECTION,
    CHANGE_TOOL,
    change_captions,
    has_change_label,
)
from geopilot.errors import GeoPilotInputError
from geopilot.records import AnnotationRecord, Dialogue, ReferringExpression
from geopilot.vocabulary import dataset_classes

DIFFICULTIES = ("easy", "medium", "hard")
# Share of category requests (detect_objects, segment_instances) that name one class of the source's class list that
# the image does not contain: users ask for what is not there too, and the answer then says so.
ABSENT_SHARE = 0.2
GENERAL = "general_understanding"


@dataclass(frozen=True)
class AbilitySpec:
    name: str
    title: str  # as in Table 2
    tools: dict[str, str | None]  # modality -> task-level tool (None: tool-free)
    applies: Callable[[AnnotationRecord], bool]


# Readers' placeholder labels, not categories: RiSBench has phrases and no class names ("object"); GeoChat's boxes
# that no phrase names ("region").
GENERIC_LABELS = {"object", "region"}


def _named(record: AnnotationRecord, with_mask: bool = False) -> list:
    return [
        o
        for o in record.objects
        if o.label not in GENERIC_LABELS and (not with_mask or o.mask is not None or o.polygon is not None)
    ]


def _has_objects(record: AnnotationRecord) -> bool:
    return bool(_named(record))


def _has_masks(record: AnnotationRecord) -> bool:
    return bool(_named(record, with_mask=True))


def _has_referring(record: AnnotationRecord) -> bool:
    return bool(record.referring) or bool(_unique_labels(record))


def _has_referring_masks(record: AnnotationRecord) -> bool:
    return any(all(_object_has_mask(record, i) for i in ref.object_indices) for ref in record.referring)


def _object_has_mask(record: AnnotationRecord, index: int) -> bool:
    if not 0 <= index < len(record.objects):
        return False
    obj = record.objects[index]
    return obj.mask is not None or obj.polygon is not None


ABILITIES: dict[str, AbilitySpec] = {
    spec.name: spec
    for spec in [
        AbilitySpec(
            GENERAL,
            "General Understanding",
            {"optical": None, "sar": None},
            lambda r: r.after_image is None and bool(r.dialogues),
        ),
        AbilitySpec(
            "panoptic_detection", "Panoptic Detection", {"optical": "detect_all", "sar": "sar_detect_all"}, _has_objects
        ),
        AbilitySpec("object_detection", "Object Detection", {"optical": "detect_objects"}, _has_objects),
        AbilitySpec("visual_grounding", "Visual Grounding", {"optical": "ground", "sar": "sar_ground"}, _has_referring),
        AbilitySpec(
            "semantic_segmentation",
            "Semantic Segmentation",
            {"optical": "segment_semantic"},
            lambda r: r.semantic is not None,
        ),
        AbilitySpec("instance_segmentation", "Instance Segmentation", {"optical": "segment_instances"}, _has_masks),
        AbilitySpec(
            "referring_segmentation", "Referring Segmentation", {"optical": "segment_referring"}, _has_referring_masks
        ),
        AbilitySpec("road_extraction", "Road Extraction", {"optical": "extract_roads"}, lambda r: r.roads is not None),
        AbilitySpec(
            "cloud_removal", "Cloud Removal", {"optical": "remove_clouds"}, lambda r: r.cloud_free_image is not None
        ),
        # two images (data_gen/change_traces.py): beyond the paper's Table 2
        AbilitySpec(CHANGE_DETECTION, "Change Detection", {"optical": CHANGE_TOOL}, has_change_label),
        AbilitySpec(CHANGE_CAPTIONING, "Change Captioning", {"optical": None}, lambda r: bool(change_captions(r))),
    ]
}
PAIR_ABILITIES = {CHANGE_DETECTION, CHANGE_CAPTIONING}  # samples of two images, written by data_gen/change_traces.py

# Tools whose params name categories / an expression / classes (docs/design.md §4); the rest take no params.
CATEGORY_TOOLS = {"detect_objects", "segment_instances"}
EXPRESSION_TOOLS = {"ground", "segment_referring", "sar_ground"}
CLASS_TOOLS = {"segment_semantic"}
DETECTION_TOOLS = {
    "detect_objects",
    "detect_all",
    "sar_detect_all",
    "ground",
    "sar_ground",
    "segment_instances",
    "segment_referring",
}

# GeoChat-Instruct's grounding task tokens and its box text `{<x1><y1><x2><y2>|<theta>}` (datasets_metrics §6).
GROUNDING_TASKS = {"refer", "grounding", "identify"}
_GROUNDING_TEXT = re.compile(r"\[(refer|grounding|identify)\]|\{<-?\d+>", re.IGNORECASE)


def supports(ability: str, record: AnnotationRecord) -> bool:
    spec = ABILITIES[ability]
    return record.modality in spec.tools and spec.applies(record)


def is_grounding_centred(dialogue: Dialogue) -> bool:
    """Paper §2.3.1: GeoChat samples whose core requirement is explicit grounding are filtered out."""
    if dialogue.task.strip("[] ").lower() in GROUNDING_TASKS:
        return True
    return any(_GROUNDING_TEXT.search(text) for _, text in dialogue.turns)


_COUNTING_TEXT = re.compile(r"\b(how many|number of)\b", re.IGNORECASE)


def is_counting_centred(dialogue: Dialogue) -> bool:
    """A dialogue that opens by asking how many objects there are: the detectors count them, so a tool-free trace
    of it would teach the model to guess counts where its tool policy says to call a detector."""
    first = next((text for role, text in dialogue.turns if role == "user"), "")
    return bool(_COUNTING_TEXT.search(first))


@dataclass
class Target:
    """What one sample is about: the canonical tool call and the facts its text is written from."""

    tool: str | None
    params: dict
    difficulty: str | None
    facts: dict = field(default_factory=dict)
    record: AnnotationRecord | None = None  # the record the tool runs on (may add a derived referring expression)


def _position_words(box: tuple[float, float, float, float]) -> str:
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    row = "upper" if cy < 1 / 3 else "lower" if cy > 2 / 3 else "middle"
    col = "left" if cx < 1 / 3 else "right" if cx > 2 / 3 else "centre"
    return "centre" if (row, col) == ("middle", "centre") else f"{row} {col}" if row != "middle" else f"middle {col}"


def _unique_labels(record: AnnotationRecord) -> list[int]:
    counts = Counter(o.label for o in record.objects)
    return [i for i, o in enumerate(record.objects) if counts[o.label] == 1 and o.label not in GENERIC_LABELS]


def _with_derived_expression(
    record: AnnotationRecord, rng: random.Random
) -> tuple[AnnotationRecord, ReferringExpression]:
    """Sources without referring expressions (SARDet-100K): refer to a one-of-a-kind object by class and position."""
    index = rng.choice(_unique_labels(record))
    obj = record.objects[index]
    ref = ReferringExpression(f"the {obj.label} in the {_position_words(obj.box)} of the image", (index,))
    return replace(record, referring=[*record.referring, ref]), ref


def _counts(record: AnnotationRecord, with_mask: bool = False) -> dict[str, int]:
    return dict(sorted(Counter(o.label for o in _named(record, with_mask)).items()))


def _source_classes(record: AnnotationRecord) -> list[str]:
    """The canonical classes of the record's source dataset (empty for a source the vocabulary does not know)."""
    try:
        return dataset_classes(record.source)
    except GeoPilotInputError:
        return []


def plan_target(ability: str, record: AnnotationRecord, rng: random.Random) -> Target:
    """The canonical call for one sample of `ability` on `record` (a tool-free ability returns tool None)."""
    spec = ABILITIES[ability]
    tool = spec.tools[record.modality]
    difficulty = rng.choice(DIFFICULTIES) if tool is not None else None
    facts: dict = {"image_size": [record.width, record.height]}
    params: dict = {}
    if tool in {"detect_all", "sar_detect_all"}:
        facts["counts"] = _counts(record)
    elif tool in CATEGORY_TOOLS:
        counts = _counts(record, with_mask=tool == "segment_instances")
        wanted = min(len(counts), 2 if difficulty == "hard" else 1)
        categories = rng.sample(sorted(counts), wanted)
        absent = sorted(set(_source_classes(record)) - set(counts))
        if absent and rng.random() < ABSENT_SHARE:
            categories[-1] = rng.choice(absent)
        categories = sorted(categories)
        params = {"categories": categories}
        facts["counts"] = {c: counts.get(c, 0) for c in categories}
    elif tool in EXPRESSION_TOOLS:
        candidates = (
            record.referring
            if tool != "segment_referring"
            else [r for r in record.referring if all(_object_has_mask(record, i) for i in r.object_indices)]
        )
        if candidates:
            ref = rng.choice(candidates)
        else:
            record, ref = _with_derived_expression(record, rng)
        params = {"expression": ref.expression}
        facts["expression"] = ref.expression
        facts["targets"] = len(ref.object_indices)
        facts["target_labels"] = sorted(
            {record.objects[i].label for i in ref.object_indices if i < len(record.objects)}
        )
    elif tool in CLASS_TOOLS:
        names = sorted(set(record.semantic.class_names.values()) - {"unknown", "ignore", "background"})
        wanted = min(len(names), {"easy": 1, "medium": 2, "hard": 3}[difficulty])
        params = {"classes": sorted(rng.sample(names, wanted))}
        facts["classes"] = params["classes"]
    elif tool == "extract_roads":
        facts["road_nodes"] = len(record.roads.nodes)
    return Target(tool=tool, params=params, difficulty=difficulty, facts=facts, record=record)


def class_names(record: AnnotationRecord) -> list[str]:
    """The class names a record's tool turns can carry: object labels (placeholders excluded) and semantic classes."""
    names = [o.label for o in _named(record)]
    if record.semantic is not None:
        names += list(record.semantic.class_names.values())
    return names


def vocabulary(record: AnnotationRecord) -> set[str]:
    """Every class name the record knows: a name from here in an answer must be backed by the tool output."""
    names = {o.label for o in record.objects}
    if record.semantic is not None:
        names |= set(record.semantic.class_names.values())
    return {n.lower() for n in names if n}
