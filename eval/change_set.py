"""The change question set `change_v1` (docs/eval_tasks.md): two-image planning cases over bi-temporal pairs, scored
by the planning scorer like every other case (tool selection, parameters, the answer's numbers).

  change_detection   25  "what changed?"           detect_changes
  change_counting    25  "how many new buildings?" detect_changes with classes naming buildings; truth: the count
  change_area        25  "what share changed?"     detect_changes; truth: the changed percentage (+- 0.5)
  change_captioning  20  "describe the change"     no tool (a description from the two images)
in each category easy 40 %, medium 40 %, hard 20 %.

Each case names two images, before and after (`images`), in `change_images/` next to the case file: the bi-temporal
pairs of `geopilot.data_gen.synthetic.change` with seed 46 (training's synthetic pairs use other seeds) as JPEG, their
labels beside them as PNG. Ground truth is computed from the labels (8-connected changed regions, changed pixels),
independently of any tool. The query templates are written apart from data_gen's change grammar (a test checks no
query is an instance of its frames). The file is a pure function of the seed: `geopilot eval build-change --out
FILE` rebuilds the frozen `data/change_v1.jsonl` byte for byte.

Change captioning is scored with the caption metrics every captioning task uses (`score_captions`: BLEU-1..4,
ROUGE-L, CIDEr-D, pycocoevalcap-exact): the captioning cases' reference captions (five per pair, LEVIR-CC style) are
written beside the case file as `<stem>.captions.jsonl` (`{"id", "references"}` per line, the `--ref` format of
`geopilot eval captions`), and `change_caption_scores` scores a planning run's answers against them.
"""

from __future__ import annotations

import json
import random
from importlib import resources
from pathlib import Path

import numpy as np
from PIL import Image

from geopilot.data_gen.readers.levir_cc import caption_text
from geopilot.data_gen.synthetic.change import ChangePair, captions, change_pairs
from geopilot.data_gen.synthetic.scenes import png_bytes
from geopilot.eval.cases import write_case_file
from geopilot.eval.planning_set import CLOSERS, DIFFICULTY_SHARE, OPENERS

VERSION = "change_v1"
SEED = 46
PAIRS = 10
DATA = Path(str(resources.files("geopilot.eval") / "data"))
CHANGE_FILE = DATA / f"{VERSION}.jsonl"
CHANGE_MANIFEST = DATA / f"{VERSION}.json"
IMAGES = "change_images"
COUNTS = {"change_detection": 25, "change_counting": 25, "change_area": 25, "change_captioning": 20}
TOOL = "detect_changes"
BUILDING_NAMES = ["building", "house", "built up area"]  # what a classes param may call buildings
AREA_TOLERANCE = 0.5  # percentage points

QUERIES: dict[str, dict[str, list[str]]] = {
    "change_detection": {
        "easy": [
            "Compare the earlier and the later picture and mark whatever differs.",
            "Spot the differences between these two acquisitions and box them.",
            "Run a before/after comparison on this pair.",
            "Indicate each spot where the second picture departs from the first.",
        ],
        "medium": [
            "Which parts of the ground look different in the later picture?",
            "Between the first and second acquisition, where has the landscape been altered?",
            "Did any construction or demolition happen here, and in which spots?",
            "Where do the earlier and later pictures disagree?",
        ],
        "hard": [
            "A permit was filed for this plot; verify against the two dates what was actually altered.",
            "Our archive shows this block twice; tell me every location that is not the same any more.",
            "I suspect unreported works on this site; localise all alterations between the two dates.",
        ],
    },
    "change_counting": {
        "easy": [
            "Tell me the number of houses that went up or came down between the two pictures.",
            "Give a count of building alterations from the first date to the second.",
            "Count up the houses that differ across this pair.",
        ],
        "medium": [
            "By how many buildings does the later picture differ from the earlier one?",
            "What is the count of structures erected or razed over this interval?",
            "How many houses were affected between the first and the second acquisition?",
        ],
        "hard": [
            "The council wants the number of houses constructed or knocked down here since the first date; can you report it?",
            "To check a developer's claim, establish how many buildings differ between these two dates.",
        ],
    },
    "change_area": {
        "easy": [
            "Report the percentage of the tile that differs between the two dates.",
            "Give the proportion of pixels that are not the same in the later picture.",
            "State how much of the ground was modified, as a percentage.",
        ],
        "medium": [
            "Roughly what portion of this plot was altered from the first date to the second?",
            "How big a part of the tile differs across the two pictures, in percent?",
            "Which percentage of the land was transformed over this interval?",
        ],
        "hard": [
            "For the land-take indicator I need the altered share of this tile between the two dates.",
            "Estimate the percentage of the ground touched by construction or demolition since the first picture.",
        ],
    },
    "change_captioning": {
        "easy": [
            "In a sentence, narrate what differs between the earlier and later picture.",
            "Put into words the difference between these two acquisitions.",
            "Give a one-line account of how this place evolved.",
        ],
        "medium": [
            "How has this neighbourhood evolved from the first picture to the second?",
            "What story do these two dates tell about the site?",
            "Could you sum up in a phrase how the ground was transformed?",
        ],
        "hard": [
            "Without measuring anything, characterise in plain words how this plot evolved between the dates.",
            "For the caption of our before/after figure, narrate what happened here.",
        ],
    },
}


def pair_truth(pair: ChangePair) -> dict:
    """What the label says, computed from its pixels: 8-connected changed regions and the changed percentage."""
    from scipy import ndimage

    changed = pair.label > 0
    return {
        "regions": int(ndimage.label(changed, structure=np.ones((3, 3), dtype=bool))[1]),
        "percent": round(100.0 * float(changed.mean()), 2),
    }


def write_pair_images(folder: Path, pairs: list[ChangePair]) -> None:
    """pair_<i>_{A,B}.jpg (JPEG, as the other shipped pools) and the exact label pair_<i>_label.png."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, pair in enumerate(pairs):
        for name, pixels in (("A", pair.before), ("B", pair.after)):
            Image.fromarray(pixels).save(folder / f"pair_{i:02d}_{name}.jpg", quality=85)
        (folder / f"pair_{i:02d}_label.png").write_bytes(png_bytes(pair.label))


def _split(total: int) -> list[tuple[str, int]]:
    return [(difficulty, round(total * share)) for difficulty, share in DIFFICULTY_SHARE]


def build_change_cases(pairs: list[ChangePair]) -> list[dict]:
    truths = [pair_truth(pair) for pair in pairs]
    cases, seen = [], set()
    for category, total in COUNTS.items():
        k = 0
        for difficulty, count in _split(total):
            for _ in range(count):
                for attempt in range(100):
                    rng = random.Random(f"{VERSION}/{category}/{k}/{attempt}")
                    text = rng.choice(OPENERS) + rng.choice(QUERIES[category][difficulty]) + rng.choice(CLOSERS)
                    if text not in seen:
                        break
                seen.add(text)
                i = rng.randrange(len(pairs))
                truth = truths[i]
                tools, checks, numbers = ([], [], []) if category == "change_captioning" else ([TOOL], [], [])
                if category == "change_counting":
                    checks = [{"tool": TOOL, "field": "classes", "op": "any_of", "value": BUILDING_NAMES}]
                    numbers = [{"label": "building", "value": truth["regions"]}]
                elif category == "change_area":
                    numbers = [{"label": "%", "value": truth["percent"], "tolerance": AREA_TOLERANCE}]
                cases.append(
                    {
                        "id": f"{category}/{difficulty}/{k:03d}",
                        "query": text[0].upper() + text[1:],
                        "image": None,
                        "images": [f"{IMAGES}/pair_{i:02d}_A.jpg", f"{IMAGES}/pair_{i:02d}_B.jpg"],
                        "modality": "optical",
                        "category": category,
                        "difficulty": difficulty,
                        "expected_tools": tools,
                        "param_checks": checks,
                        "ground_truth": numbers,
                        "max_rounds": len(tools),
                    }
                )
                k += 1
    return cases


def caption_references(cases: list[dict], pairs: list[ChangePair]) -> list[dict]:
    """The reference captions of each captioning case: its pair's five change captions."""
    out = []
    for case in cases:
        if case["category"] == "change_captioning":
            pair = pairs[int(Path(case["images"][0]).stem.split("_")[1])]
            out.append({"id": case["id"], "references": [caption_text({"raw": c}) for c in captions(pair)]})
    return out


def references_path(case_file: str | Path) -> Path:
    case_file = Path(case_file)
    return case_file.with_name(f"{case_file.stem}.captions.jsonl")


def write_change_set(out: str | Path) -> dict:
    """Write the case file to `out`, the pairs to `change_images/` and the caption references beside it; return the
    manifest."""
    out = Path(out)
    pairs = change_pairs(SEED, PAIRS)
    write_pair_images(out.parent / IMAGES, pairs)
    cases = build_change_cases(pairs)
    references = caption_references(cases, pairs)
    references_path(out).write_text("".join(json.dumps(r) + "\n" for r in references), encoding="utf-8")
    return write_case_file(out, cases, VERSION, ("category", "difficulty"))


def levir_cc_references(root: str | Path, split: str = "test") -> list[dict]:
    """LEVIR-CC's own references, read by its data_gen reader: `{"id": "<split>/<stem>", "references": [...]}` per
    pair, the `--ref` lines of `geopilot eval captions` for predictions keyed by the same ids."""
    from geopilot.data_gen.change_traces import change_captions
    from geopilot.data_gen.readers.levir_cc import read_levir_cc

    records, _ = read_levir_cc(Path(root), split=split)
    return [{"id": r.record_id, "references": change_captions(r)} for r in records]


def change_caption_scores(case_file: str | Path, results: str | Path, seed: int, tokenizer: str = "ptb") -> dict:
    """Caption metrics of a planning run's answers to the captioning cases (one seed's rows of its results.jsonl)
    against the references beside the case file; a case without an answer scores as an empty caption."""
    from geopilot.eval.benchmark_tasks import score_captions
    from geopilot.fileio import iter_jsonl

    references = {row["id"]: row["references"] for _, row in iter_jsonl(references_path(case_file))}
    answers = {
        row["case_id"]: row["run"].get("answer") or ""
        for _, row in iter_jsonl(Path(results))
        if row.get("seed") == seed and row.get("case_id") in references
    }
    return score_captions(references, answers, tokenizer)
