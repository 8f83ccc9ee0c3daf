"""RISBench (CroBIM layout) reader: `img_rgb/<id>.png`, `mask/<id>.png` (binary 0/255), and
`output_phrase_<split>.txt` with one `<image_file> <referring phrase>` per line (split on the first space).

One image per referent, so each image becomes one record with one object (box from the mask, mask as COCO RLE)
and every phrase naming that image as a referring expression. The val list points at `train_*.png` files, so
images are looked up by the name in the line, never by split. The layout gives no class, so the label is
"object". Run: `read_risbench(Path("RISBench"), split="val")`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from geopilot.data_gen.readers.common import (
    BAD_GEOMETRY,
    MALFORMED_LINE,
    MISSING_LABEL,
    SIZE_MISMATCH,
    UNREADABLE_IMAGE,
    DatasetRootError,
    ReadResult,
    box_object,
    checked_image,
    finish,
    image_size,
    mask_to_rle,
    read_index_file,
    require_dir,
)
from geopilot.records import AnnotationRecord, ReadReport, ReferringExpression

RISBENCH_LABEL = "object"


def binary_mask(path: Path) -> np.ndarray:
    """0/255 (or 0/1) mask image -> bool array; RGB masks are reduced to luminance first."""
    with Image.open(path) as image:
        values = np.asarray(image.convert("L"))
    return values > (127 if values.max(initial=0) > 1 else 0)


def _phrases(list_file: Path, report: ReadReport) -> dict[str, list[str]]:
    """image file name -> phrases, in file order."""
    by_image: dict[str, list[str]] = {}
    for line_no, line in enumerate(read_index_file(list_file, "RISBench").splitlines(), start=1):
        if not line.strip():
            continue
        name, _, phrase = line.strip().partition(" ")
        if not phrase.strip():
            report.skip(MALFORMED_LINE, f"{list_file.name}:{line_no}: no phrase after the image name")
            continue
        by_image.setdefault(name, []).append(" ".join(phrase.split()))
    return by_image


def read_risbench(root: Path, split: str = "train") -> ReadResult:
    root = require_dir(root, "RISBench", "expected img_rgb/, mask/ and output_phrase_<split>.txt")
    list_file = root / f"output_phrase_{split}.txt"
    if not list_file.is_file():
        raise DatasetRootError(f"RISBench: phrase list {list_file} not found")
    report = ReadReport()
    records: list[AnnotationRecord] = []
    for name, phrases in _phrases(list_file, report).items():
        where = f"{list_file.name} {name}"
        image = checked_image(root / "img_rgb" / name, report, where)
        if image is None:
            continue
        image_path, width, height = image
        mask_path = root / "mask" / name
        if not mask_path.is_file():
            report.skip(MISSING_LABEL, f"{where}: mask {mask_path} not found")
            continue
        mask_size = image_size(mask_path)  # from the header: a mask is decoded only once it is its image's size
        if mask_size is None:
            report.skip(UNREADABLE_IMAGE, f"{where}: mask {mask_path} cannot be read")
            continue
        if mask_size != (width, height):
            report.skip(SIZE_MISMATCH, f"{where}: mask {mask_size[0]}x{mask_size[1]} vs image {width}x{height}")
            continue
        try:
            mask = binary_mask(mask_path)
        except OSError as err:
            report.skip(UNREADABLE_IMAGE, f"{where}: mask {mask_path}: {err}")
            continue
        rows, cols = np.nonzero(mask)
        if rows.size == 0:
            report.skip(BAD_GEOMETRY, f"{where}: empty mask")
            continue
        made = box_object(
            float(cols.min()),
            float(rows.min()),
            float(cols.max() + 1),
            float(rows.max() + 1),
            width,
            height,
            RISBENCH_LABEL,
            mask=mask_to_rle(mask),
        )
        if isinstance(made, str):
            report.skip(made, where)
            continue
        record = AnnotationRecord("RiSBench", str(image_path), width, height, "optical", split, Path(name).stem)
        record.objects.append(made)
        record.referring.extend(ReferringExpression(phrase, (0,)) for phrase in phrases)
        records.append(record)
    return finish(records, report)
