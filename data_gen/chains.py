"""Two-step tool chains for the generated data (docs/chains.md): which records can feed each chain kind, how many
chain jobs a run plans (a share of each stage: optical = stage 1, SAR = stage 2), and the trace of one chain.

A chain trace is user -> think (call 1) -> tool -> think (call 2, reading call 1's output by `result:1`) -> tool ->
answer. Its tool turns are the ground truth of the annotation-backed registry, run through a `ChatCalls` exactly as
the agent loop runs them (so references, `computed_on` and the objects-in-regions counts are the inference ones);
its answer is computed from the two outputs. Kinds:

  cloud_detection         remove_clouds -> detect_objects on the restored image (synthetic clouds over an annotated
                          optical scene, or a source's own cloudy / clear pair that also has objects)
  grounding_segmentation  ground -> segment_referring of the same referent (its area)
  detection_in_region     detect_objects -> segment_semantic with `objects: result:1` (how many inside / outside a
                          land-cover class); records with objects and a label map, or two sources' records of the
                          same pixels joined (the synthetic DOTA and OpenEarthMap scenes)
  sar_detection_counting  sar_detect_all, then the count by class (one call; the second step is the counting)

Chain texts are written here from templates (whatever the run's LLM backend), apart from the eval chain suite's.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from PIL import Image
from pydantic import Field, field_validator

from geopilot.config import StrictConfig
from geopilot.data_gen.abilities import _has_referring_masks, _named, _object_has_mask
from geopilot.data_gen.wording import wrap
from geopilot.records import AnnotationRecord, SemanticSegmentation
from geopilot.sample import IMAGE_PLACEHOLDER, Action, AssistantMessage, ToolMessage, UserMessage
from geopilot.tool_output import ToolOutput

CHAIN_PREFIX = "chain_"  # a chain sample's ability is CHAIN_PREFIX + kind


@dataclass(frozen=True)
class ChainKind:
    name: str
    modality: str
    tools: tuple[str, ...]


CHAIN_KINDS: dict[str, ChainKind] = {
    kind.name: kind
    for kind in [
        ChainKind("cloud_detection", "optical", ("remove_clouds", "detect_objects")),
        ChainKind("grounding_segmentation", "optical", ("ground", "segment_referring")),
        ChainKind("detection_in_region", "optical", ("detect_objects", "segment_semantic")),
        ChainKind("sar_detection_counting", "sar", ("sar_detect_all",)),
    ]
}
CHAIN_ABILITIES = {CHAIN_PREFIX + name for name in CHAIN_KINDS}
REGION_CLASSES = ("water", "tree", "rangeland", "agriculture land", "developed space", "bareland")


class ChainsConfig(StrictConfig):
    # chain samples as a share of each stage's samples (optical = stage 1, SAR = stage 2); 0 = no chains
    share: float = Field(default=0.0, ge=0.0, lt=1.0)
    kinds: list[str] = Field(default_factory=lambda: list(CHAIN_KINDS))

    @field_validator("kinds")
    @classmethod
    def _known(cls, kinds: list[str]) -> list[str]:
        unknown = sorted(set(kinds) - set(CHAIN_KINDS))
        if unknown:
            raise ValueError(f"unknown chain kinds {unknown}; choose from {', '.join(CHAIN_KINDS)}")
        return kinds


# ---- planning ------------------------------------------------------------------------------------------------


def _absolute(record: AnnotationRecord, root: Path) -> AnnotationRecord:
    """The record with its file paths absolute, so records of different sources can be joined and moved."""

    def full(path: str | None) -> str | None:
        return None if path is None or Path(path).is_absolute() else str(root / path)

    semantic = record.semantic
    if semantic is not None and not Path(semantic.mask_path).is_absolute():
        semantic = replace(semantic, mask_path=full(semantic.mask_path))
    return replace(
        record,
        image=full(record.image) or record.image,
        cloud_free_image=full(record.cloud_free_image) or record.cloud_free_image,
        semantic=semantic,
    )


def _pixels_key(path: str) -> str | None:
    from geopilot.image import load_image

    try:
        return hashlib.sha256(np.asarray(load_image(path).image).tobytes()).hexdigest()
    except Exception:  # noqa: BLE001 - an unreadable image simply joins nothing
        return None


def _region_records(records: list[AnnotationRecord]) -> list[AnnotationRecord]:
    """Records with objects and a label map: their own, or joined from two records of identical pixels."""
    both = [r for r in records if r.semantic is not None and _named(r) and r.modality == "optical"]
    maps = [r for r in records if r.semantic is not None and not _named(r) and r.modality == "optical"]
    if not maps:
        return both
    by_pixels: dict[str, SemanticSegmentation] = {}
    for record in maps:
        key = _pixels_key(record.image)
        if key is not None:
            by_pixels.setdefault(key, record.semantic)
    for record in records:
        if record.semantic is None and record.modality == "optical" and _named(record):
            key = _pixels_key(record.image)
            if key in by_pixels:
                both.append(replace(record, semantic=by_pixels[key]))
    return both


def chain_candidates(records: list[AnnotationRecord], kinds: list[str]) -> dict[str, list[AnnotationRecord]]:
    """Per chain kind, the records (paths absolute) that can feed it, in a fixed order."""
    optical_objects = [r for r in records if r.modality == "optical" and _named(r)]
    found = {
        "cloud_detection": optical_objects,
        "grounding_segmentation": [r for r in records if r.modality == "optical" and _has_referring_masks(r)],
        "detection_in_region": _region_records(records) if "detection_in_region" in kinds else [],
        "sar_detection_counting": [r for r in records if r.modality == "sar" and _named(r)],
    }
    return {kind: sorted(found[kind], key=lambda r: (r.source, r.record_id)) for kind in kinds}


def chain_targets(single_jobs: Counter, share: float) -> dict[str, int]:
    """Chain jobs per modality so that they are `share` of that stage's samples."""
    return {mod: round(share * n / (1.0 - share)) for mod, n in single_jobs.items()}


def assign(candidates: dict[str, list], target: int, per_record: int) -> list[tuple[str, AnnotationRecord, int]]:
    """`target` (kind, record, k) triples, round-robin over the kinds, each record used up to `per_record` times."""
    kinds = [k for k, c in candidates.items() if c]
    used: Counter = Counter()
    picked = []
    while len(picked) < target and kinds:
        for kind in list(kinds):
            if len(picked) == target:
                break
            n, pool = used[kind], candidates[kind]
            if n >= len(pool) * per_record:
                kinds.remove(kind)
                continue
            picked.append((kind, pool[n % len(pool)], n // len(pool)))
            used[kind] += 1
    return picked


# ---- one chain trace -----------------------------------------------------------------------------------------


def add_clouds(pixels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Synthetic clouds (smooth noise, white) over an (H, W, 3) uint8 image, as `synthetic.scenes` draws them."""
    height, width = pixels.shape[:2]
    coarse = Image.fromarray((rng.random((6, 6)) * 255).astype(np.uint8)).resize((width, height), Image.BICUBIC)
    cloud = np.clip((np.asarray(coarse, dtype=np.float64) / 255.0 - 0.45) * 3.0, 0.0, 1.0)[..., None]
    return np.clip(pixels * (1 - cloud) + 240.0 * cloud, 0, 255).astype(np.uint8)


def cloudy_record(record: AnnotationRecord, folder: Path, name: str, seed: int) -> AnnotationRecord:
    """The record under synthetic clouds: image = a cloudy copy written to `folder`, cloud-free = the original."""
    if record.cloud_free_image is not None:  # the source's own pair
        return record
    from geopilot.image import load_image

    path = folder / f"{name}.png"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        clean = np.asarray(load_image(record.image).image)
        Image.fromarray(add_clouds(clean, np.random.default_rng(seed))).save(path)
    return replace(record, image=str(path.resolve()), cloud_free_image=str(Path(record.image).resolve()))


def _spoken(label: str, rng: random.Random) -> str:
    """The class as people say it: the canonical name or, half the time, one of its synonyms (params stay canonical)."""
    from geopilot.vocabulary import class_synonyms

    names = class_synonyms(label)
    return rng.choice(names) if names and rng.random() < 0.5 else label


def plural(label: str) -> str:
    return label if label.endswith("s") else label[:-1] + "ies" if label.endswith("y") else label + "s"


def _count_phrase(n: int, label: str) -> str:
    return f"{n} {label if n == 1 else plural(label)}"


QUERIES = {  # worded apart from the chain suite's (eval/chain_set.py; a test checks)
    "cloud_detection": [
        "This tile is partly covered by clouds. Clear them first, then count the {t}.",
        "Clouds hide some of the ground here; remove them and tell me how many {t} there are.",
        "How many {t} are under the clouds in this image?",
        "Take the haze off this scene and then detect the {t}.",
        "Remove the cloud cover, then find every {one} on the cleared image.",
        "The clouds are in the way. Once they are gone, how many {t} can you see?",
        "Could you clean up this cloudy image and then box the {t}?",
        "Strip the clouds from this tile and count the {t} underneath.",
        "I can't see the {t} through the clouds; clear the view and count them.",
        "Make this image cloud-free, then locate the {t} in it.",
    ],
    "grounding_segmentation": [
        "Locate {e}, then segment it and tell me how much of the image it covers.",
        "Find {e} and give me its exact outline and area.",
        "Where is {e}, and what fraction of the scene does its mask take up?",
        "Ground {e} first, then give me its pixel mask and its area.",
        "Show me where {e} is and measure how much of the tile it occupies.",
        "I want the outline of {e}: find it, segment it and report its coverage.",
        "Box {e}, then trace its exact shape and say what percentage of the image it fills.",
        "What area does {e} cover? Find it first, then segment it.",
    ],
    "detection_in_region": [
        "How many of the {t} lie on {c}, and how many elsewhere?",
        "Count the {t} that sit inside the {c} areas of this tile.",
        "Detect the {t} and tell me which of them are within {c}.",
        "Find the {t}, then check how many of them are on {c}.",
        "Are the {t} in {c} or outside it? Give me both counts.",
        "Which {t} are located in {c}? Detect them and place them against the {c} mask.",
        "Of the {t} in this image, how many are inside {c} regions and how many are not?",
        "Locate every {one} and tell me how many fall on {c}.",
    ],
    "sar_detection_counting": [
        "Count the targets in this SAR image class by class.",
        "How many of each kind of target does this SAR scene contain?",
        "Give me a per-class tally of the objects in this radar image.",
        "Detect the targets in this SAR tile and count them by category.",
        "What targets are in this SAR image, and how many of each?",
        "List the SAR targets here with a count for every class.",
        "Tally the objects in this radar scene, grouped by class.",
    ],
}
# the first think turn states the whole plan, so the next round can read what is left to do
PLANS = {
    "cloud_detection": [
        "Clouds cover the scene, so I first remove them and then detect the {t} on the restored image.",
        "The {t} are hidden under clouds: first remove_clouds, then detect_objects on its result.",
    ],
    "grounding_segmentation": [
        "I first locate the referent, then segment it to measure its area.",
        "Two steps: ground the referent, then segment it for its mask and area.",
    ],
    "detection_in_region": [
        "I first detect the {t}, then segment {c} and place them in it.",
        "Two steps: detect the {t}, then segment {c} with the detections to count those inside.",
    ],
}


@dataclass
class ChainStep:
    action: Action
    reasoning: str


def chain_steps(kind: str, record: AnnotationRecord, rng: random.Random) -> tuple[str, list[ChainStep], dict]:
    """(query, the planned calls with their reasoning, facts the answer is written from)."""
    template = rng.choice(QUERIES[kind])
    if kind == "cloud_detection":
        label = rng.choice(sorted({o.label for o in _named(record)}))
        query = template.format(t=plural(_spoken(label, rng)), one=_spoken(label, rng))
        return (
            wrap(query, rng),
            [
                ChainStep(Action(tool="remove_clouds"), rng.choice(PLANS[kind]).format(t=plural(label))),
                ChainStep(
                    Action(tool="detect_objects", params={"categories": [label], "image": "result:1"}),
                    f"The restored image is result 1; I detect the {plural(label)} on it.",
                ),
            ],
            {"label": label},
        )
    if kind == "grounding_segmentation":
        refs = [r for r in record.referring if all(_object_has_mask(record, i) for i in r.object_indices)]
        ref = rng.choice(refs)
        query = template.format(e=ref.expression)
        return (
            wrap(query, rng),
            [
                ChainStep(Action(tool="ground", params={"expression": ref.expression}), rng.choice(PLANS[kind])),
                ChainStep(
                    Action(tool="segment_referring", params={"expression": ref.expression}),
                    "It is found; now I segment it to measure its area.",
                ),
            ],
            {"expression": ref.expression},
        )
    if kind == "detection_in_region":
        label = rng.choice(sorted({o.label for o in _named(record)}))
        names = sorted(set(record.semantic.class_names.values()) & set(REGION_CLASSES)) or sorted(
            set(record.semantic.class_names.values()) - {"background", "unknown", "ignore"}
        )
        region = rng.choice(names)
        query = template.format(t=plural(_spoken(label, rng)), one=_spoken(label, rng), c=region)
        return (
            wrap(query, rng),
            [
                ChainStep(
                    Action(tool="detect_objects", params={"categories": [label]}),
                    rng.choice(PLANS[kind]).format(t=plural(label), c=region),
                ),
                ChainStep(
                    Action(tool="segment_semantic", params={"classes": [region], "objects": "result:1"}),
                    f"Now I segment {region} and place the detected objects of result 1 in it.",
                ),
            ],
            {"label": label, "region": region},
        )
    return (
        wrap(template, rng),
        [ChainStep(Action(tool="sar_detect_all"), "I detect every target, then count them by class.")],
        {},
    )


def chain_answer(kind: str, outputs: list[ToolOutput], facts: dict) -> tuple[str, str]:
    """(reasoning, answer) of the final turn, computed from the tool outputs."""
    if kind == "cloud_detection":
        n = len(outputs[1].detections)
        return (
            "Counted on the cloud-free image.",
            f"After removing the clouds I count {_count_phrase(n, facts['label'])}.",
        )
    if kind == "grounding_segmentation":
        found = outputs[1].detections
        if not found:
            return "The segmenter found nothing.", f"I could not find {facts['expression']}."
        area = 100 * sum(d.area or 0.0 for d in found)
        x1, y1, x2, y2 = found[0].box
        return (
            "From the grounded box and the mask area.",
            f"{facts['expression'][0].upper()}{facts['expression'][1:]} is at [{x1}, {y1}, {x2}, {y2}]; "
            f"its mask covers {area:.2f}% of the image.",
        )
    if kind == "detection_in_region":
        data = outputs[1].data or {}
        region, label = facts["region"], facts["label"]
        inside, outside = data.get("inside", {}).get(region, 0), data.get("outside", {}).get(region, 0)
        return (
            "From the objects placed in the class region.",
            f"{inside} of the {_count_phrase(inside + outside, label)} {'is' if inside == 1 else 'are'} inside "
            f"{region} and {outside} outside it.",
        )
    counts = Counter(d.label for d in outputs[0].detections)
    parts = [_count_phrase(n, label) for label, n in sorted(counts.items())]
    return "Counted by class from the detections.", ("By class: " + ", ".join(parts) + ".") if parts else "No targets."


def chain_messages(kind: str, record: AnnotationRecord, image, rng: random.Random) -> list:
    """The chain's messages, its tool turns run through the annotation registry with one ChatCalls."""
    from geopilot.tool_chains import ChatCalls
    from geopilot.tools.registry import annotation_registry

    registry, calls = annotation_registry(record), ChatCalls()
    query, steps, facts = chain_steps(kind, record, rng)
    messages: list = [UserMessage(content=f"{IMAGE_PLACEHOLDER}\n{query}")]
    outputs = []
    for step in steps:
        result = registry.call(step.action, image, record.modality, calls=calls)
        if not result.ok:
            raise ValueError(f"{step.action.tool}: {result.error}")
        calls.record(result, registry.params_key(step.action))
        calls.close_round()
        outputs.append(result.output)
        messages += [
            AssistantMessage(reasoning=step.reasoning, actions=[step.action]),
            ToolMessage(name=step.action.tool, content=result.output),
        ]
    reasoning, answer = chain_answer(kind, outputs, facts)
    messages.append(AssistantMessage(reasoning=reasoning, value=answer))
    return messages
