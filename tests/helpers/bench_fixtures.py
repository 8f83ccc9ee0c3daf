"""Small benchmark folders in the real on-disk formats, traps included (docs/eval_tasks.md lists them)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
from PIL import Image


def _image(path: Path, size: int = 32, mode: str = "RGB", seed: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    shape = (size, size, 3) if mode == "RGB" else (size, size)
    Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8), mode).save(path)


def write_rsvqa(root: Path, benchmark: str = "lr", with_bench_file: bool = True) -> Path:
    """RSVQA JSONs (position == id, inactive entries kept, answers' back-reference misspelt) + images + GeoChat-Bench
    jsonl without answers."""
    prefix, folder, split, bench = {
        "lr": ("LR_split", "Images_LR", "test", "lrben.jsonl"),
        "hr": ("USGS_split", "Data", "test_phili", "hrben.jsonl"),
    }[benchmark]
    kinds = ["presence", "comp", "rural_urban", "count"] if benchmark == "lr" else ["presence", "comp", "count", "area"]
    answers_by_kind = {"presence": "yes", "comp": "no", "rural_urban": "rural", "count": "12", "area": "1234m2"}
    images, questions, answers = [], [], []
    for img_id in range(3):
        active = img_id != 1  # image 1 belongs to another split: kept in the list, inactive
        qids = []
        for kind in kinds:
            qid = len(questions)
            questions.append(
                {
                    "id": qid,
                    "img_id": img_id,
                    "type": kind,
                    "question": f"Q{qid} about {kind}?",
                    "answers_ids": [qid],
                    "active": active,
                    "date_added": 1584542212.1,
                    "people_id": 0,
                }
            )
            answers.append({"id": qid, "quesiton_id": qid, "answer": answers_by_kind[kind], "active": active})
            qids.append(qid)
        images.append({"id": img_id, "questions_ids": qids, "active": active, "original_name": f"{img_id}.tif"})
        if active:
            _image(root / folder / f"{img_id}.tif", seed=img_id)
    root.mkdir(parents=True, exist_ok=True)
    for name, key, value in (
        ("questions", "questions", questions),
        ("answers", "answers", answers),
        ("images", "images", images),
    ):
        (root / f"{prefix}_{split}_{name}.json").write_text(json.dumps({key: value}))
    if with_bench_file:
        lines = [
            {
                "question_id": q["id"],
                "image": f"{q['img_id']}.tif",
                "category": q["type"],
                "text": f"{q['question']}\nAnswer the question using a single word or phrase.",
            }
            for q in questions
            if q["active"]
        ]
        (root / bench).write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return root


REFERRING_ROWS = [
    # DOTA patch (1024 px), one rotated target, nested 4-point polygon
    {
        "question_id": 0,
        "image_id": "P0003_0004.png",
        "question": "the small vehicle on the left",
        "type": "ref",
        "dataset": "DOTA",
        "obj_ids": [7],
        "size_group": "small",
        "ground_truth": [[[102.4, 409.6], [153.6, 409.6], [153.6, 450.56], [102.4, 450.56]]],
    },
    # FAIR1M patch (600 px), flat 8-number polygon, not wrapped in a list
    {
        "question_id": 1,
        "image_id": "train_1.png",
        "question": "the large ship",
        "type": "ref",
        "dataset": "FAIR1M",
        "obj_ids": [3],
        "size_group": "large",
        "ground_truth": [60, 60, 300, 60, 300, 240, 60, 240],
    },
    # DIOR patch (800 px), two targets, one with a bow-tie corner order (repaired to its hull)
    {
        "question_id": 2,
        "image_id": "00017",
        "question": "the two tennis courts",
        "type": "grounding",
        "dataset": "DIOR",
        "obj_ids": [1, 2],
        "size_group": "medium",
        "ground_truth": [
            [[80, 80], [240, 80], [240, 240], [80, 240]],
            [[400, 400], [560, 560], [560, 400], [400, 560]],
        ],
    },
    # degenerate ground truth (all points on a line): skipped and counted
    {
        "question_id": 3,
        "image_id": "00018",
        "question": "a line",
        "type": "ref",
        "dataset": "DIOR",
        "obj_ids": [1],
        "size_group": "small",
        "ground_truth": [[[0, 0], [10, 10], [20, 20], [30, 30]]],
    },
    # no ground_truth field: malformed line
    {"question_id": 4, "image_id": "00019", "question": "nothing", "type": "ref"},
]


def write_referring(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in ("P0003_0004.png", "train_1.png", "00017.jpg", "00018.jpg", "00019.jpg"):
        _image(root / "images" / name)
    (root / "referring.jsonl").write_text("\n".join(json.dumps(r) for r in REFERRING_ROWS) + "\n")
    return root


def write_sarlang(root: Path) -> Path:
    """SARimages/ + Text/VQA/SARVQA1_test.csv (sniffed header; type names in words, one row without a type, one
    malformed) + Text/caption/Caption_test.csv (one image captioned twice, one empty caption)."""
    for i, name in enumerate(("0009787.jpg", "0009788.jpg", "France_Alpes-Maritimes_Nice_3.png")):
        _image(root / "SARimages" / name, mode="L", seed=i)
    vqa = root / "Text" / "VQA"
    vqa.mkdir(parents=True)
    with (vqa / "SARVQA1_test.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Image", "Question", "Answer", "Type"])
        w.writerow(["0009787.jpg", "Is there a ship in the image?", "Yes", "Object Identification"])
        w.writerow(["0009787.jpg", "How many ships are there?", "3", "Instance Counting"])
        w.writerow(["0009788.jpg", "What type of object is at the centre?", "aircraft", "Object Classification"])
        w.writerow(["0009788.jpg", "Where is the aircraft located?", "upper left", ""])  # type from the question
        w.writerow(["0009788.jpg", "", "", "Object Positioning"])  # malformed: no question/answer
    cap = root / "Text" / "caption"
    cap.mkdir(parents=True)
    with (cap / "Caption_test.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["image_name", "caption"])
        w.writerow(["France_Alpes-Maritimes_Nice_3.png", "A dense urban area along the coast."])
        w.writerow(["0009787.jpg", "Three ships are moored near the harbor."])
        w.writerow(["0009787.jpg", "Bright ship targets in dark sea clutter."])
        w.writerow(["0009788.jpg", ""])
    return root


# The benchmark folder each `geopilot eval` task reads, written under a root (returns the folder).
TASK_FOLDERS = {
    "rsvqa-lr": lambda root: write_rsvqa(root / "lr", "lr"),
    "rsvqa-hr": lambda root: write_rsvqa(root / "hr", "hr"),
    "referring": lambda root: write_referring(root / "ref"),
    "sar-vqa": lambda root: write_sarlang(root / "sar"),
    "sar-caption": lambda root: write_sarlang(root / "sarcap"),
}
