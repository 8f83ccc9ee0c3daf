"""RSVQA-LR (LRBEN) and RSVQA-HR (HRBEN) in their real formats, answers joined by question id.

Root layout (syvlo/RSVQA): LR `LR_split_<split>_{questions,answers,images}.json` + `Images_LR/<img_id>.tif`;
HR `USGS_split_<split>_{questions,answers,images}.json` + `Data/<img_id>.tif` (HRBEN = split `test_phili`, "test
set 2"). Each JSON holds one list (`questions`, `answers`, `images`) whose position equals the entry's `id`; entries
outside the split stay in the list with `active: false` and are skipped. A question's answer is
`answers[question["answers_ids"][0]]` (checked by its `id`; the spec's back-reference `quesiton_id` is never used).

If the root also holds GeoChat-Bench's `lrben.jsonl` / `hrben.jsonl` (lines `{"question_id", "image", "text",
"category"}`, no answers), exactly those questions are evaluated, with GeoChat's prompt text, and their answers are
joined from the RSVQA answers JSON by `question_id`.

Question types: `presence`, `comp`, `rural_urban`, `count` (LR) and `presence`, `comp`, `count`, `area` (HR).
`AVERAGED_TYPES` are the ones the paper's "Average" column covers: LR excludes `count`; HR reports presence and
comparison. Other types are still scored and reported per type, outside the averages.
"""

from __future__ import annotations

import json
from pathlib import Path

from geopilot.data_gen.readers.common import DATASET_FILE_MAX_BYTES, MALFORMED_LINE, MISSING_IMAGE
from geopilot.errors import GeoPilotInputError
from geopilot.eval.loaders.common import BenchmarkError, EvalItem, Loaded
from geopilot.fileio import read_json
from geopilot.records import ReadReport

PROMPT_SUFFIX = "Answer the question using a single word or phrase."
LAYOUT = {  # benchmark -> (file prefix, image folder, default split, GeoChat-Bench file)
    "lr": ("LR_split", "Images_LR", "test", "lrben.jsonl"),
    "hr": ("USGS_split", "Data", "test_phili", "hrben.jsonl"),
}
AVERAGED_TYPES = {"lr": ["presence", "comp", "rural_urban"], "hr": ["presence", "comp"]}
TYPE_NAMES = {"comparison": "comp", "rural/urban": "rural_urban", "ruralurban": "rural_urban"}


def _list(path: Path, key: str) -> list:
    try:
        data = read_json(path, DATASET_FILE_MAX_BYTES, "RSVQA file")
    except GeoPilotInputError as err:
        raise BenchmarkError(f"RSVQA: {err}") from None
    entries = data.get(key) if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise BenchmarkError(f"RSVQA: {path.name} has no {key!r} list")
    return entries


def _by_id(entries: list, what: str, report: ReadReport) -> dict[int, dict]:
    """Index a list by `id` (position equals id in the real files; checked rather than assumed). An entry whose id
    is not a whole number is skipped and counted, the rest are read."""
    table = {}
    for position, entry in enumerate(entries):
        if isinstance(entry, dict):
            try:
                table[_whole_number(entry.get("id", position))] = entry
            except ValueError:
                report.skip(MALFORMED_LINE, f"{what}[{position}]: id {entry.get('id')!r} is not a whole number")
    return table


def _whole_number(value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().lstrip("-").isdigit():
        raise ValueError(f"{value!r} is not a whole number")
    return int(value)


def _image(root: Path, folder: str, img_id) -> Path:
    base = root / folder
    for suffix in (".tif", ".tiff", ".png", ".jpg"):
        candidate = base / f"{img_id}{suffix}"
        if candidate.is_file():
            return candidate
    return base / f"{img_id}.tif"


def load_rsvqa(root: Path | str, benchmark: str = "lr", split: str | None = None, check_images: bool = True) -> Loaded:
    if benchmark not in LAYOUT:
        raise BenchmarkError(f"RSVQA: benchmark must be one of {list(LAYOUT)}")
    root = Path(root)
    if not root.is_dir():
        raise BenchmarkError(f"RSVQA: {root} is not a directory (expected *_questions.json, *_answers.json)")
    prefix, image_dir, default_split, bench_file = LAYOUT[benchmark]
    split = split or default_split
    loaded_name = f"RSVQA-{benchmark.upper()}"
    items, notes = [], []
    report = ReadReport()
    questions = _by_id(_list(root / f"{prefix}_{split}_questions.json", "questions"), "questions", report)
    answers = _by_id(_list(root / f"{prefix}_{split}_answers.json", "answers"), "answers", report)
    bench_path = root / bench_file
    if bench_path.is_file():
        notes.append(f"questions from {bench_file}; answers joined from {prefix}_{split}_answers.json by question_id")
        selection = []
        for number, line in enumerate(bench_path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                selection.append((_whole_number(row["question_id"]), row))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                report.skip(MALFORMED_LINE, f"{bench_file}:{number}: {err}")
    else:
        selection = [(qid, None) for qid, q in questions.items() if q.get("active", True)]
    for qid, bench_row in selection:
        question = questions.get(qid)
        if question is None:
            report.skip(MALFORMED_LINE, f"question {qid}: not in the questions JSON")
            continue
        answer_ids = question.get("answers_ids") or []
        try:
            answer = answers.get(_whole_number(answer_ids[0])) if isinstance(answer_ids, list) and answer_ids else None
        except ValueError:
            answer = None
        if answer is None or not isinstance(answer.get("answer"), str):
            report.skip(MALFORMED_LINE, f"question {qid}: no answer for answers_ids {answer_ids}")
            continue
        raw_type = str((bench_row or {}).get("category") or question.get("type", "")).strip().lower()
        kind = TYPE_NAMES.get(raw_type, raw_type)
        if bench_row is not None and isinstance(bench_row.get("image"), str):
            image = root / image_dir / bench_row["image"]
            if not image.is_file():
                image = _image(root, image_dir, Path(bench_row["image"]).stem)
        else:
            image = _image(root, image_dir, question.get("img_id"))
        if check_images and not image.is_file():
            report.skip(MISSING_IMAGE, f"question {qid}: {image} not found")
            continue
        text = (bench_row or {}).get("text") or f"{str(question.get('question', '')).strip()}\n{PROMPT_SUFFIX}"
        items.append(
            EvalItem(
                id=str(qid),
                image=str(image),
                prompt=text.replace("<image>", "").strip(),
                reference=answer["answer"],
                kind=kind,
                meta={"img_id": question.get("img_id")},
            )
        )
    return Loaded(loaded_name, items, report, notes)
