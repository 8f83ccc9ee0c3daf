"""FAIR1M 1.0 / 2.0 reader: `<root>/<split>/[partN/]{images,labelXml}/<n>.{tif,xml}`.

Each object: `possibleresult/name` (37 fine classes) and `points/point` as "x, y" pixel strings forming a closed
ring (5 points, the last repeats the first). Class names become canonical (`geopilot.vocabulary`, case- and
separator-insensitive: `Small Car` -> `car`, `Boeing737` -> `boeing 737`); a name in no vocabulary is kept verbatim.
Run: `read_fair1m(Path("FAIR1M"), split="train")`.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from geopilot.data_gen.readers.common import (
    MALFORMED_LINE,
    DatasetRootError,
    ReadResult,
    add_polygon,
    checked_image,
    find_image,
    finish,
    read_xml,
    require_dir,
    xml_objects,
)
from geopilot.records import AnnotationRecord, ReadReport


def _point(text: str | None) -> tuple[float, float]:
    parts = (text or "").replace(",", " ").split()
    if len(parts) != 2:
        raise ValueError(f"point {text!r} is not 'x, y'")
    return float(parts[0]), float(parts[1])


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
        add_polygon(record, raw, "FAIR1M", points, report, where)


def read_fair1m(root: Path, split: str = "train") -> ReadResult:
    split_dir = require_dir(Path(root) / split, "FAIR1M", "expected <root>/<split>/[partN/]labelXml")
    label_dirs = sorted(p for p in split_dir.glob("**/labelXml") if p.is_dir())
    if not label_dirs:
        raise DatasetRootError(f"FAIR1M: no labelXml folder under {split_dir} (the test split has no public labels)")
    records: list[AnnotationRecord] = []
    report = ReadReport()
    for label_dir in label_dirs:
        for xml_path in sorted(label_dir.glob("*.xml")):
            xml_root = read_xml(xml_path, report)
            if xml_root is None:
                continue
            images = label_dir.parent / "images"
            found = find_image(images, xml_path.stem) or images / f"{xml_path.stem}.tif"
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
