"""GeoChat-Instruct reader: `GeoChat_Instruct.json`, a JSON array of LLaVA records
`{"id", "image", "conversations": [{"from": "human"|"gpt", "value": ...}, ...]}`, images under `images/`.

Box text is `{<x1><y1><x2><y2>|<theta>}` with integer coordinates on a 0-100 grid (normalised by width and height)
and theta in degrees inside angle brackets, possibly negative; boxes are concatenated as `}{`, and grounded text
is `<p>phrase</p> {...}`.

Rotation convention: a positive theta turns the box CLOCKWISE on screen (image y pointing down) about its centre:
x' = cx + dx cos t - dy sin t, y' = cy + dx sin t + dy cos t, as `bbox_and_angle_to_polygon` in GeoChat's
`geochat_demo.py` (quoted in mbzuai-oryx/GeoChat issue #32). Matched against 2,604 real GeoChat-Bench
region-captioning boxes and their ground-truth polygons this gives mean IoU 0.873 against 0.504 for the
counter-clockwise reading of the demo's `cv2.getRotationMatrix2D` drawing code (issue 31). Grid values slightly
off the 0-100 grid (`{<51><-1><53><3>|<74>}`) are clipped to it, not dropped; answers listing several boxes joined
by `<delim>` give every box the phrase.

Images: the released `images.zip` unpacks to `share/softwares/kartik/GeoChat_finetuning/final_images_llava/`,
which is looked in after `<root>/<image_dir>/` and `<root>/`.
Each record keeps the whole conversation as one Dialogue (task from GeoChat's tokens `[refer]`, `[grounding]`,
`[identify]`, or "classification"/"vqa"/"conversation" from the prompt), and the boxes as objects labelled by their
phrase, lower-cased ("region" when unnamed); a phrase that is a class name becomes the canonical class
(`geopilot.vocabulary`: "<p>planes</p>" -> "airplane").
Run: `read_geochat(Path("GeoChat"))`.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from geopilot.data_gen.readers.common import (
    BAD_GEOMETRY,
    MALFORMED_LINE,
    UNSAFE_CLASS_NAME,
    DatasetRootError,
    ReadResult,
    checked_image,
    finish,
    load_json,
    polygon_object,
    require_dir,
)
from geopilot.records import AnnotationRecord, Dialogue, ReadReport, ReferringExpression
from geopilot.sample import IMAGE_PLACEHOLDER
from geopilot.vocabulary import canonical_class

BOX = re.compile(r"\{\s*<(-?\d+)>\s*<(-?\d+)>\s*<(-?\d+)>\s*<(-?\d+)>\s*(?:\|\s*<(-?\d+)>\s*)?\}")
GROUP = re.compile(r"<p>(.*?)</p>\s*((?:\{[^{}]*\}\s*(?:<delim>\s*)?)+)", re.S)
PHRASE = re.compile(r"<p>(.*?)</p>", re.S)
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
TASK_TOKENS = ("refer", "grounding", "identify")
UNNAMED = "region"
DATASET = "GeoChat-Instruct"  # record source, and its entry in geopilot/vocabulary.yaml
UNSAFE_PHRASE = re.compile(r"[<>\\\x00-\x1f\x7f]|\.\./")  # markup, control characters, a path: never in a trace
GRID_SLACK = 5  # real answers hold values just off the grid (`<-1>`, 153 of 2,797 boxes): clipped, not dropped
RELEASED_IMAGES = "share/softwares/kartik/GeoChat_finetuning/final_images_llava"  # where images.zip unpacks


def decode_box(match: re.Match, width: int, height: int) -> list[tuple[float, float]] | None:
    """A `{<x1><y1><x2><y2>|<t>}` match -> 4 pixel corners (positive t = clockwise on screen), grid values up to
    GRID_SLACK off the 0-100 grid clipped to it; None when a value is further off or the box is empty."""
    values = [int(v) for v in match.groups()[:4]]
    if not all(-GRID_SLACK <= v <= 100 + GRID_SLACK for v in values):
        return None
    x1, y1, x2, y2 = (min(100, max(0, v)) for v in values)
    theta = math.radians(int(match.group(5) or 0))
    if x2 <= x1 or y2 <= y1:
        return None
    left, top, right, bottom = x1 / 100 * width, y1 / 100 * height, x2 / 100 * width, y2 / 100 * height
    cx, cy = (left + right) / 2, (top + bottom) / 2
    cos, sin = math.cos(theta), math.sin(theta)
    corners = [(left, top), (right, top), (right, bottom), (left, bottom)]
    return [(cx + (x - cx) * cos - (y - cy) * sin, cy + (x - cx) * sin + (y - cy) * cos) for x, y in corners]


def phrase_label(phrase: str) -> str:
    """An object's label from its phrase: the canonical class when the phrase is a class name, else the phrase."""
    return canonical_class(phrase.lower(), DATASET) if phrase.strip() else UNNAMED


def task_of(first_user_text: str) -> str:
    for token in TASK_TOKENS:
        if f"[{token}]" in first_user_text:
            return token
    lowered = first_user_text.lower()
    if "classify the given image" in lowered:
        return "classification"
    if "answer in one word or a short phrase" in lowered or "using a single word or phrase" in lowered:
        return "vqa"
    return "conversation"


class _BoxCollector:
    """Turns the boxes of one record's turns into objects and referring expressions."""

    def __init__(self, record: AnnotationRecord, report: ReadReport, where: str):
        self.record, self.report, self.where = record, report, where
        self.pending_phrases: list[str] = []  # phrases of the last user turn that carried no boxes ([refer])

    def _add(self, box_text: str, label: str) -> list[int]:
        indices = []
        if UNSAFE_PHRASE.search(label) and BOX.search(box_text):
            self.report.skip(UNSAFE_CLASS_NAME, f"{self.where}: phrase {label[:40]!r} holds markup or a path")
            return indices
        for match in BOX.finditer(box_text):
            corners = decode_box(match, self.record.width, self.record.height)
            if corners is None:
                self.report.skip(BAD_GEOMETRY, f"{self.where}: box {match.group(0)} is off the 0-100 grid or empty")
                continue
            made = polygon_object(corners, self.record.width, self.record.height, label)
            if isinstance(made, str):
                self.report.skip(made, f"{self.where}: box {match.group(0)}")
                continue
            indices.append(len(self.record.objects))
            self.record.objects.append(made)
        return indices

    def turn(self, role: str, text: str) -> None:
        grouped_spans = []
        for group in GROUP.finditer(text):
            phrase = " ".join(group.group(1).split())
            self._refer(phrase, self._add(group.group(2), phrase_label(phrase)))
            grouped_spans.append(group.span(2))
        loose = "".join(m.group(0) for m in BOX.finditer(text) if not any(a <= m.start() < b for a, b in grouped_spans))
        if role == "user":
            self.pending_phrases = [" ".join(p.split()) for p in PHRASE.findall(text)] if not grouped_spans else []
            self._add(loose, UNNAMED)
        else:
            phrase = self.pending_phrases[0] if len(self.pending_phrases) == 1 else None
            self._refer(phrase, self._add(loose, phrase_label(phrase) if phrase else UNNAMED))
            self.pending_phrases = []

    def _refer(self, phrase: str | None, indices: list[int]) -> None:
        if phrase and indices:
            self.record.referring.append(ReferringExpression(phrase, tuple(indices)))


def _dialogue(conversations: list) -> tuple[tuple[str, str], ...]:
    turns = []
    for turn in conversations:
        role = ROLES.get(str(turn.get("from", turn.get("role", ""))).lower()) if isinstance(turn, dict) else None
        text = turn.get("value", turn.get("content")) if isinstance(turn, dict) else None
        if role is None or not isinstance(text, str):
            raise ValueError(f"turn {turn!r:.80} lacks a known 'from' or a string 'value'")
        turns.append((role, text.replace(IMAGE_PLACEHOLDER, "").strip()))
    if not turns or turns[0][0] != "user":
        raise ValueError("conversation is empty or does not start with a human turn")
    return tuple(turns)


def read_geochat(
    root: Path, split: str = "train", annotation_file: str = "GeoChat_Instruct.json", image_dir: str = "images"
) -> ReadResult:
    root = require_dir(root, "GeoChat-Instruct", f"expected {annotation_file} and {image_dir}/")
    path = root / annotation_file
    entries = load_json(path, "GeoChat-Instruct")
    if not isinstance(entries, list):
        raise DatasetRootError(f"GeoChat-Instruct: {path} must hold a JSON array of records")
    report = ReadReport()
    records: list[AnnotationRecord] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(entries):
        where = f"{path.name}[{index}]"
        try:
            if not isinstance(entry, dict) or not isinstance(entry.get("image"), str):
                raise ValueError("record is not an object with a string 'image'")
            turns = _dialogue(entry.get("conversations") or [])
        except ValueError as err:
            report.skip(MALFORMED_LINE, f"{where}: {err}")
            continue
        candidates = [root / image_dir / entry["image"], root / entry["image"], root / RELEASED_IMAGES / entry["image"]]
        image = checked_image(next((p for p in candidates if p.is_file()), candidates[0]), report, where)
        if image is None:
            continue
        image_path, width, height = image
        base_id = str(entry.get("id") or Path(entry["image"]).stem)
        seen[base_id] = seen.get(base_id, 0) + 1
        record_id = base_id if seen[base_id] == 1 else f"{base_id}#{seen[base_id] - 1}"
        record = AnnotationRecord(DATASET, str(image_path), width, height, "optical", split, record_id)
        collector = _BoxCollector(record, report, where)
        for role, text in turns:
            collector.turn(role, text)
        record.dialogues.append(Dialogue(turns, task_of(turns[0][1])))
        records.append(record)
    return finish(records, report)
