"""SARLANG-1M reader: SAR images under `SARimages/` and text under `Text/caption/` and `Text/VQA/`.

Files (CSV, JSON or JSONL): `Caption-training` (train), `Caption_test` (complex captions, split "test"),
`Caption_test1` (concise captions, split "test_concise"), `SARVQA1_<split>` and `SARVQA2_<split>`. The column
names are not published, so the header is sniffed from known aliases (an `image` column plus `caption`, or
`question` + `answer`); a file without a recognisable header is read positionally (image, caption) or
(image, question, answer[, type]). JSON rows may also be LLaMA-Factory records (`messages`/`conversations` +
`images`). One record per image, one Dialogue per caption or QA pair.
Run: `read_sarlang(Path("SARLANG-1M"), split="test")`.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from geopilot.data_gen.readers.common import (
    DATASET_FILE_MAX_BYTES,
    IMAGE_SUFFIXES,
    MALFORMED_FILE,
    MALFORMED_LINE,
    NOT_UTF8,
    OVERSIZED_FIELD,
    DatasetRootError,
    ReadResult,
    checked_image,
    finish,
    parse_json,
    read_limited,
    require_dir,
)
from geopilot.records import AnnotationRecord, Dialogue, ReadReport
from geopilot.sample import IMAGE_PLACEHOLDER

TEXT_FILES = {  # split -> [(file stem, kind)]
    "train": [("Caption-training", "caption"), ("SARVQA1_train", "vqa"), ("SARVQA2_train", "vqa")],
    "test": [("Caption_test", "caption"), ("SARVQA1_test", "vqa"), ("SARVQA2_test", "vqa")],
    "test_concise": [("Caption_test1", "caption")],
}
TEXT_SUFFIXES = (".csv", ".json", ".jsonl")
IMAGE_KEYS = (
    "image",
    "images",
    "img",
    "image_name",
    "img_name",
    "image_path",
    "imagename",
    "filename",
    "file_name",
    "image_id",
    "name",
    "path",
)
CAPTION_KEYS = ("caption", "captions", "description", "sentence", "text", "output", "label")
QUESTION_KEYS = ("question", "query", "q", "instruction", "prompt")
ANSWER_KEYS = ("answer", "answers", "a", "gt", "ground_truth", "output", "label")
TYPE_KEYS = ("type", "question_type", "qtype", "category", "task", "application")
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
_NOT_UTF8 = re.compile("[\udc80-\udcff]")  # what surrogateescape decoding leaves for a byte that is not UTF-8


def _pick(row: dict, keys: tuple[str, ...]) -> str | None:
    lowered = {str(k).strip().lower(): v for k, v in row.items()}
    for key in keys:
        value = lowered.get(key)
        if isinstance(value, list) and value:
            value = value[0]
        if isinstance(value, (str, int)) and str(value).strip():
            return str(value).strip()
    return None


class BadRow(ValueError):
    """One row that cannot be read; `cause` is its ReadReport cause."""

    def __init__(self, cause: str, message: str):
        super().__init__(message)
        self.cause = cause


def _decoded(path: Path) -> str:
    """The file's text; bytes that are not UTF-8 become surrogates, so only the rows holding them are lost."""
    data = read_limited(path, DATASET_FILE_MAX_BYTES, "SARLANG-1M text file")
    return data.decode("utf-8", errors="surrogateescape").removeprefix("\ufeff")


def _csv_rows(text: str):
    """csv rows one at a time: a row the csv module refuses (a field over its 128 KiB limit, a NUL byte) or that holds
    bytes that are not UTF-8 becomes a BadRow, and reading goes on with the next row."""
    reader = csv.reader(io.StringIO(text))
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            cause = OVERSIZED_FIELD if "field limit" in str(err) else MALFORMED_LINE
            yield BadRow(cause, f"line {reader.line_num}: {err}")
            continue
        if any(_NOT_UTF8.search(cell) for cell in row):
            yield BadRow(NOT_UTF8, f"line {reader.line_num}: bytes that are not UTF-8")
            continue
        yield row


def _rows(path: Path, kind: str) -> list:
    """The file's rows (dicts), a BadRow in place of each row that cannot be read. ValueError/OSError when the file
    as a whole is not one of the formats (a JSON file that does not parse)."""
    text = _decoded(path)
    if path.suffix == ".jsonl":
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                if _NOT_UTF8.search(line):
                    raise BadRow(NOT_UTF8, f"line {number}: bytes that are not UTF-8")
                rows.append(parse_json(line))
            except BadRow as err:
                rows.append(err)
            except ValueError as err:
                rows.append(BadRow(MALFORMED_LINE, f"line {number}: {str(err)[:120]}"))
        return rows
    if path.suffix == ".json":
        if _NOT_UTF8.search(text):
            raise ValueError("bytes that are not UTF-8")
        data = parse_json(text)
        return data if isinstance(data, list) else data.get("data") or data.get("annotations") or []
    table = list(_csv_rows(text))
    first = next((i for i, row in enumerate(table) if not isinstance(row, BadRow)), None)
    if first is None:
        return table
    header = [h.strip().lower() for h in table[first]]
    if any(h in IMAGE_KEYS for h in header):
        body = table[:first] + table[first + 1 :]
        return [row if isinstance(row, BadRow) else dict(zip(header, row, strict=False)) for row in body]
    positional = ("image", "caption") if kind == "caption" else ("image", "question", "answer", "type")
    return [row if isinstance(row, BadRow) else dict(zip(positional, row, strict=False)) for row in table]


def _turns(row: dict, kind: str) -> tuple[tuple[tuple[str, str], ...], str]:
    """A row -> (turns, task); ValueError when it has neither the fields of its kind nor a message list."""
    messages = row.get("messages") or row.get("conversations")
    if isinstance(messages, list):
        turns = []
        for m in messages:
            role = ROLES.get(str(m.get("role", m.get("from", ""))).lower()) if isinstance(m, dict) else None
            content = m.get("content", m.get("value")) if isinstance(m, dict) else None
            if role is None or not isinstance(content, str):
                raise ValueError("a message lacks a known role or string content")
            turns.append((role, content.replace(IMAGE_PLACEHOLDER, "").strip()))
        return tuple(turns), kind
    if kind == "caption":
        caption = _pick(row, CAPTION_KEYS)
        if caption is None:
            raise ValueError("no caption field")
        return (("assistant", caption),), "caption"
    question, answer = _pick(row, QUESTION_KEYS), _pick(row, ANSWER_KEYS)
    if question is None or answer is None:
        raise ValueError("no question/answer fields")
    question_type = _pick(row, TYPE_KEYS)
    return (("user", question.replace(IMAGE_PLACEHOLDER, "").strip()), ("assistant", answer)), (
        f"vqa:{question_type}" if question_type else "vqa"
    )


def find_image(root: Path, name: str) -> Path:
    """Where SARLANG keeps the image a text row names (its folder layouts vary); the first candidate if none is."""
    relative = Path(name.replace("\\", "/"))
    candidates = [root / relative, root / "SARimages" / relative, root / "SARimages" / relative.name]
    if not relative.suffix:
        candidates += [root / "SARimages" / f"{relative.name}{s}" for s in IMAGE_SUFFIXES]
    return next((p for p in candidates if p.is_file()), candidates[1])


def find_text_files(text_dir: Path, stem: str) -> list[Path]:
    """The text files of one kind (`stem`): named after it, or inside a folder named after it."""
    found = [p for p in text_dir.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES]
    return sorted(p for p in found if p.stem == stem or p.parent.name == stem)


def text_rows(files: list[tuple[Path, str]], report: ReadReport):
    """(where, image name, turns, task) for every usable row of SARLANG text files given as (path, kind);
    unreadable files and malformed rows are counted in `report`. The one row parser the reader and
    evaluation (geopilot.eval.loaders.sarlang) share."""
    for path, kind in files:
        try:
            rows = _rows(path, kind)
        except (OSError, UnicodeDecodeError, ValueError, AttributeError, csv.Error) as err:
            report.skip(MALFORMED_FILE, f"{path.name}: {err}")
            continue
        for index, row in enumerate(rows):
            where = f"{path.name} row {index + 1}"
            if isinstance(row, BadRow):
                report.skip(row.cause, f"{path.name} {row}")
                continue
            try:
                if not isinstance(row, dict):
                    raise ValueError("row is not an object")
                image_name = _pick(row, IMAGE_KEYS)
                if image_name is None:
                    raise ValueError("no image field")
                turns, task = _turns(row, kind)
            except ValueError as err:
                report.skip(MALFORMED_LINE, f"{where}: {err}")
                continue
            yield where, image_name, turns, task


def read_sarlang(root: Path, split: str = "train") -> ReadResult:
    if split not in TEXT_FILES:
        raise DatasetRootError(f"SARLANG-1M: split must be one of {list(TEXT_FILES)}")
    root = require_dir(root, "SARLANG-1M", "expected SARimages/ and Text/{caption,VQA}/")
    text_dir = root / "Text"
    files = (
        [(p, kind) for stem, kind in TEXT_FILES[split] for p in find_text_files(text_dir, stem)]
        if text_dir.is_dir()
        else []
    )
    if not files:
        names = ", ".join(stem for stem, _ in TEXT_FILES[split])
        raise DatasetRootError(f"SARLANG-1M: none of {names} (.csv/.json/.jsonl) found under {text_dir}")
    report = ReadReport()
    by_image: dict[str, AnnotationRecord] = {}
    for where, image_name, turns, task in text_rows(files, report):
        image_path = find_image(root, image_name)
        record = by_image.get(str(image_path))
        if record is None:
            image = checked_image(image_path, report, where)
            if image is None:
                continue
            path_, width, height = image
            record = AnnotationRecord("SARLANG-1M", str(path_), width, height, "sar", split, path_.stem)
            by_image[str(image_path)] = record
        record.dialogues.append(Dialogue(turns, task))
    return finish(list(by_image.values()), report)
