"""COCO-JSON annotations (iSAID, SARDet-100K) -> records, through pycocotools' index and mask utilities.

Classes are named through `categories` (never by hard-coded id) and become canonical (`geopilot.vocabulary`); a
category name in no vocabulary is kept verbatim. Annotations whose image is unknown, whose category id is not in
`categories`, or whose polygons have fewer than 3 points are skipped and counted.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from geopilot.data_gen.readers.common import (
    BAD_POLYGON,
    IGNORED,
    MALFORMED_FILE,
    MALFORMED_LINE,
    UNKNOWN_CLASS,
    UNSAFE_CLASS_NAME,
    DatasetRootError,
    ReadResult,
    box_object,
    checked_image,
    class_label,
    finish,
    load_json,
)
from geopilot.records import AnnotationRecord, ReadReport
from geopilot.sample import Modality

REQUIRED_KEYS = {"images": ("id",), "annotations": ("id", "image_id"), "categories": ("id",)}  # createIndex needs


def load_coco(annotation_file: Path, dataset: str, report: ReadReport):
    """pycocotools.COCO over a JSON file that must have images/annotations/categories; DatasetRootError if not.
    Entries pycocotools' index cannot take (not an object, no id) are dropped and counted."""
    from pycocotools.coco import COCO

    data = load_json(annotation_file, dataset, "annotation file")
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("images", "categories")):
        raise DatasetRootError(f"{dataset}: {annotation_file} is not COCO JSON (needs 'images' and 'categories' lists)")
    data.setdefault("annotations", [])
    for section, keys in REQUIRED_KEYS.items():
        entries = data[section] if isinstance(data[section], list) else []
        kept = [e for e in entries if isinstance(e, dict) and all(e.get(k) is not None for k in keys)]
        for _ in range(len(entries) - len(kept)):
            report.skip(MALFORMED_LINE, f"{annotation_file.name}: an entry of {section!r} lacks {', '.join(keys)}")
        data[section] = kept
    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):  # createIndex prints progress lines
        coco.createIndex()
    return coco


def _valid_polygons(segmentation, report: ReadReport, where: str) -> list[list[float]] | None:
    """Polygon parts with >= 3 points (others counted), or None when the segmentation is RLE / absent."""
    if not isinstance(segmentation, list) or not segmentation:
        return None  # RLE, or no segmentation at all (detection-only sets): fall back to the bbox
    parts = [p for p in segmentation if isinstance(p, list) and len(p) >= 6 and len(p) % 2 == 0]
    if len(parts) < len(segmentation):
        report.skip(BAD_POLYGON, f"{where}: {len(segmentation) - len(parts)} polygon part(s) with < 3 points")
    return parts


def coco_records(
    annotation_file: Path,
    image_dirs: list[Path],
    *,
    source: str,
    modality: Modality,
    dataset: str,
    split: str,
    with_masks: bool,
) -> ReadResult:
    from pycocotools import mask as mask_utils

    report = ReadReport()
    coco = load_coco(annotation_file, source, report)
    category_names = {
        c.get("id"): class_label(str(c["name"]), dataset)
        for c in coco.dataset["categories"]
        if isinstance(c.get("name"), str) and c["name"].strip()
    }
    unsafe = {i for i, name in category_names.items() if name is None}  # a path or markup: its objects are dropped
    orphans = [a for a in coco.dataset["annotations"] if a.get("image_id") not in coco.imgs]
    for ann in orphans:
        report.skip(MALFORMED_LINE, f"{annotation_file.name}: annotation {ann.get('id')} names unknown image")
    records: list[AnnotationRecord] = []
    for image_id in sorted(coco.imgs, key=str):
        info = coco.imgs[image_id]
        file_name = str(info.get("file_name", ""))
        if not file_name:
            report.skip(MALFORMED_FILE, f"{annotation_file.name}: image {image_id} has no file_name")
            continue
        image_path = next((d / file_name for d in image_dirs if (d / file_name).is_file()), image_dirs[0] / file_name)
        image = checked_image(image_path, report, f"{annotation_file.name} image {image_id}")
        if image is None:
            continue
        image_path, file_width, file_height = image
        # Cropped sources: the JSON's size is authoritative for the annotation frame; the header is the fallback.
        try:
            width, height = int(info.get("width") or file_width), int(info.get("height") or file_height)
        except (TypeError, ValueError):
            report.skip(MALFORMED_FILE, f"{annotation_file.name}: image {image_id} has a non-numeric size")
            continue
        record = AnnotationRecord(source, str(image_path), width, height, modality, split, Path(file_name).stem)
        for ann in coco.imgToAnns.get(image_id, []):
            where = f"{annotation_file.name} annotation {ann.get('id')}"
            if ann.get("category_id") in unsafe:
                report.skip(
                    UNSAFE_CLASS_NAME, f"{where}: category {ann.get('category_id')} is named by a path or markup"
                )
                continue
            if ann.get("ignore"):  # SARDet-100K: mmdet's CocoDataset.parse_data_info skips these
                report.skip(IGNORED, f"{where}: marked ignore: 1")
                continue
            label = category_names.get(ann.get("category_id"))
            if label is None:
                report.skip(UNKNOWN_CLASS, f"{where}: category id {ann.get('category_id')} has no named category")
                continue
            record.objects.extend(_object(ann, label, width, height, mask_utils, with_masks, report, where))
        records.append(record)
    return finish(records, report)


def _rle(segmentation, polygons: list | None, height: int, width: int, mask_utils) -> dict | None:
    """Polygons or an RLE (compressed, or uncompressed with list counts) -> compressed RLE with str counts."""
    if polygons:
        rle = mask_utils.merge(mask_utils.frPyObjects(polygons, height, width))
    elif isinstance(segmentation, dict) and "counts" in segmentation:
        compressed = isinstance(segmentation["counts"], (str, bytes))
        rle = segmentation if compressed else mask_utils.frPyObjects(segmentation, height, width)
    else:
        return None
    counts = rle["counts"]
    return {"size": [height, width], "counts": counts.decode("ascii") if isinstance(counts, bytes) else counts}


def _object(ann: dict, label: str, width: int, height: int, mask_utils, with_masks: bool, report, where: str):
    segmentation = ann.get("segmentation")
    polygons = _valid_polygons(segmentation, report, where)
    if polygons == []:
        return []  # every polygon part had < 3 points (already counted): no usable instance
    try:
        if polygons:
            xs = [v for p in polygons for v in p[0::2]]
            ys = [v for p in polygons for v in p[1::2]]
            x1, y1, x2, y2 = min(xs), min(ys), max(xs), max(ys)
        else:
            x, y, w, h = (float(v) for v in ann["bbox"])
            x1, y1, x2, y2 = x, y, x + w, y + h
        mask = _rle(segmentation, polygons, height, width, mask_utils) if with_masks else None
        outline = (
            [(float(x), float(y)) for x, y in zip(polygons[0][0::2], polygons[0][1::2], strict=True)]
            if polygons
            else None
        )
    except (KeyError, TypeError, ValueError, IndexError):
        report.skip(MALFORMED_LINE, f"{where}: no usable bbox or segmentation")
        return []
    made = box_object(x1, y1, x2, y2, width, height, label, object_id=str(ann.get("id")), polygon_px=outline, mask=mask)
    if isinstance(made, str):
        report.skip(made, where)
        return []
    return [made]
