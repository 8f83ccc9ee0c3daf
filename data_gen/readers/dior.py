"""DIOR (VOC horizontal boxes) and DIOR-R (oriented `robndbox`) reader.

Layout: `<root>/JPEGImages-{trainval,test}/00001.jpg`, `<root>/Annotations/Horizontal Bounding Boxes/00001.xml`
(older copies: `<root>/Annotations/00001.xml`), `<root>/Annotations/Oriented Bounding Boxes/00001.xml`,
`<root>/ImageSets/Main/{train,val,test}.txt` (5-digit ids, kept as strings). Class names become canonical
(`geopilot.vocabulary`, case-insensitive because raw files say `Expressway-Service-area`: `storagetank` ->
`storage tank`); a name in no vocabulary is kept verbatim. Run: `read_dior(Path("DIOR"), split="train", variant="obb")`.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from geopilot.data_gen.readers.common import (
    MALFORMED_LINE,
    MISSING_LABEL,
    DatasetRootError,
    ReadResult,
    add_object,
    box_object,
    checked_image,
    class_label,
    find_image,
    finish,
    polygon_object,
    read_index_file,
    read_xml,
    require_dir,
    xml_objects,
)
from geopilot.records import AnnotationRecord, ReadReport

ANNOTATION_FOLDERS = {
    "hbb": ("Annotations/Horizontal Bounding Boxes", "Annotations"),
    "obb": ("Annotations/Oriented Bounding Boxes",),
}
IMAGE_FOLDERS = ("JPEGImages-trainval", "JPEGImages-test", "JPEGImages")
OBB_CORNERS = ("left_top", "right_top", "right_bottom", "left_bottom")


def _number(element: ET.Element, tag: str) -> float:
    found = element.find(tag)
    if found is None or found.text is None:
        raise ValueError(f"missing <{tag}>")
    return float(found.text)


def _parse_objects(root: ET.Element, variant: str, width: int, height: int, record, report, name: str) -> None:
    for obj, raw, where in xml_objects(root, "name", name, report):
        label = class_label(raw, "DIOR", report, where)
        if label is None:
            continue
        difficult = (obj.findtext("difficult") or "0").strip() not in ("0", "")
        try:
            rbox = obj.find("robndbox")
            if variant == "obb" and rbox is not None:
                points = [(_number(rbox, f"x_{c}"), _number(rbox, f"y_{c}")) for c in OBB_CORNERS]
                made = polygon_object(points, width, height, label, difficult=difficult)
            else:  # hbb, or a DIOR-R object that has only the axis-aligned <bndbox>: its box is its outline
                bbox = obj.find("bndbox")
                if bbox is None:
                    raise ValueError("missing <robndbox>" if variant == "obb" else "missing <bndbox>")
                x1, y1, x2, y2 = (_number(bbox, tag) for tag in ("xmin", "ymin", "xmax", "ymax"))
                made = box_object(x1, y1, x2, y2, width, height, label, difficult=difficult)
        except ValueError as err:
            report.skip(MALFORMED_LINE, f"{where}: {err}")
            continue
        add_object(record, made, report, where)


def read_dior(root: Path, split: str = "train", variant: str = "hbb") -> ReadResult:
    if variant not in ANNOTATION_FOLDERS:
        raise DatasetRootError(f"DIOR: unknown variant {variant!r} (choose hbb or obb)")
    root = require_dir(root, "DIOR")
    split_file = root / "ImageSets" / "Main" / f"{split}.txt"
    if not split_file.is_file():
        raise DatasetRootError(f"DIOR: split list {split_file} not found")
    annotation_dir = next((root / f for f in ANNOTATION_FOLDERS[variant] if (root / f).is_dir()), None)
    if annotation_dir is None:
        raise DatasetRootError(f"DIOR: no {' or '.join(ANNOTATION_FOLDERS[variant])} folder in {root}")
    records: list[AnnotationRecord] = []
    report = ReadReport()
    for image_id in read_index_file(split_file, "DIOR").split():
        xml_path = annotation_dir / f"{image_id}.xml"
        if not xml_path.is_file():
            report.skip(MISSING_LABEL, f"{split_file.name}: no annotation {xml_path.name}")
            continue
        xml_root = read_xml(xml_path, report)
        if xml_root is None:
            continue
        folders = [root / f for f in IMAGE_FOLDERS]
        image_path = next(
            (p for f in folders if (p := find_image(f, image_id)) is not None), folders[0] / f"{image_id}.jpg"
        )
        image = checked_image(image_path, report, xml_path.name)
        if image is None:
            continue
        image_path, width, height = image
        record = AnnotationRecord("DIOR", str(image_path), width, height, "optical", split, image_id)
        _parse_objects(xml_root, variant, width, height, record, report, xml_path.name)
        records.append(record)
    return finish(records, report)
