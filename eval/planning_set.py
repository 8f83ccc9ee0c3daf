"""The GeoPilotBench planning set: 500 queries in the paper's proportions (§3.1, Table 6), each with an image.

Categories (cases; SAR cases): object detection 80, panoptic detection 50 (20 SAR), referring detection 70
(20 SAR), semantic segmentation 50, instance segmentation 50, referring segmentation 40, road extraction 30,
cloud removal 30 (on cloudy scenes), no tool 100 (30 SAR); in each category easy 40 %, medium 40 %, hard 20 %.
Templates and paraphrases here are written apart from data_gen's training templates (a test checks that no
query is shared and reports the n-gram overlap). Everything is a pure function of the image pools, so the frozen
file `data/planning_v1.jsonl` (hash in `data/planning_v1.json`) is rebuilt byte for byte from
`data/planning_images/` by `geopilot eval build-planning --images DIR --out FILE`.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
from PIL import Image

from geopilot.errors import GeoPilotInputError
from geopilot.eval.cases import write_case_file

VERSION = "planning_v1"
DATA = Path(str(resources.files("geopilot.eval") / "data"))
PLANNING_FILE = DATA / f"{VERSION}.jsonl"
PLANNING_MANIFEST = DATA / f"{VERSION}.json"
PLANNING_IMAGES = DATA / "planning_images"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff")
POOLS = ("optical", "cloudy", "sar")
# a `geopilot synth --out DIR` folder works as --images too: where each pool's images are in it
SYNTH_POOLS = {"optical": "DOTA/train/images", "cloudy": "RICE/RICE1/cloud", "sar": "SARDet-100K/JPEGImages/train"}
DIFFICULTY_SHARE = (("easy", 0.4), ("medium", 0.4), ("hard", 0.2))


@dataclass(frozen=True)
class CategorySpec:
    name: str
    total: int
    tools: dict[str, list[str]]  # modality -> expected tools
    sar: int = 0  # how many of the cases are SAR (spread 40/40/20 over the difficulties)


CATEGORIES: list[CategorySpec] = [
    CategorySpec("object_detection", 80, {"optical": ["detect_objects"]}),
    CategorySpec("panoptic_detection", 50, {"optical": ["detect_all"], "sar": ["sar_detect_all"]}, sar=20),
    CategorySpec("referring_detection", 70, {"optical": ["ground"], "sar": ["sar_ground"]}, sar=20),
    CategorySpec("semantic_segmentation", 50, {"optical": ["segment_semantic"]}),
    CategorySpec("instance_segmentation", 50, {"optical": ["segment_instances"]}),
    CategorySpec("referring_segmentation", 40, {"optical": ["segment_referring"]}),
    CategorySpec("road_extraction", 30, {"optical": ["extract_roads"]}),
    CategorySpec("cloud_removal", 30, {"optical": ["remove_clouds"]}),
    CategorySpec("no_tool", 100, {"optical": [], "sar": []}, sar=30),
]
CATEGORY_ORDER = [spec.name for spec in CATEGORIES]
CATEGORY_TITLES = {
    "object_detection": "Object Detection",
    "panoptic_detection": "Panoptic Detection",
    "referring_detection": "Referring Object Detection",
    "semantic_segmentation": "Sem. Segmentation",
    "instance_segmentation": "Inst. Segmentation",
    "referring_segmentation": "Ref. Segmentation",
    "road_extraction": "Road Extraction",
    "cloud_removal": "Cloud Removal",
    "no_tool": "No Tool (∅)",
}

# Surface forms (plural, as users write them) and the names a param check accepts for each target.
TARGETS = {
    "plane": (["planes", "aircraft", "airplanes", "jets"], ["plane", "aircraft", "airplane", "jet", "airliner"]),
    "ship": (["ships", "boats", "vessels"], ["ship", "boat", "vessel"]),
    "storage tank": (["storage tanks", "oil tanks", "fuel tanks"], ["storage tank", "oil tank", "fuel tank", "tank"]),
    "small vehicle": (
        ["cars", "small vehicles", "passenger cars"],
        ["small vehicle", "car", "vehicle", "passenger car"],
    ),
    "large vehicle": (["trucks", "large vehicles", "lorries"], ["large vehicle", "truck", "lorry", "vehicle"]),
    "tennis court": (["tennis courts"], ["tennis court", "court"]),
    "swimming pool": (["swimming pools", "pools"], ["swimming pool", "pool"]),
    "harbor": (["harbors", "harbours", "ports"], ["harbor", "harbour", "port"]),
    "bridge": (["bridges"], ["bridge"]),
    "helicopter": (["helicopters"], ["helicopter"]),
}
LANDCOVER = {
    "water": (["water", "open water", "water bodies"], ["water", "water body"]),
    "tree": (["trees", "forest", "woodland"], ["tree", "forest", "woodland"]),
    "building": (["buildings", "built-up land"], ["building", "built up land", "built up area"]),
    "agriculture": (
        ["farmland", "cropland", "agricultural land"],
        ["agriculture", "agriculture land", "agricultural land", "farmland", "cropland", "crop"],
    ),
    "rangeland": (["grassland", "rangeland"], ["rangeland", "grassland", "grass"]),
    "bareland": (["bare soil", "bare ground"], ["bareland", "bare land", "bare soil", "bare ground", "barren"]),
    "developed": (["paved areas", "impervious surfaces"], ["developed space", "paved area", "impervious surface"]),
}
OPTICAL_REFERENTS = {  # noun phrase -> names a param check accepts in the expression
    "white ship": ["ship", "boat", "vessel"],
    "largest storage tank": ["storage tank", "tank"],
    "plane": ["plane", "aircraft", "airplane", "jet"],
    "yellow truck": ["truck", "vehicle", "lorry"],
    "blue car": ["car", "vehicle"],
    "tennis court": ["tennis court", "court"],
    "swimming pool": ["swimming pool", "pool"],
    "red-roofed building": ["building", "house"],
    "smallest pool": ["pool"],
}
SAR_REFERENTS = {
    "brightest ship": ["ship", "vessel", "boat"],
    "aircraft": ["aircraft", "plane"],
    "round tank": ["tank"],
    "long bridge": ["bridge"],
    "harbor": ["harbor", "harbour", "port"],
    "parked car": ["car", "vehicle"],
}
POSITIONS = [
    "in the upper left",
    "near the lower right corner",
    "closest to the centre",
    "along the top edge",
    "on the right-hand side",
    "at the bottom of the frame",
    "in the left half",
    "just above the middle",
]
OPENERS = ["", "", "Quick question. ", "Hi! ", "Please help. ", "One more thing. ", "Hello. "]
CLOSERS = ["", "", " Thanks.", " Keep it brief.", " I appreciate it.", " Cheers."]

QUERIES: dict[str, dict[str, list[str]]] = {
    "object_detection": {
        "easy": [
            "Please detect all the {t} in this scene.",
            "Mark all {t} with bounding boxes.",
            "Run object detection for {t} on this tile.",
            "Put boxes on the {t} you can find here.",
            "Show me bounding boxes for each of the {t}.",
        ],
        "medium": [
            "What is the total number of {t} in this picture?",
            "Give me a tally of the {t} visible in the tile.",
            "Are any {t} present here? If so, where exactly?",
            "I'd like to know how many {t} this frame contains.",
            "Tell me the positions of all {t} in the scene.",
        ],
        "hard": [
            "Our team is auditing the site; could you tally up the {t} and say where each one sits?",
            "Check whether the number of {t} here exceeds five, and show them.",
            "For a traffic study I need every one of the {t} marked out; can you handle that?",
            "Something about the {t} here seems off to me; pinpoint all of them so I can review.",
        ],
    },
    "panoptic_detection": {
        "easy": [
            "Detect every object in this {m} scene, whatever its class.",
            "Run a full-vocabulary detection on this tile.",
            "Box all objects of any category in this {m} picture.",
            "List each detectable object here with its box.",
        ],
        "medium": [
            "What kinds of targets does this {m} tile contain, and where are they?",
            "Catalogue the objects present in this scene.",
            "Give me a breakdown of all the object classes visible here, with locations.",
            "Which objects show up in this {m} frame?",
        ],
        "hard": [
            "I'm not sure what's in this {m} tile; survey it and report everything you detect.",
            "Prepare a complete object register for this scene before our field visit.",
            "Without knowing what to look for, tell me every target present and its position.",
        ],
    },
    "referring_detection": {
        "easy": [
            "Find {e} and give its bounding box.",
            "Box {e}.",
            "Return the box of {e}.",
            "Localise {e} in the tile.",
        ],
        "medium": [
            "Whereabouts is {e}?",
            "Could you point out {e} for me?",
            "In which part of the frame can I see {e}?",
            "Show the location of {e}.",
        ],
        "hard": [
            "My colleague mentioned {e}; can you find it so I can verify her note?",
            "Before I crop the tile, I need {e} boxed precisely.",
            "There should be {e} somewhere here; locate it if it exists.",
        ],
    },
    "semantic_segmentation": {
        "easy": [
            "Produce a land-cover map showing {c}.",
            "Run semantic segmentation for {c} on this tile.",
            "Label every pixel that is {c}.",
            "Create a class map of {c} for this image.",
        ],
        "medium": [
            "What fraction of the tile is {c}?",
            "Which portions of this image are {c}?",
            "Roughly what percentage of the area is {c}?",
            "Show me the extent of {c} here.",
        ],
        "hard": [
            "We're drafting a zoning plan; how much {c} does this tile hold?",
            "Is {c} the dominant cover here? Back it up with a pixel-level map.",
            "Compare the coverage of {c} with the rest of the tile.",
        ],
    },
    "instance_segmentation": {
        "easy": [
            "Produce an instance mask for each of the {t}.",
            "Give every one of the {t} its own segmentation mask.",
            "Run instance segmentation on the {t} in this tile.",
        ],
        "medium": [
            "How big is each of the {t}, object by object?",
            "Separate the {t} into individual masks and report their areas.",
            "Can you delineate the {t} one at a time?",
        ],
        "hard": [
            "Our insurer wants the footprint of every single one of the {t}; can you work that out?",
            "I need to know which of the {t} is largest; measure each one individually.",
            "Estimate the area occupied by each of the {t} separately.",
        ],
    },
    "referring_segmentation": {
        "easy": ["Produce a mask for {e}.", "Isolate {e} as a binary mask.", "Give me the pixel mask of {e}."],
        "medium": [
            "Which region does {e} occupy, pixel by pixel?",
            "Trace the exact boundary of {e}.",
            "How much area does {e} take up?",
        ],
        "hard": [
            "I want to measure {e} precisely; extract its exact shape.",
            "Cut {e} out of the tile so I can compute its footprint.",
        ],
    },
    "road_extraction": {
        "easy": [
            "Extract the roads as a graph.",
            "Pull out the street network from this tile.",
            "Trace the road centrelines in this scene.",
            "Vectorise the roads visible here.",
        ],
        "medium": [
            "How many junctions does the street network have?",
            "Is the road network in this tile connected?",
            "Which roads cross each other here?",
            "Describe the layout of the streets in this scene.",
        ],
        "hard": [
            "An ambulance needs to get from one edge of this tile to the other; which streets could it take?",
            "Would a new warehouse here have good road access? Analyse the street layout.",
            "Assess how well connected the local streets are.",
        ],
    },
    "cloud_removal": {
        "easy": [
            "Strip the cloud cover from this scene.",
            "Run cloud removal on this image.",
            "Produce a cloudless version of this tile.",
            "Get rid of the clouds over this area.",
        ],
        "medium": [
            "The ground is obscured by clouds; what does it look like underneath?",
            "Can I get this scene without the haze?",
            "Restore the surface hidden beneath the cloud layer.",
        ],
        "hard": [
            "Clear the clouds first, then count the {t} underneath.",
            "After removing the haze, find any {t} in the scene.",
            "Once the cloud cover is gone, locate the {t} for me.",
        ],
    },
    "no_tool": {
        "easy": [
            "Is this an optical or a radar image?",
            "Describe this tile in one sentence.",
            "What is the main land cover in this picture?",
            "Is this scene urban or rural?",
            "Does this tile show a coastline?",
        ],
        "medium": [
            "What might this area be used for?",
            "Would you say this image was taken over a city or countryside?",
            "What kind of terrain does this tile cover?",
            "Summarise what this {m} tile shows.",
        ],
        "hard": [
            "Based on its appearance alone, is this scene more likely industrial or residential, and why?",
            "What sensor type probably captured this tile, and what gives it away?",
            "Without running any analysis tools, give me your overall impression of this area.",
        ],
    },
}
COMPOUND_TARGETS = ["plane", "ship", "storage tank", "small vehicle", "large vehicle"]  # cloud removal, hard


def image_pools(images: str | Path) -> dict[str, list[Path]]:
    """The images to draw from, by pool: DIR/{optical,cloudy,sar}/ or a `geopilot synth` output folder."""
    root = Path(images)
    if not root.is_dir():
        raise GeoPilotInputError(f"--images {str(root)!r} is not a folder")
    layout = SYNTH_POOLS if (root / "synth_manifest.json").is_file() else {pool: pool for pool in POOLS}
    pools = {}
    for pool, sub in layout.items():
        folder = root / sub
        files = sorted(p for p in folder.glob("*") if p.suffix.lower() in IMAGE_SUFFIXES) if folder.is_dir() else []
        if not files:
            raise GeoPilotInputError(f"--images {str(root)!r}: no images in {sub}/ (need optical/, cloudy/ and sar/)")
        pools[pool] = files
    return pools


def _split(total: int) -> list[tuple[str, int]]:
    return [(difficulty, round(total * share)) for difficulty, share in DIFFICULTY_SHARE]


def _surface(rng: random.Random, table: dict) -> tuple[str, list[str]]:
    key = rng.choice(sorted(table))
    surfaces, accepted = table[key]
    return rng.choice(surfaces), accepted


def _referent(rng: random.Random, modality: str) -> tuple[str, list[str]]:
    table = SAR_REFERENTS if modality == "sar" else OPTICAL_REFERENTS
    noun = rng.choice(sorted(table))
    return f"the {noun} {rng.choice(POSITIONS)}", table[noun]


def _query(spec: CategorySpec, difficulty: str, modality: str, rng: random.Random) -> tuple[str, list[str], list[dict]]:
    """(query, expected tools, param checks) of one case."""
    template = rng.choice(QUERIES[spec.name][difficulty])
    tools = list(spec.tools[modality])
    checks: list[dict] = []
    fill = {"m": "SAR" if modality == "sar" else "optical"}
    if "{t}" in template and spec.name == "cloud_removal":
        target = rng.choice(COMPOUND_TARGETS)
        fill["t"] = rng.choice(TARGETS[target][0])
        tools.append("detect_objects")
        checks.append({"tool": "detect_objects", "field": "categories", "op": "any_of", "value": TARGETS[target][1]})
    elif "{t}" in template:
        fill["t"], accepted = _surface(rng, TARGETS)
        checks.append({"tool": tools[0], "field": "categories", "op": "any_of", "value": accepted})
    if "{c}" in template:
        fill["c"], accepted = _surface(rng, LANDCOVER)
        checks.append({"tool": tools[0], "field": "classes", "op": "any_of", "value": accepted})
    if "{e}" in template:
        fill["e"], accepted = _referent(rng, modality)
        checks.append({"tool": tools[0], "field": "expression", "op": "any_of", "value": accepted})
    text = rng.choice(OPENERS) + template.format(**fill) + rng.choice(CLOSERS)
    return text[0].upper() + text[1:], tools, checks


def _relative(image: Path, out_dir: Path) -> str:
    try:
        return Path(os.path.relpath(image.resolve(), out_dir.resolve())).as_posix()
    except ValueError:  # another drive on Windows
        return image.resolve().as_posix()


def build_planning_cases(images: str | Path, out: str | Path) -> list[dict]:
    """The 500 planning cases, with image paths relative to `out`'s folder."""
    pools = image_pools(images)
    out_dir = Path(out).parent
    cases, seen = [], set()
    for spec in CATEGORIES:
        sar_split = dict(_split(spec.sar))
        for difficulty, count in _split(spec.total):
            for k in range(count):
                modality = "sar" if k < sar_split.get(difficulty, 0) else "optical"
                case_id = f"{spec.name}/{difficulty}/{k:03d}"
                for attempt in range(100):
                    rng = random.Random(f"{VERSION}/{case_id}/{attempt}")
                    query, tools, checks = _query(spec, difficulty, modality, rng)
                    if query not in seen:
                        break
                else:  # pragma: no cover - the templates leave plenty of room
                    raise RuntimeError(f"no unique query for {case_id}")
                seen.add(query)
                pool = "sar" if modality == "sar" else "cloudy" if spec.name == "cloud_removal" else "optical"
                image = pools[pool][rng.randrange(len(pools[pool]))]
                cases.append(
                    {
                        "id": case_id,
                        "query": query,
                        "image": _relative(image, out_dir),
                        "modality": modality,
                        "category": spec.name,
                        "difficulty": difficulty,
                        "expected_tools": tools,
                        "param_checks": checks,
                        "must_contain": [],
                        "must_not_contain": [],
                        "ground_truth": [],
                        "max_rounds": 1,
                    }
                )
    return cases


def write_planning(images: str | Path, out: str | Path) -> dict:
    """Write the planning set to `out` (JSONL) and return its manifest (version, sha256, counts)."""
    out = Path(out)
    cases = build_planning_cases(images, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_case_file(out, cases, VERSION, ("category", "difficulty", "modality"))


def frozen_manifest() -> dict:
    return json.loads(PLANNING_MANIFEST.read_text(encoding="utf-8"))


def write_planning_images(out: str | Path, seed: int = 0, optical: int = 6, cloudy: int = 4, sar: int = 6) -> None:
    """The shipped image pools: small synthetic scenes (geopilot.data_gen.synthetic.scenes) as JPEG, by seed."""
    from geopilot.data_gen.synthetic.scenes import optical_scene, sar_picture, sar_scene

    out = Path(out)
    for pool in POOLS:
        (out / pool).mkdir(parents=True, exist_ok=True)
    for i in range(max(optical, cloudy)):
        scene = optical_scene(np.random.default_rng([seed, 0, i]))
        if i < optical:
            Image.fromarray(scene.image).save(out / "optical" / f"optical_{i:02d}.jpg", quality=80)
        if i < cloudy:
            Image.fromarray(scene.cloudy).save(out / "cloudy" / f"cloudy_{i:02d}.jpg", quality=80)
    for i in range(sar):
        amplitude = sar_scene(np.random.default_rng([seed, 1, i]), sixteen_bit=False).amplitude
        Image.fromarray(sar_picture(amplitude)).save(out / "sar" / f"sar_{i:02d}.jpg", quality=80)
