"""LEVIR-CD building change detection: bi-temporal pairs with a binary change label.

Layout (the authors' release, https://justchenhao.github.io/LEVIR/, unpacked `train.zip` / `val.zip` / `test.zip`):
`<root>/<split>/A/<name>.png` (the earlier image), `<root>/<split>/B/<name>.png` (the later one, same name) and
`<root>/<split>/label/<name>.png` (0 = unchanged, 255 = changed), 1024 x 1024 px at 0.5 m. Cropped copies (BIT's
256 x 256 `LEVIR-CD256`) keep the same three folders and read alike; their `list/<split>.txt` is not needed.
One record per pair: `image` is A, `after_image` B, `change_mask` the label. Skipped, by cause: a pair whose B or label is
missing (`missing_image`, `missing_label`), whose B or label has another size than A (`size_mismatch`), plus the
shared causes. Run: `read_levir_cd(Path("LEVIR-CD"), split="test")`.
"""

from __future__ import annotations

from pathlib import Path

from geopilot.data_gen.readers.common import (
    IMAGE_SUFFIXES,
    MISSING_LABEL,
    SIZE_MISMATCH,
    UNREADABLE_IMAGE,
    DatasetRootError,
    ReadResult,
    checked_pair,
    find_image,
    finish,
    image_size,
    require_dir,
)
from geopilot.records import AnnotationRecord, ReadReport

SPLITS = ("train", "val", "test")
LAYOUT = "<split>/{A,B,label}/<name>.png (0/255 change labels)"


def read_levir_cd(root: Path, split: str = "train") -> ReadResult:
    if split not in SPLITS:
        raise DatasetRootError(f"LEVIR-CD: split must be one of {list(SPLITS)}, got {split!r}")
    root = require_dir(root, "LEVIR-CD", "expected train/, val/, test/ each with A/, B/ and label/")
    folder = root / split
    if not (folder / "A").is_dir():
        raise DatasetRootError(f"LEVIR-CD: no {split}/A/ under {root} (expected {LAYOUT})")
    report = ReadReport(layout=LAYOUT)
    records: list[AnnotationRecord] = []
    for before in sorted(p for p in (folder / "A").iterdir() if p.suffix.lower() in IMAGE_SUFFIXES):
        what = f"{split}/{before.name}"
        after = find_image(folder / "B", before.stem) or folder / "B" / before.name
        pair = checked_pair(before, after, report, what)
        if pair is None:
            continue
        path, width, height = pair
        label = find_image(folder / "label", before.stem)
        if label is None:
            report.skip(MISSING_LABEL, f"{what}: no change label {folder / 'label' / before.name}")
            continue
        label_size = image_size(label)
        if label_size is None:
            report.skip(UNREADABLE_IMAGE, f"{what}: cannot read the size of the label {label}")
            continue
        if label_size != (width, height):
            report.skip(SIZE_MISMATCH, f"{what}: label {label_size[0]}x{label_size[1]}, images {width}x{height}")
            continue
        record = AnnotationRecord("LEVIR-CD", str(path), width, height, "optical", split, f"{split}/{before.stem}")
        record.after_image, record.change_mask = str(after.resolve()), str(label.resolve())
        records.append(record)
    return finish(records, report)
