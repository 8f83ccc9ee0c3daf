"""The chain suite `chains_v1` (docs/chains.md): 124 two-step planning cases over four chain kinds, optical and SAR,
scored by the planning scorer (order, params per step, the answer's numbers) with chain breakdowns.

  chain_cloud_detection         40  remove_clouds -> detect_objects on "result:1"; truth: the class count
  chain_grounding_segmentation  30  ground -> segment_referring; truth: the referent's mask area in %
  chain_detection_in_region     30  detect_objects -> segment_semantic with objects "result:1"; truth: inside/outside
  chain_sar_detection_counting  24  sar_detect_all, then the count by class (SAR); truth: each class's count

Scenes come from `geopilot.data_gen.synthetic.scenes` with seed 28 (training's synthetic data uses other seeds), and
the query templates are written apart from data_gen's chain templates (a test checks no query is shared). Ground
truth is computed from the scenes' annotations, independently of the tools (the label map is read pixel by pixel).
Written next to the case file: `chain_images/` and `<stem>.annotations.json`, the records the annotation-backed tool
layer answers from (`geopilot.eval.toolkit.annotation_layer`). The case file is a pure function of the seed, so
`geopilot eval build-chains --out FILE` rebuilds the frozen `data/chains_v1.jsonl` byte for byte.
"""

from __future__ import annotations

import json
import random
from importlib import resources
from pathlib import Path

import numpy as np
from PIL import Image

from geopilot.data_gen.synthetic.scenes import SIZE, optical_scene, sar_picture, sar_scene
from geopilot.eval.cases import write_case_file
from geopilot.vocabulary import canonical_class, dataset_classes

VERSION = "chains_v1"
SEED = 28
DATA = Path(str(resources.files("geopilot.eval") / "data"))
CHAINS_FILE = DATA / f"{VERSION}.jsonl"
CHAINS_MANIFEST = DATA / f"{VERSION}.json"
IMAGES = "chain_images"
OPTICAL_SCENES, SAR_SCENES = 10, 8
COUNTS = {"cloud_detection": 40, "grounding_segmentation": 30, "detection_in_region": 30, "sar_detection_counting": 24}
DIFFICULTY = {"cloud_detection": "medium", "grounding_segmentation": "medium", "detection_in_region": "hard"}

QUERIES = {
    "cloud_detection": [
        "A cloud layer spoils this tile. Get rid of it, then tell me the number of {t}.",
        "First de-cloud this picture, and after that tally the {t}.",
        "Under the haze there should be some {t}; clean the image up and count them.",
        "Please restore the ground beneath the clouds and report how many {t} you see.",
    ],
    "grounding_segmentation": [
        "Pinpoint {e} and then cut out its mask; what share of the tile is it?",
        "I need {e} found and traced pixel by pixel, with its footprint as a percentage.",
        "Spot {e}, segment it, and give its coverage of the frame.",
    ],
    "detection_in_region": [
        "Of all the {t} here, how many stand in {c} and how many do not?",
        "Split the {t} into those located in {c} and the rest, with counts.",
        "Work out how many {t} fall within the {c} zones versus outside them.",
    ],
    "sar_detection_counting": [
        "Break down the radar targets in this tile by type, with a count for each.",
        "For this SAR frame, how many targets of every category are present?",
        "Produce a count per object class for this radar scene.",
    ],
}
OPENERS = ["", "", "Hi. ", "Quick one: ", "Please. "]


def _plural(label: str) -> str:
    return label if label.endswith("s") else label + "s"


def _scenes():
    optical = [optical_scene(np.random.default_rng([SEED, 0, i])) for i in range(OPTICAL_SCENES)]
    sar = [sar_scene(np.random.default_rng([SEED, 1, i]), sixteen_bit=False) for i in range(SAR_SCENES)]
    return optical, sar


def _unit_box(bounds) -> list[float]:
    return [round(min(max(v / SIZE, 0.0), 1.0), 4) for v in bounds]


def _records(optical, sar) -> list[dict]:
    """The annotation records of every image (paths relative to the case file's folder), as the tool layer reads
    them: objects (canonical labels, boxes, outlines), the referring expression, the label map, the clean pair."""
    oem = dict(enumerate(dataset_classes("OpenEarthMap"), start=1))
    records = []
    for i, scene in enumerate(optical):
        objects = [
            {
                "label": canonical_class(o.label, "DOTA v1.0"),
                "box": _unit_box(o.bounds),
                "polygon": [[round(x / SIZE, 4), round(y / SIZE, 4)] for x, y in o.outline],
            }
            for o in scene.objects
        ]
        referring = [] if scene.referring is None else [[phrase, [scene.referring[0]]] for phrase in scene.referring[1]]
        common = {"objects": objects, "referring": referring, "width": SIZE, "height": SIZE, "modality": "optical"}
        semantic = {"mask_path": f"{IMAGES}/landcover_{i:02d}.png", "class_names": {str(k): v for k, v in oem.items()}}
        records.append(
            {"image": f"{IMAGES}/optical_{i:02d}.jpg", "semantic": semantic, **common}
        )  # the clean scene (also the cloud-free pair)
        records.append(
            {"image": f"{IMAGES}/cloudy_{i:02d}.jpg", "cloud_free_image": f"{IMAGES}/optical_{i:02d}.jpg", **common}
        )
    for i, scene in enumerate(sar):
        objects = [
            {"label": canonical_class(o.label, "SARDet-100K"), "box": _unit_box(o.bounds)} for o in scene.objects
        ]
        records.append(
            {"image": f"{IMAGES}/sar_{i:02d}.jpg", "objects": objects, "width": SIZE, "height": SIZE, "modality": "sar"}
        )
    return records


def write_images(folder: Path, optical, sar) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, scene in enumerate(optical):
        Image.fromarray(scene.image).save(folder / f"optical_{i:02d}.jpg", quality=85)
        Image.fromarray(scene.cloudy).save(folder / f"cloudy_{i:02d}.jpg", quality=85)
        Image.fromarray(scene.landcover).save(folder / f"landcover_{i:02d}.png")
    for i, scene in enumerate(sar):
        Image.fromarray(sar_picture(scene.amplitude)).save(folder / f"sar_{i:02d}.jpg", quality=85)


def _inside(scene, label: str, code: int) -> tuple[int, int]:
    """(inside, outside) of the objects of `label` whose box centre is on a pixel of land-cover `code`."""
    inside = outside = 0
    for obj in scene.objects:
        if canonical_class(obj.label, "DOTA v1.0") != label:
            continue
        x1, y1, x2, y2 = _unit_box(obj.bounds)
        cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
        row, col = min(int(round(cy, 3) * SIZE), SIZE - 1), min(int(round(cx, 3) * SIZE), SIZE - 1)
        if scene.landcover[row, col] == code:
            inside += 1
        else:
            outside += 1
    return inside, outside


def _check(tool: str, field: str, op: str, value) -> dict:
    return {"tool": tool, "field": field, "op": op, "value": value}


def _case(kind: str, k: int, query: str, image: str, modality: str, tools, checks, truth, calls) -> dict:
    return {
        "id": f"chain_{kind}/{k:03d}",
        "query": query,
        "image": image,
        "modality": modality,
        "category": f"chain_{kind}",
        "difficulty": DIFFICULTY.get(kind, "easy"),
        "expected_tools": tools,
        "param_checks": checks,
        "ground_truth": truth,
        "max_rounds": len(tools),
        "reference_calls": calls,
        "chain": True,
    }


def build_chain_cases(optical, sar) -> list[dict]:
    oem = {v: k for k, v in enumerate(dataset_classes("OpenEarthMap"), start=1)}
    cases, seen = [], set()
    for kind, total in COUNTS.items():
        for k in range(total):
            for attempt in range(100):
                rng = random.Random(f"{VERSION}/{kind}/{k}/{attempt}")
                template = rng.choice(QUERIES[kind])
                if kind == "sar_detection_counting":
                    i = k % len(sar)
                    counts: dict[str, int] = {}
                    for obj in sar[i].objects:
                        label = canonical_class(obj.label, "SARDet-100K")
                        counts[label] = counts.get(label, 0) + 1
                    query = template
                    args = (f"{IMAGES}/sar_{i:02d}.jpg", "sar", ["sar_detect_all"], [])
                    truth = [{"label": label, "value": n} for label, n in sorted(counts.items())]
                    calls = [{"tool": "sar_detect_all"}]
                else:
                    pool = [j for j, s in enumerate(optical) if s.referring or kind != "grounding_segmentation"]
                    i = pool[k % len(pool)]
                    scene = optical[i]
                    stem = "cloudy" if kind == "cloud_detection" else "optical"  # the cloud chain: the cloudy copy
                    image = f"{IMAGES}/{stem}_{i:02d}.jpg"
                    labels = sorted({canonical_class(o.label, "DOTA v1.0") for o in scene.objects})
                    if kind == "cloud_detection":
                        label = rng.choice(labels)
                        n = sum(canonical_class(o.label, "DOTA v1.0") == label for o in scene.objects)
                        query = template.format(t=_plural(label))
                        second = {"categories": [label], "image": "result:1"}
                        tools = ["remove_clouds", "detect_objects"]
                        checks = [
                            _check("detect_objects", "categories", "any_of", [label]),
                            _check("detect_objects", "image", "equals", "result:1"),
                        ]
                        truth = [{"label": label, "value": n}]
                        calls = [{"tool": "remove_clouds"}, {"tool": "detect_objects", "params": second, "round": 2}]
                    elif kind == "grounding_segmentation":
                        index, phrases = scene.referring
                        expression = rng.choice(phrases)
                        obj = scene.objects[index]
                        area = _polygon_area_pct(obj.outline)
                        noun = canonical_class(obj.label, "DOTA v1.0")
                        query = template.format(e=expression)
                        tools = ["ground", "segment_referring"]
                        checks = [_check(tool, "expression", "any_of", [noun]) for tool in tools]
                        truth = [{"label": "area", "value": area, "tolerance": round(max(0.02, 0.1 * area), 2)}]
                        calls = [
                            {"tool": "ground", "params": {"expression": expression}},
                            {"tool": "segment_referring", "params": {"expression": expression}, "round": 2},
                        ]
                    else:  # detection_in_region
                        label = rng.choice(labels)
                        present = sorted(
                            {oem_name for oem_name, code in oem.items() if (scene.landcover == code).any()}
                        )
                        region = rng.choice([r for r in present if r not in ("building", "road")] or present)
                        inside, outside = _inside(scene, label, oem[region])
                        query = template.format(t=_plural(label), c=region)
                        tools = ["detect_objects", "segment_semantic"]
                        checks = [
                            _check("detect_objects", "categories", "any_of", [label]),
                            _check("segment_semantic", "classes", "any_of", [region]),
                            _check("segment_semantic", "objects", "equals", "result:1"),
                        ]
                        truth = [{"label": "inside", "value": inside}, {"label": "outside", "value": outside}]
                        calls = [
                            {"tool": "detect_objects", "params": {"categories": [label]}},
                            {
                                "tool": "segment_semantic",
                                "params": {"classes": [region], "objects": "result:1"},
                                "round": 2,
                            },
                        ]
                    args = (image, "optical", tools, checks)
                text = rng.choice(OPENERS) + query
                if text not in seen:
                    break
            seen.add(text)
            cases.append(_case(kind, k, text, *args, truth, calls))
    return cases


def _polygon_area_pct(outline) -> float:
    """The referent's mask area in % of the image: its annotated polygon filled by the COCO rule (pycocotools)."""
    from pycocotools import mask as mask_utils

    flat = [round(v / SIZE, 4) * SIZE for point in outline for v in point]
    rle = mask_utils.merge(mask_utils.frPyObjects([flat], SIZE, SIZE))
    return round(100 * float(mask_utils.area(rle)) / SIZE**2, 2)


def write_chains(out: str | Path) -> dict:
    """Write the suite to `out` (JSONL), its images and annotations next to it; returns the manifest."""
    out = Path(out)
    optical, sar = _scenes()
    out.parent.mkdir(parents=True, exist_ok=True)
    write_images(out.parent / IMAGES, optical, sar)
    annotations = out.with_name(out.stem + ".annotations.json")
    annotations.write_text(json.dumps(_records(optical, sar), indent=1) + "\n", encoding="utf-8")
    cases = build_chain_cases(optical, sar)
    return write_case_file(out, cases, VERSION, ("category", "modality"))


def frozen_manifest() -> dict:
    return json.loads(CHAINS_MANIFEST.read_text(encoding="utf-8"))
