"""Shared pieces of the source-dataset readers: skip causes, root checks, safe XML, geometry normalisation.

Every reader returns `(records, report)`: bad items are skipped and counted in `report` under one of the causes
below; only a missing or unusable dataset root raises (`DatasetRootError`, a `GeoPilotInputError`). Every text file
is read with `read_limited`: regular files only (a FIFO would hang) and at most `LABEL_FILE_MAX_BYTES` for one
image's label file, `DATASET_FILE_MAX_BYTES` for a file the whole source hangs on (a sparse 2 GB label file is
refused from its size, not read).
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import defusedxml.ElementTree as SafeET
import numpy as np
from defusedxml import DefusedXmlException

from geopilot.errors import GeoPilotInputError, first_line
from geopilot.fileio import MiB, read_bounded
from geopilot.image import read_size
from geopilot.records import AnnotationRecord, ObjectAnnotation, ReadReport
from geopilot.vocabulary import canonical_class

ReadResult = tuple[list[AnnotationRecord], ReadReport]

# Skip causes: the keys of ReadReport.skipped (records or objects skipped for that reason).
MISSING_IMAGE = "missing_image"  # an annotation names an image that is not on disk
UNREADABLE_IMAGE = "unreadable_image"  # the image exists but its header cannot be read
MISSING_LABEL = "missing_label"  # an image/list entry whose label file (mask, pair, graph) is absent
MALFORMED_FILE = "malformed_file"  # XML/JSON/CSV/pickle that does not parse or lacks required fields
MALFORMED_LINE = "malformed_line"  # one object line/row/entry inside an otherwise good file
UNSAFE_PICKLE = "unsafe_pickle"  # a pickle that asks for anything beyond builtin containers and numbers
BAD_POLYGON = "bad_polygon"  # fewer than 3 points, or zero area
BAD_GEOMETRY = "bad_geometry"  # a box that is empty or lies outside the image
UNKNOWN_CLASS = "unknown_class"  # a label code / category id the dataset does not define (names are never skipped)
SIZE_MISMATCH = "size_mismatch"  # a mask / paired image whose size differs from the image's
UNSAFE_CLASS_NAME = "unsafe_class_name"  # a class name that is a path or markup (`../etc/passwd`, `<script>`)
OVERSIZED_FIELD = "oversized_field"  # a CSV row with a field over the csv module's 128 KiB limit
NOT_UTF8 = "not_utf8"  # a row (CSV line, JSONL line) holding bytes that are not UTF-8 (binary garbage)
EMPTY_FILE = "empty_file"  # an annotation file with nothing in it (0 bytes, or an XML without one <object>)
IGNORED = "ignored"  # an annotation its dataset marks to be ignored (SARDet-100K `ignore: 1`), as its loader does

CHANGE_CAPTION = "change_caption"  # the Dialogue task of a caption of a bi-temporal pair's change (LEVIR-CC)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")
LABEL_FILE_MAX_BYTES = 64 * MiB  # one image's labels (DOTA txt, VOC XML, a road GeoJSON or graph pickle): KBs to MBs
DATASET_FILE_MAX_BYTES = 1536 * MiB  # a COCO JSON, split list or caption table (GeoChat_Instruct.json: 263 MB)


class DatasetRootError(GeoPilotInputError):
    """The dataset root (or the one file a dataset consists of) is missing or unusable."""


def require_dir(root: Path | str, dataset: str, hint: str = "") -> Path:
    path = Path(root).expanduser()
    if not path.is_dir():
        raise DatasetRootError(f"{dataset}: dataset root {str(path)!r} is not a folder{f' ({hint})' if hint else ''}")
    return path.resolve()


def read_limited(path: Path, limit: int = LABEL_FILE_MAX_BYTES, what: str = "label file") -> bytes:
    """The bytes of a regular file of at most `limit` bytes, else a one-line GeoPilotInputError (a ValueError, so
    the readers count it as the malformed file it is)."""
    return read_bounded(path, limit, what)


def read_index_file(path: Path, dataset: str) -> str:
    """A split list / phrase list the whole dataset hangs on: its text, or DatasetRootError if unreadable."""
    try:
        return read_limited(path, DATASET_FILE_MAX_BYTES, f"{dataset} index file").decode("utf-8-sig")
    except (OSError, UnicodeDecodeError, GeoPilotInputError) as err:
        raise DatasetRootError(f"{dataset}: cannot read {path}: {first_line(err)[:300]}") from None


MAX_CLASS_NAME = 80  # characters; the longest real one (DIOR "Expressway-Service-area") has 23
_UNSAFE_NAME = re.compile(r"[<>/\\\x00-\x1f\x7f]|^\.")


def unsafe_name(raw: str) -> str | None:
    """Why a class name cannot go into a trace verbatim (a path, markup, control characters, absurd length), or None."""
    if len(raw) > MAX_CLASS_NAME:
        return f"{len(raw)} characters"
    found = _UNSAFE_NAME.search(raw)
    return f"contains {found.group(0)!r}" if found else None


def class_label(raw: str, dataset: str, report: ReadReport | None = None, where: str = "") -> str | None:
    """Source class name -> record label: the canonical class (`geopilot.vocabulary`, "storagetank" -> "storage
    tank"). A name in no vocabulary is kept verbatim (the generation report counts it), never dropped; a name that
    is a path or markup is counted (`unsafe_class_name`) and None is returned: its object is dropped."""
    name = raw.strip()
    reason = unsafe_name(name)
    if reason is None:
        return canonical_class(name, dataset)
    if report is not None:
        report.skip(UNSAFE_CLASS_NAME, f"{where}: class name {name[:40]!r} {reason}")
    return None


def parse_json(text: str) -> Any:
    """json.loads, with nesting too deep for the parser reported as the ValueError every other bad JSON is."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deep to parse") from None


def load_json(path: Path, dataset: str, what: str = "") -> Any:
    """A JSON file the whole source hangs on (annotation array, COCO file, split list): its value, or a one-line
    DatasetRootError (unreadable, not UTF-8, not JSON, nested 100k deep)."""
    try:
        return parse_json(read_limited(path, DATASET_FILE_MAX_BYTES, f"{dataset} annotation file").decode("utf-8-sig"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        reason = first_line(err)[:200]
        raise DatasetRootError(f"{dataset}: cannot read {what + ' ' if what else ''}{path}: {reason}") from None


def root_entries(root: Path | str, limit: int = 10) -> str:
    """The first entries under a root, one level into each folder: "train/ (images/, labelTxt-v1.0/), readme.txt"."""

    def listing(folder: Path, n: int) -> tuple[list[str], int]:
        try:
            children = sorted(folder.iterdir(), key=lambda p: (not p.is_dir(), p.name))
        except OSError:
            return [], 0
        return [c.name + ("/" if c.is_dir() else "") for c in children[:n]], max(0, len(children) - n)

    root = Path(root)
    if not root.is_dir():
        return "(not a folder)" if root.exists() else "(does not exist)"
    top, more = listing(root, limit)
    if not top:
        return "(empty)"
    parts = []
    for name in top:
        if name.endswith("/"):
            inner, inner_more = listing(root / name, 4)
            name += f" ({', '.join(inner)}{f', +{inner_more} more' if inner_more else ''})" if inner else " (empty)"
        parts.append(name)
    return ", ".join(parts) + (f", +{more} more" if more else "")


def image_size(path: Path) -> tuple[int, int] | None:
    """(width, height) from the file header (no decoding); None when neither PIL nor rasterio can read it."""
    try:
        return read_size(path, str(path))
    except Exception:  # noqa: BLE001 - PIL raises many types for odd TIFFs; fall back to GDAL
        pass
    try:
        import rasterio

        with rasterio.open(path) as dataset:
            return dataset.width, dataset.height
    except Exception:  # noqa: BLE001
        return None


def find_image(folder: Path, stem: str, suffixes: tuple[str, ...] = IMAGE_SUFFIXES) -> Path | None:
    for suffix in suffixes:
        for candidate in (folder / f"{stem}{suffix}", folder / f"{stem}{suffix.upper()}"):
            if candidate.is_file():
                return candidate
    return None


def image_index(images_dir: Path) -> dict[str, Path]:
    """Image stem -> path, over every file under `images/` at any depth (first in sorted order wins)."""
    index: dict[str, Path] = {}
    if images_dir.is_dir():
        for path in sorted(images_dir.rglob("*")):
            if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file():
                index.setdefault(path.stem, path)
    return index


def checked_image(path: Path | None, report: ReadReport, what: str) -> tuple[Path, int, int] | None:
    """The image's path and size, or None after counting why it cannot be used (`what` names the annotation)."""
    if path is None or not path.is_file():
        report.skip(MISSING_IMAGE, f"{what}: image {path if path else 'with that name'} not found")
        return None
    size = image_size(path)
    if size is None or size[0] <= 0 or size[1] <= 0:
        report.skip(UNREADABLE_IMAGE, f"{what}: cannot read the size of {path}")
        return None
    return path, size[0], size[1]


def read_xml(path: Path, report: ReadReport) -> ET.Element | None:
    """The parsed file (DTDs, entities and external references forbidden: defusedxml), or None after counting it as
    a malformed file."""
    try:
        return SafeET.fromstring(read_limited(path), forbid_dtd=True)
    except (ET.ParseError, DefusedXmlException, OSError, GeoPilotInputError) as err:
        report.skip(MALFORMED_FILE, f"{path}: {type(err).__name__}: {err}")
        return None


def xml_objects(
    xml_root: ET.Element, name_path: str, file_name: str, report: ReadReport
) -> Iterator[tuple[ET.Element, str, str]]:
    """(element, raw class name, where) per `<object>` of a VOC-style file; one without a class name is counted as a
    malformed line and passed over."""
    for index, obj in enumerate(xml_root.iter("object")):
        where = f"{file_name} object {index}"
        raw = (obj.findtext(name_path) or "").strip()
        if raw:
            yield obj, raw, where
        else:
            report.skip(MALFORMED_LINE, f"{where}: no <{name_path}>")


def polygon_area(points: list[tuple[float, float]]) -> float:
    return 0.5 * abs(
        sum(x1 * y2 - x2 * y1 for (x1, y1), (x2, y2) in zip(points, points[1:] + points[:1], strict=False))
    )


def _clip01(value: float) -> float:
    return min(1.0, max(0.0, value))


def polygon_object(
    points_px: list[tuple[float, float]],
    width: int,
    height: int,
    label: str,
    *,
    difficult: bool = False,
    object_id: str | None = None,
    mask: dict | None = None,
) -> ObjectAnnotation | str:
    """A polygon in pixels -> ObjectAnnotation (normalised, clipped to the image), or the skip cause."""
    if len(points_px) >= 2 and points_px[0] == points_px[-1]:
        points_px = points_px[:-1]  # closed ring: the last point repeats the first
    if len(points_px) < 3 or not all(math.isfinite(v) for point in points_px for v in point):
        return BAD_POLYGON
    if polygon_area(points_px) <= 0.0:
        return BAD_POLYGON
    polygon = tuple((_clip01(x / width), _clip01(y / height)) for x, y in points_px)
    xs, ys = [x for x, _ in polygon], [y for _, y in polygon]
    box = (min(xs), min(ys), max(xs), max(ys))
    if not (box[0] < box[2] and box[1] < box[3]):
        return BAD_GEOMETRY  # entirely outside the image
    return ObjectAnnotation(label, box, polygon, mask, difficult, object_id)


def box_object(
    x1: float,
    y1: float,
    x2: float,
    y2: float,
    width: int,
    height: int,
    label: str,
    *,
    difficult: bool = False,
    object_id: str | None = None,
    polygon_px: list[tuple[float, float]] | None = None,
    mask: dict | None = None,
) -> ObjectAnnotation | str:
    """An axis-aligned pixel box (x1, y1, x2, y2) -> ObjectAnnotation, or the skip cause."""
    values = (x1, y1, x2, y2)
    if not all(math.isfinite(v) for v in values) or x2 <= x1 or y2 <= y1:
        return BAD_GEOMETRY
    box = (_clip01(x1 / width), _clip01(y1 / height), _clip01(x2 / width), _clip01(y2 / height))
    if not (box[0] < box[2] and box[1] < box[3]):
        return BAD_GEOMETRY
    polygon = None
    if polygon_px is not None:
        if len(polygon_px) >= 2 and polygon_px[0] == polygon_px[-1]:
            polygon_px = polygon_px[:-1]
        if len(polygon_px) >= 3 and polygon_area(polygon_px) > 0:
            polygon = tuple((_clip01(x / width), _clip01(y / height)) for x, y in polygon_px)
    return ObjectAnnotation(label, box, polygon, mask, difficult, object_id)


def add_object(record: AnnotationRecord, made: ObjectAnnotation | str, report: ReadReport, what: str) -> None:
    """Append a made object, or count its skip cause."""
    if isinstance(made, str):
        report.skip(made, what)
    else:
        record.objects.append(made)


def add_polygon(
    record: AnnotationRecord,
    raw_class: str,
    dataset: str,
    points_px: list[tuple[float, float]],
    report: ReadReport,
    where: str,
    difficult: bool = False,
) -> None:
    """A polygon in pixels under a source class name -> one more object of `record`, or the skip counted (a class
    name that cannot be used, a degenerate polygon)."""
    label = class_label(raw_class, dataset, report, where)
    if label is not None:
        made = polygon_object(points_px, record.width, record.height, label, difficult=difficult)
        add_object(record, made, report, where)


def mask_to_rle(mask: np.ndarray) -> dict:
    """Boolean (H, W) mask -> COCO RLE with `counts` as str (pycocotools encodes Fortran-ordered uint8)."""
    from pycocotools import mask as mask_utils

    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": [int(rle["size"][0]), int(rle["size"][1])], "counts": rle["counts"].decode("ascii")}


def finish(records: list[AnnotationRecord], report: ReadReport) -> ReadResult:
    report.records = len(records)
    return records, report


def checked_pair(before: Path, after: Path, report: ReadReport, what: str) -> tuple[Path, int, int] | None:
    """A bi-temporal pair (LEVIR-CD / LEVIR-CC `A/` + `B/`): the earlier image's path and size when both images are
    readable and of one size, else None after counting why (a missing later image is `missing_image`)."""
    first = checked_image(before, report, f"{what} A")
    if first is None:
        return None
    second = checked_image(after, report, f"{what} B")
    if second is None:
        return None
    if second[1:] != first[1:]:
        report.skip(SIZE_MISMATCH, f"{what}: B is {second[1]}x{second[2]}, A {first[1]}x{first[2]}")
        return None
    return first
