"""RICE cloud-removal reader: `RICE1/{cloud,label}/<n>.png` and `RICE2/{cloud,label,mask}/<n>.png`.

Pairs match by file name; `label` is the cloud-free reference. There is no official split, so we ship a fixed
one: a pair is "test" when the first byte of sha1("<subset>/<stem>") is below 52 (~20%), else "train";
split "all" takes every pair. Root may be `RICE_DATASET/` or one `RICE1/` folder.
Run: `read_rice(Path("RICE_DATASET"), split="train")`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from geopilot.data_gen.readers.common import (
    IMAGE_SUFFIXES,
    MISSING_LABEL,
    SIZE_MISMATCH,
    DatasetRootError,
    ReadResult,
    checked_image,
    finish,
    image_size,
    require_dir,
)
from geopilot.data_gen.records import AnnotationRecord, ReadReport

SUBSETS = ("RICE1", "RICE2")
SPLITS = ("train", "test", "all")
TEST_BYTE_BELOW = 52  # 52/256 ~ 20% test


def rice_split(subset: str, stem: str) -> str:
    return "test" if hashlib.sha1(f"{subset}/{stem}".encode()).digest()[0] < TEST_BYTE_BELOW else "train"


def _numeric_first(path: Path) -> tuple[int, str]:
    return (int(path.stem), path.stem) if path.stem.isdigit() else (1 << 62, path.stem)


def read_rice(root: Path, split: str = "train") -> ReadResult:
    if split not in SPLITS:
        raise DatasetRootError(f"RICE: split must be one of {list(SPLITS)} (RICE has no official split)")
    root = require_dir(root, "RICE", "expected RICE1/ and/or RICE2/ with cloud/ and label/")
    subsets = [(name, root / name) for name in SUBSETS if (root / name / "cloud").is_dir()]
    if not subsets and (root / "cloud").is_dir():
        subsets = [(root.name, root)]
    if not subsets:
        raise DatasetRootError(f"RICE: no RICE1/cloud, RICE2/cloud or cloud/ folder in {root}")
    report = ReadReport()
    records: list[AnnotationRecord] = []
    for subset, folder in subsets:
        clouds = [p for p in (folder / "cloud").iterdir() if p.suffix.lower() in IMAGE_SUFFIXES]
        for cloud in sorted(clouds, key=_numeric_first):
            if split != "all" and rice_split(subset, cloud.stem) != split:
                continue
            image = checked_image(cloud, report, f"{subset} {cloud.name}")
            if image is None:
                continue
            cloud_path, width, height = image
            clear = folder / "label" / cloud.name
            if not clear.is_file():
                report.skip(MISSING_LABEL, f"{subset} {cloud.name}: no cloud-free pair {clear}")
                continue
            if image_size(clear) != (width, height):
                report.skip(SIZE_MISMATCH, f"{subset} {cloud.name}: pair size {image_size(clear)} vs {width}x{height}")
                continue
            record_split = rice_split(subset, cloud.stem)
            record = AnnotationRecord(
                "RICE", str(cloud_path), width, height, "optical", record_split, f"{subset}/{cloud.stem}"
            )
            record.cloud_free_image = str(clear.resolve())
            records.append(record)
    return finish(records, report)
