"""DOTA v1.0 / v1.5 / v2.0 reader: `<root>/<split>/images/P0706.png` + `<root>/<split>/labelTxt/P0706.txt`.

One txt per image: optional `imagesource:` / `gsd:` header lines, then `x1 y1 ... x4 y4 class difficult` per object
(pixel coordinates, ints or floats; the difficulty token may be missing, meaning 0). Devkit patches have no header.
Class names become canonical (`geopilot.vocabulary`: `plane` -> `airplane`, `small-vehicle` -> `small vehicle`);
a name in no vocabulary is kept verbatim.
Run: `read_dota(Path("DOTA"), split="train", version="1.5")`.
"""

from __future__ import annotations

from pathlib import Path

from geopilot.data_gen.readers.common import (
    BAD_POLYGON,
    MALFORMED_FILE,
    MALFORMED_LINE,
    DatasetRootError,
    ReadResult,
    add_object,
    checked_image,
    class_label,
    find_image,
    finish,
    polygon_object,
    require_dir,
)
from geopilot.records import AnnotationRecord, ReadReport

VERSIONS = ("1.0", "1.5", "2.0")  # class lists in geopilot/vocabulary.yaml as "DOTA v<version>"
LABEL_FOLDERS = ("labelTxt", "labelTxt-v1.5", "labelTxt-v1.0", "labelTxt-v2.0")


def parse_dota_lines(
    text: str,
    width: int,
    height: int,
    dataset: str,
    record: AnnotationRecord,
    report: ReadReport,
    name: str,
) -> None:
    for line_no, line in enumerate(text.splitlines(), start=1):
        tokens = line.split()
        if not tokens or (":" in tokens[0] and len(tokens) < 9):
            continue  # blank line or a metadata header ("imagesource:GoogleEarth", "gsd:0.2555", "gsd:null")
        where = f"{name}:{line_no}"
        if len(tokens) < 9:
            report.skip(BAD_POLYGON if len(tokens) >= 2 else MALFORMED_LINE, f"{where}: {len(tokens)} tokens, need 9")
            continue
        try:
            coords = [float(token) for token in tokens[:8]]
            difficult = len(tokens) > 9 and int(float(tokens[9])) != 0
        except ValueError:
            report.skip(MALFORMED_LINE, f"{where}: non-numeric coordinate or difficulty in {line.strip()!r}")
            continue
        points = list(zip(coords[0::2], coords[1::2], strict=False))
        made = polygon_object(points, width, height, class_label(tokens[8], dataset), difficult=difficult)
        add_object(record, made, report, where)


def read_dota(root: Path, split: str = "train", version: str = "1.5") -> ReadResult:
    if version not in VERSIONS:
        raise DatasetRootError(f"DOTA: unknown version {version!r} (choose from {', '.join(VERSIONS)})")
    split_dir = require_dir(Path(root) / split, "DOTA", "expected <root>/<split>/{images,labelTxt}")
    label_dir = next((split_dir / n for n in LABEL_FOLDERS if (split_dir / n).is_dir()), None)
    if label_dir is None:
        raise DatasetRootError(f"DOTA: no labelTxt folder in {split_dir} (the test split has no public labels)")
    records: list[AnnotationRecord] = []
    report = ReadReport()
    for label_path in sorted(label_dir.glob("*.txt")):
        stem = label_path.stem
        found = find_image(split_dir / "images", stem) or split_dir / "images" / f"{stem}.png"
        image = checked_image(found, report, label_path.name)
        if image is None:
            continue
        image_path, width, height = image
        try:
            text = label_path.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as err:
            report.skip(MALFORMED_FILE, f"{label_path}: {err}")
            continue
        record = AnnotationRecord("DOTA", str(image_path), width, height, "optical", split, stem)
        parse_dota_lines(text, width, height, f"DOTA v{version}", record, report, label_path.name)
        records.append(record)
    return finish(records, report)
