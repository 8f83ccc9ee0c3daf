"""FAIR1M 1.0 / 2.0 reader: `<root>/<split>/[partN/]{images,labelXml}/<n>.{tif,xml}`; `labelXmls/` (as some archives
are named) is read alike, and the images of a labelXml folder are looked for in every `images*` folder beside it at
any depth (FAIR1M 1.0's train/part2 comes as `images-1/` and `images-2/`). The validation split is `validation/`.

Each `<object>`: `possibleresult/name` (37 fine classes) and `points/point` as "x,y" pixel strings (a space after
the comma or none) forming a closed ring: 4 corners, the 5th repeating the first. What is read and what is not:
- corners listed out of ring order (a "Z" 0,1,3,2 order draws a bow tie whose shoelace area is zero or halved)
  are put back in ring order around their centre and kept, counted as repaired (`reordered_corners`);
- an object whose points all coincide or lie on one line has no extent: skipped as `bad_polygon`, its points in
  the example; one wholly outside the image: `bad_geometry`; parts outside are clipped to the image;
- an object without a class name, with a point that is not "x,y", or with a `<coordinate>` other than pixel:
  `malformed_line`; a file that is not XML: `malformed_file`;
- an empty file (0 bytes, or no `<object>` at all): `empty_file`, skipped and counted (there is nothing to read).
Class names become canonical (`geopilot.vocabulary`, case- and separator-insensitive: `Small Car` -> `car`,
`Boeing737` -> `boeing 737`); a name in no vocabulary is kept verbatim.
Run: `read_fair1m(Path("FAIR1M"), split="train")`.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path

from geopilot.data_gen.readers.common import (
    EMPTY_FILE,
    MALFORMED_LINE,
    DatasetRootError,
    ReadResult,
    add_polygon,
    checked_image,
    finish,
    image_index,
    polygon_area,
    read_xml,
    require_dir,
    xml_objects,
)
from geopilot.records import AnnotationRecord, ReadReport

LABEL_FOLDERS = ("labelXml", "labelXmls")
REORDERED = "reordered_corners"


def _point(text: str | None) -> tuple[float, float]:
    parts = (text or "").replace(",", " ").split()
    if len(parts) != 2:
        raise ValueError(f"point {text!r} is not 'x,y'")
    return float(parts[0]), float(parts[1])


def ring_order(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Four corners in ring order (by angle around their centre): a bow tie becomes the quadrilateral it spans."""
    cx, cy = sum(x for x, _ in points) / len(points), sum(y for _, y in points) / len(points)
    return sorted(points, key=lambda p: math.atan2(p[1] - cy, p[0] - cx))


def corners(points: list[tuple[float, float]], report: ReadReport, where: str) -> list[tuple[float, float]]:
    """The object's corners, put in ring order (and the repair counted) when they are listed out of it."""
    if len(points) >= 2 and points[0] == points[-1]:
        points = points[:-1]
    if len(points) != 4:
        return points
    ordered = ring_order(points)
    if polygon_area(ordered) > polygon_area(points) * (1 + 1e-9):
        report.repair(REORDERED, f"{where}: corners {_listing(points)} read in ring order")
        return ordered
    return points


def _listing(points: list[tuple[float, float]]) -> str:
    return " ".join(f"({x:g},{y:g})" for x, y in points)


def _parse_objects(xml_root: ET.Element, record, report, name: str) -> None:
    for obj, raw, where in xml_objects(xml_root, "possibleresult/name", name, report):
        coordinate = (obj.findtext("coordinate") or "pixel").strip().lower()
        try:
            if coordinate != "pixel":
                raise ValueError(f"coordinate type {coordinate!r}, only 'pixel' is supported")
            points = [_point(p.text) for p in obj.iterfind("points/point")]
        except ValueError as err:
            report.skip(MALFORMED_LINE, f"{where}: {err}")
            continue
        ring = corners(points, report, where)
        add_polygon(record, raw, "FAIR1M", ring, report, f"{where} ({raw}; points {_listing(points)})")


def _label_dirs(split_dir: Path) -> list[Path]:
    return sorted(p for folder in LABEL_FOLDERS for p in split_dir.glob(f"**/{folder}") if p.is_dir())


def read_fair1m(root: Path, split: str = "train") -> ReadResult:
    split_dir = require_dir(Path(root) / split, "FAIR1M", "expected <root>/<split>/[partN/]labelXml")
    label_dirs = _label_dirs(split_dir)
    if not label_dirs:
        raise DatasetRootError(f"FAIR1M: no labelXml folder under {split_dir} (the test split has no public labels)")
    records: list[AnnotationRecord] = []
    report = ReadReport()
    for label_dir in label_dirs:
        images = {}
        for folder in sorted(label_dir.parent.glob("images*")):
            images = image_index(folder) | images  # the first folder in name order wins a shared stem
        for xml_path in sorted(label_dir.glob("*.xml")):
            if xml_path.stat().st_size == 0:
                report.skip(EMPTY_FILE, f"{xml_path.name}: 0 bytes")
                continue
            xml_root = read_xml(xml_path, report)
            if xml_root is None:
                continue
            if xml_root.find(".//object") is None:
                report.skip(EMPTY_FILE, f"{xml_path.name}: no <object>")
                continue
            found = images.get(xml_path.stem, label_dir.parent / "images" / f"{xml_path.stem}.tif")
            image = checked_image(found, report, xml_path.name)
            if image is None:
                continue
            image_path, width, height = image
            part = label_dir.parent.relative_to(split_dir).as_posix()
            record_id = xml_path.stem if part == "." else f"{part}/{xml_path.stem}"
            record = AnnotationRecord("FAIR1M", str(image_path), width, height, "optical", split, record_id)
            _parse_objects(xml_root, record, report, xml_path.name)
            records.append(record)
    return finish(records, report)
