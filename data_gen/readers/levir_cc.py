"""LEVIR-CC change captioning: bi-temporal pairs with five change captions each.

Layout (the authors' release, https://github.com/Chen-Yang-Liu/RSICCformer; LEVIR-MCI ships the same files):
`<root>/LevirCCcaptions.json` and `<root>/images/<split>/{A,B}/<filename>` (256 x 256 PNG). The JSON is
`{"images": [{"filepath": "train", "filename": "train_000001.png", "split": "train", "imgid": 0,
"sentences": [{"raw": " the scene is the same as before .", "tokens": [...], "imgid": 0, "sentid": 0}, ...],
"sentids": [...], "changeflag": 0}, ...]}`; a pair's images are `images/<filepath>/A/<filename>` and `.../B/...`.
One record per pair: `image` is A, `after_image` B, and each caption as a `Dialogue` of task `change_caption` (`raw`,
spaces before punctuation closed; `tokens` joined when `raw` is absent). `changeflag` is not needed: an unchanged
pair's captions say so ("the scene is the same as before"). Skipped, by cause: an entry without a file name or any caption
(`malformed_line`), a pair whose A or B is missing (`missing_image`) or whose B has another size
(`size_mismatch`). Run: `read_levir_cc(Path("LEVIR-CC"), split="test")`.
"""

from __future__ import annotations

import re
from pathlib import Path

from geopilot.data_gen.readers.common import (
    CHANGE_CAPTION,
    MALFORMED_LINE,
    DatasetRootError,
    ReadResult,
    checked_pair,
    finish,
    load_json,
    require_dir,
    unsafe_name,
)
from geopilot.records import AnnotationRecord, Dialogue, ReadReport

SPLITS = ("train", "val", "test")
CAPTIONS_FILE = "LevirCCcaptions.json"
LAYOUT = "LevirCCcaptions.json + images/<split>/{A,B}/<filename>"
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([.,;:!?])")


def caption_text(sentence: object) -> str:
    """One `sentences` entry as text: `raw` (else its `tokens`), whitespace collapsed, no space before punctuation."""
    if not isinstance(sentence, dict):
        return ""
    raw = sentence.get("raw")
    if not isinstance(raw, str):
        tokens = sentence.get("tokens")
        raw = " ".join(t for t in tokens if isinstance(t, str)) if isinstance(tokens, list) else ""
    return _SPACE_BEFORE_PUNCT.sub(r"\1", " ".join(raw.split()))


def read_levir_cc(root: Path, split: str = "train") -> ReadResult:
    if split not in SPLITS:
        raise DatasetRootError(f"LEVIR-CC: split must be one of {list(SPLITS)}, got {split!r}")
    root = require_dir(root, "LEVIR-CC", f"expected {LAYOUT}")
    if not (root / CAPTIONS_FILE).is_file():
        raise DatasetRootError(f"LEVIR-CC: no {CAPTIONS_FILE} under {root} (expected {LAYOUT})")
    data = load_json(root / CAPTIONS_FILE, "LEVIR-CC")
    entries = data.get("images") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise DatasetRootError(f"LEVIR-CC: {root / CAPTIONS_FILE} has no `images` list")
    report = ReadReport(layout=LAYOUT)
    records: list[AnnotationRecord] = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            report.skip(MALFORMED_LINE, f"images[{index}]: not an object")
            continue
        folder = entry.get("filepath") or entry.get("split")
        if (entry.get("split") or folder) != split:
            continue
        name = entry.get("filename")
        if not isinstance(name, str) or not name or unsafe_name(name) or not isinstance(folder, str):
            report.skip(MALFORMED_LINE, f"images[{index}]: no usable filename / filepath")
            continue
        what = f"{folder}/{name}"
        if unsafe_name(folder):
            report.skip(MALFORMED_LINE, f"images[{index}]: filepath {folder[:40]!r} is not a folder name")
            continue
        sentences = entry.get("sentences")
        captions = tuple(c for c in map(caption_text, sentences if isinstance(sentences, list) else []) if c)
        if not captions:
            report.skip(MALFORMED_LINE, f"{what}: no caption")
            continue
        images = root / "images" / folder
        pair = checked_pair(images / "A" / name, images / "B" / name, report, what)
        if pair is None:
            continue
        path, width, height = pair
        record = AnnotationRecord("LEVIR-CC", str(path), width, height, "optical", split, f"{folder}/{Path(name).stem}")
        record.after_image = str((images / "B" / name).resolve())
        record.dialogues = [Dialogue(turns=(("assistant", caption),), task=CHANGE_CAPTION) for caption in captions]
        records.append(record)
    return finish(records, report)
