"""SARLANG-1M benchmarks: SAR VQA (SARVQA1, built on SARDet-100K: OI / IC / OC / OP) and SARLANG-1M-Cap captioning.

The files are read by the data_gen SARLANG reader's row parsing (`geopilot.data_gen.readers.sarlang`: header
sniffing over CSV / JSON / JSONL, LLaMA-Factory records, positional CSV), so both sides parse the text one way.
Root layout: `SARimages/*` + `Text/VQA/SARVQA1_test.*` and `Text/caption/Caption_test.*` (complex captions; the
concise ones are `Caption_test1`).

SAR VQA types: the row's type column (`type`, `question_type`, `task`, `application`, ...) mapped through
`TYPE_ALIASES`; when a row has none, the question decides (`infer_type`: "how many" -> IC, "where"/"located"/
"position" -> OP, "what type/kind/class/category" -> OC, "is there"/"are there"/"does" -> OI), else `other`, which is
scored but left out of the SAR average. Captions: one item per row with its one reference, as SARLANG's official
`Evaluate_caption.py` scores them; item ids are the image stem (+ `#k` for the k-th repeat of an image).
"""

from __future__ import annotations

import re
from pathlib import Path

from geopilot.data_gen.readers.common import MALFORMED_LINE, MISSING_IMAGE
from geopilot.data_gen.readers.sarlang import find_image, find_text_files, text_rows
from geopilot.eval.loaders.common import BenchmarkError, EvalItem, Loaded
from geopilot.records import ReadReport

SAR_TYPES = ["OI", "IC", "OC", "OP"]
TYPE_ALIASES = {
    "OI": {"oi", "objectidentification", "identification", "objectexistence", "existence", "presence"},
    "IC": {"ic", "instancecounting", "counting", "count", "objectcounting", "quantity"},
    "OC": {"oc", "objectclassification", "classification", "category", "objectcategory", "recognition"},
    "OP": {"op", "objectpositioning", "positioning", "position", "location", "localization", "objectlocation"},
}
_QUESTION_RULES = [
    ("IC", re.compile(r"\bhow many\b|\bnumber of\b|\bcount\b")),
    ("OP", re.compile(r"\bwhere\b|\blocated\b|\bposition\b|\blocation\b|\bwhich (part|side|corner|region)\b")),
    ("OC", re.compile(r"\bwhat (type|kind|class|category|sort)\b|\bwhich (type|kind|class|category)\b")),
    ("OI", re.compile(r"^(is|are|does|do|can) |\bis there\b|\bare there\b|\bexist")),
]
CAPTION_PROMPT = "Describe this SAR image in detail."


def sar_type(raw: str | None, question: str) -> str:
    if raw:
        key = re.sub(r"[^a-z]", "", raw.lower())
        for kind, aliases in TYPE_ALIASES.items():
            if key in aliases:
                return kind
    return infer_type(question)


def infer_type(question: str) -> str:
    text = question.strip().lower()
    return next((kind for kind, pattern in _QUESTION_RULES if pattern.search(text)), "other")


def _files(root: Path, stem: str) -> list[Path]:
    text_dir = root / "Text"
    found = find_text_files(text_dir, stem) if text_dir.is_dir() else []
    if not found:
        raise BenchmarkError(f"SARLANG-1M: no {stem}.csv/.json/.jsonl under {text_dir}")
    return found


def _read(root: Path | str, stem: str, kind: str, check_images: bool, report: ReadReport):
    """Yield (item id, image path, turns, task) per usable row; skipped rows are counted in `report`."""
    root = Path(root)
    if not root.is_dir():
        raise BenchmarkError(f"SARLANG-1M: {root} is not a directory (expected SARimages/ and Text/)")
    seen: dict[str, int] = {}
    for where, image_name, turns, task in text_rows([(path, kind) for path in _files(root, stem)], report):
        image = find_image(root, image_name)
        if check_images and not image.is_file():
            report.skip(MISSING_IMAGE, f"{where}: {image} not found")
            continue
        seen[image.stem] = seen.get(image.stem, 0) + 1
        item_id = image.stem if seen[image.stem] == 1 else f"{image.stem}#{seen[image.stem] - 1}"
        yield item_id, image, turns, task


def load_sar_vqa(root: Path | str, stem: str = "SARVQA1_test", check_images: bool = True) -> Loaded:
    items, report = [], ReadReport()
    for item_id, image, turns, task in _read(root, stem, "vqa", check_images, report):
        users = [t for r, t in turns if r == "user"]
        answers = [t for r, t in turns if r == "assistant"]
        if not users or not answers or not answers[-1].strip():
            report.skip(MALFORMED_LINE, f"{item_id}: no question/answer pair")
            continue
        raw_type = task.split(":", 1)[1] if task.startswith("vqa:") else None
        question = users[0]
        items.append(EvalItem(item_id, str(image), question, answers[-1].strip(), sar_type(raw_type, question), "sar"))
    return Loaded("SAR-VQA", items, report)


def load_sar_captions(root: Path | str, stem: str = "Caption_test", check_images: bool = True) -> Loaded:
    items, report = [], ReadReport()
    for item_id, image, turns, _task in _read(root, stem, "caption", check_images, report):
        caption = " ".join(t for r, t in turns if r == "assistant").strip()
        prompt = next((t for r, t in turns if r == "user"), CAPTION_PROMPT) or CAPTION_PROMPT
        if not caption:
            report.skip(MALFORMED_LINE, f"{item_id}: empty reference caption")
            continue
        items.append(EvalItem(item_id, str(image), prompt, [caption], "caption", "sar"))
    return Loaded("SARLANG-1M-Cap", items, report)
