"""DOTA v1.0 / v1.5 / v2.0 reader: images under `<root>/<split>/images/` (at any depth: the archives unpack to
`images/`, `images/part1/images/`, v2.0's `images/part4/` ...) and one label txt per image, in any of the layouts
the dataset is distributed in:

- flat (devkit / mmrotate / Ultralytics): `<split>/labelTxt/P0706.txt`
- official v1.0 archives: `<split>/labelTxt-v1.0/labelTxt/` (oriented), `.../Train_Task2_gt/trainset_reclabelTxt/`
  or `.../trainset_reclabelTxt/` (horizontal)
- official v1.5 / v2.0 archives: `<split>/labelTxt-v1.5/DOTA-v1.5_train/`, `..._train_hbb/` (v2.0 alike)
- an archive unzipped in place: the txt files directly in `labelTxt-v<version>/`

Oriented labels are preferred; the horizontal (`_hbb`, `reclabelTxt`) ones are read when they are the only ones
(the same 8-number format). `report.layout` names the folder read. Labels of another version are refused with the
version to set. One txt per image: optional `imagesource:` / `gsd:` header lines, then `x1 y1 ... x4 y4 class
difficult` per object (pixel coordinates, ints or floats; the difficulty token may be missing, meaning 0).
Class names become canonical (`geopilot.vocabulary`: `plane` -> `airplane`); a name in no vocabulary is kept.
Run: `read_dota(Path("DOTA"), split="train", version="1.5")`.
"""

from __future__ import annotations

from pathlib import Path

from geopilot.data_gen.readers.common import (
    BAD_POLYGON,
    IMAGE_SUFFIXES,
    MALFORMED_FILE,
    MALFORMED_LINE,
    DatasetRootError,
    ReadResult,
    add_polygon,
    checked_image,
    finish,
    require_dir,
)
from geopilot.records import AnnotationRecord, ReadReport

VERSIONS = ("1.0", "1.5", "2.0")  # class lists in geopilot/vocabulary.yaml as "DOTA v<version>"
LAYOUTS = (
    "<split>/images/**/P*.png + <split>/labelTxt/*.txt (flat, devkit / mmrotate)",
    "<split>/labelTxt-v1.0/labelTxt/*.txt (v1.0 archive; horizontal: Train_Task2_gt/trainset_reclabelTxt/)",
    "<split>/labelTxt-v1.5/DOTA-v1.5_<split>[_hbb]/*.txt (v1.5 archive)",
    "<split>/labelTxt-v2.0/DOTA-v2.0_<split>[_hbb]/*.txt (v2.0 archive)",
)


def label_folders(split: str, version: str) -> list[tuple[str, str]]:
    """(folder under <split>/, kind) in preference order for one version: oriented before horizontal."""
    versioned = f"labelTxt-v{version}"
    if version == "1.0":
        oriented = [f"{versioned}/labelTxt", versioned]
        horizontal = [
            f"{versioned}/{split.capitalize()}_Task2_gt/{split}set_reclabelTxt",
            f"{versioned}/{split}set_reclabelTxt",
        ]
    else:
        oriented = [f"{versioned}/DOTA-v{version}_{split}", versioned, f"labelTxt/DOTA-v{version}_{split}"]
        horizontal = [f"{versioned}/DOTA-v{version}_{split}_hbb"]
    return [(f, "oriented") for f in ["labelTxt", *oriented]] + [(f, "horizontal") for f in horizontal]


def _has_labels(folder: Path) -> bool:
    return folder.is_dir() and any(folder.glob("*.txt"))


def find_label_folder(split_dir: Path, split: str, version: str) -> tuple[Path, str]:
    for relative, kind in label_folders(split, version):
        if _has_labels(split_dir / relative):
            return split_dir / relative, f"{relative}/*.txt ({kind} boxes)"
    others = [
        (relative, other)
        for other in VERSIONS
        if other != version
        for relative, _ in label_folders(split, other)[1:]  # [0] is the flat labelTxt/, shared by every version
        if _has_labels(split_dir / relative)
    ]
    hint = f"; found {others[0][0]}/: set options.version: '{others[0][1]}'" if others else ""
    raise DatasetRootError(
        f"DOTA v{version}: no labelTxt folder with .txt files in {split_dir} (the test split has no public labels){hint}"
    )


def image_index(images_dir: Path) -> dict[str, Path]:
    """Image stem -> path, over every file under `images/` at any depth (first in sorted order wins)."""
    index: dict[str, Path] = {}
    if images_dir.is_dir():
        for path in sorted(images_dir.rglob("*")):
            if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file():
                index.setdefault(path.stem, path)
    return index


def parse_dota_lines(
    text: str,
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
            report.skip(MALFORMED_LINE, f"{where}: non-numeric coordinate or difficulty in {line.strip()[:120]!r}")
            continue
        points = list(zip(coords[0::2], coords[1::2], strict=False))
        add_polygon(record, tokens[8], dataset, points, report, where, difficult=difficult)


def read_dota(root: Path, split: str = "train", version: str = "1.5") -> ReadResult:
    if version not in VERSIONS:
        raise DatasetRootError(f"DOTA: unknown version {version!r} (choose from {', '.join(VERSIONS)})")
    split_dir = require_dir(Path(root) / split, "DOTA", "expected <root>/<split>/{images,labelTxt}")
    label_dir, layout = find_label_folder(split_dir, split, version)
    images = image_index(split_dir / "images")
    records: list[AnnotationRecord] = []
    report = ReadReport(layout=layout)
    for label_path in sorted(label_dir.glob("*.txt")):
        stem = label_path.stem
        found = images.get(stem, split_dir / "images" / f"{stem}.png")
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
        parse_dota_lines(text, f"DOTA v{version}", record, report, label_path.name)
        records.append(record)
    return finish(records, report)
