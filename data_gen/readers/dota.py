"""DOTA v1.0 / v1.5 / v2.0 reader: images under `<root>/<split>/images/` (at any depth: the archives unpack to
`images/`, `images/part1/images/`, v2.0's `images/part4/` ...) and one label txt per image, in any of the layouts
the dataset is distributed in (docs/datasets.md, with sources):

- flat (devkit / mmrotate / Ultralytics): `<split>/labelTxt/P0706.txt`
- official v1.0 archives: `<split>/labelTxt-v1.0/labelTxt/` (oriented), `.../Train_Task2_gt/trainset_reclabelTxt/`
  or `.../trainset_reclabelTxt/` (horizontal)
- official v1.5 / v2.0 archives: `<split>/labelTxt-v1.5/DOTA-v1.5_train/`, `..._train_hbb/` (v2.0 alike, with its
  `train_meta/meta/` of per-image `imagesource:` / `gsd:` lines beside them)
- an archive unzipped in place: the txt files directly in `labelTxt-v<version>/`

The version need not be given: the folder names say it (`labelTxt-v2.0`, `DOTA-v2.0_train`), else the class names
do (`container-crane` first came with v1.5, `airport` / `helipad` with v2.0; a root naming only v1.0's 15 classes
reads the same under every version and is read as v1.0). A root holding label folders of several versions (in
one split or across its splits), or a version folder whose labels name a later version's classes, mixes versions:
it is refused with the folders named unless `version` picks one. `report.layout` names the folder read, `report.detected` the version and its evidence.
Oriented labels are preferred; the horizontal (`_hbb`, `reclabelTxt`) ones are read when they are the only ones
(the same 8-number format). One txt per image: optional header lines (`imagesource:GoogleEarth`, `gsd:0.2555`,
`gsd:null`), then `x1 y1 ... x4 y4 class difficult` per object (pixel coordinates, ints or floats; the difficulty
token may be missing, meaning 0). Class names become canonical (`geopilot.vocabulary`: `plane` -> `airplane`); a
name in no vocabulary is kept.
Run: `read_dota(Path("DOTA"), split="train")`.
"""

from __future__ import annotations

from pathlib import Path

from geopilot.data_gen.readers.common import (
    BAD_POLYGON,
    MALFORMED_FILE,
    MALFORMED_LINE,
    DatasetRootError,
    ReadResult,
    add_polygon,
    checked_image,
    finish,
    image_index,
    read_limited,
    require_dir,
)
from geopilot.records import AnnotationRecord, ReadReport

VERSIONS = ("1.0", "1.5", "2.0")  # class lists in geopilot/vocabulary.yaml as "DOTA v<version>"
FIRST_VERSION = {"container-crane": "1.5", "airport": "2.0", "helipad": "2.0"}  # the classes v1.0 does not have
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


def version_folders(root: Path) -> dict[str, list[str]]:
    """Version -> the folders of its own naming that hold labels, over every split folder of the root
    ("train/labelTxt-v1.0/labelTxt"); the flat labelTxt/ ([0] of `label_folders`) is every version's: it says none."""
    found: dict[str, list[str]] = {}
    for split_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for version in VERSIONS:
            for relative, _ in label_folders(split_dir.name, version)[1:]:
                if _has_labels(split_dir / relative):
                    found.setdefault(version, []).append(f"{split_dir.name}/{relative}")
    return found


def find_label_folder(
    split_dir: Path, split: str, version: str | None, found: dict[str, list[str]]
) -> tuple[Path, str]:
    """The label folder of `version` in the split (None: the flat labelTxt/ only, no version's folder being there)."""
    for relative, kind in label_folders(split, version or "1.0"):
        if _has_labels(split_dir / relative):
            return split_dir / relative, f"{relative}/*.txt ({kind} boxes)"
    others = [(folders[0], other) for other, folders in found.items() if other != version]
    hint = f"; found {others[0][0]}/: set options.version: '{others[0][1]}'" if others else ""
    raise DatasetRootError(
        f"DOTA{f' v{version}' if version else ''}: no labelTxt folder with .txt files in {split_dir} "
        f"(the test split has no public labels){hint}"
    )


def _mixed_versions(root: Path, found: dict[str, list[str]]) -> DatasetRootError:
    folders = ", ".join(f"{folder}/ (v{version})" for version, names in found.items() for folder in names)
    choices = " or ".join(f"'{version}'" for version in found)
    return DatasetRootError(
        f"DOTA: {root} mixes label folders of {len(found)} versions: {folders}; "
        f"set options.version to {choices} to read one"
    )


def _is_header(tokens: list[str]) -> bool:
    """A metadata line ("imagesource:GoogleEarth", "gsd:0.2555", "gsd:null", "acquisition dates:..."), not an object."""
    return len(tokens) < 9 and any(":" in token for token in tokens)


def class_version(texts: dict[str, str]) -> tuple[str, str]:
    """The first version whose class list covers every class named in the label texts, and the evidence
    ("1.0", "") or ("2.0", "airport in P0001.txt")."""
    version, evidence = "1.0", ""
    for name, text in texts.items():
        for line in text.splitlines():
            tokens = line.split()
            first = FIRST_VERSION.get(tokens[8]) if len(tokens) >= 9 else None
            if first is not None and VERSIONS.index(first) > VERSIONS.index(version):
                version, evidence = first, f"{tokens[8]} in {name}"
    return version, evidence


def parse_dota_lines(
    text: str,
    dataset: str,
    record: AnnotationRecord,
    report: ReadReport,
    name: str,
) -> None:
    for line_no, line in enumerate(text.splitlines(), start=1):
        tokens = line.split()
        if not tokens or _is_header(tokens):
            continue
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


def _choose_version(
    root: Path, split_dir: Path, version: str | None, found: dict[str, list[str]]
) -> tuple[str | None, str]:
    """(version, why) before the labels are read: the option, else the one version whose folders are in the root,
    else None (the classes decide); a root with several versions' folders and no option is refused."""
    if version is not None:
        return version, "set by options.version"
    if _has_labels(split_dir / "labelTxt") or not found:
        return None, ""
    if len(found) > 1:
        raise _mixed_versions(root, found)
    ((only, folders),) = found.items()
    return only, f"from the folder {folders[0].split('/')[1]}/"


def read_dota(root: Path, split: str = "train", version: str | None = None) -> ReadResult:
    if version is not None and version not in VERSIONS:
        raise DatasetRootError(f"DOTA: unknown version {version!r} (choose from {', '.join(VERSIONS)})")
    split_dir = require_dir(Path(root) / split, "DOTA", "expected <root>/<split>/{images,labelTxt}")
    found = version_folders(split_dir.parent)
    chosen, why = _choose_version(split_dir.parent, split_dir, version, found)
    label_dir, layout = find_label_folder(split_dir, split, chosen, found)
    images = image_index(split_dir / "images")
    report = ReadReport()
    texts: dict[str, str] = {}
    for label_path in sorted(label_dir.glob("*.txt")):
        try:
            texts[label_path.name] = read_limited(label_path).decode("utf-8-sig")
        except (OSError, UnicodeDecodeError, ValueError) as err:  # ValueError: over the limit, not a regular file
            report.skip(MALFORMED_FILE, f"{label_path}: {err}")
    named, evidence = class_version(texts)
    if version is None and chosen is not None and VERSIONS.index(named) > VERSIONS.index(chosen):
        raise DatasetRootError(
            f"DOTA: {label_dir} is a v{chosen} folder but its labels name v{named} classes ({evidence}): "
            f"its files mix versions; set options.version: '{chosen}' to read the folder as it is"
        )
    if chosen is None:
        chosen = named
        why = (
            f"from its classes: {evidence}"
            if evidence
            else "its labels name v1.0 classes only, read alike by every version"
        )
    report.layout, report.detected = layout, f"DOTA v{chosen} ({why})"
    records: list[AnnotationRecord] = []
    for name, text in texts.items():
        stem = Path(name).stem
        image = checked_image(images.get(stem, split_dir / "images" / f"{stem}.png"), report, name)
        if image is None:
            continue
        image_path, width, height = image
        record = AnnotationRecord("DOTA", str(image_path), width, height, "optical", split, stem)
        parse_dota_lines(text, f"DOTA v{chosen}", record, report, name)
        records.append(record)
    return finish(records, report)
