"""OpenEarthMap reader: `<root>/<region>/{images,labels}/<region>_<n>.tif` + `<root>/{train,val,test}.txt`.

The split lists hold bare file names (`aachen_1.tif`); files are found through an index of every
`*/images/<name>`, so region names with underscores need no parsing. Labels are single-band uint8 codes
0..8 (0 = unknown, ignored); code k names the k-th class of the vocabulary's "OpenEarthMap" entry, as canonical
names (`oem_classes()`: 1 bare land, 2 rangeland, ..., 7 agricultural land, 8 building). Test labels are
withheld, so test entries count as missing labels.
Run: `read_openearthmap(Path("OpenEarthMap"), split="train")`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from geopilot.data_gen.readers.common import (
    MALFORMED_FILE,
    MISSING_LABEL,
    SIZE_MISMATCH,
    UNKNOWN_CLASS,
    DatasetRootError,
    ReadResult,
    checked_image,
    finish,
    read_index_file,
    require_dir,
)
from geopilot.records import AnnotationRecord, ReadReport, SemanticSegmentation
from geopilot.vocabulary import dataset_classes

OEM_IGNORE = (0,)


def oem_classes() -> dict[int, str]:
    """Label code -> canonical class name (codes 1..8 in the vocabulary's OpenEarthMap class order)."""
    return dict(enumerate(dataset_classes("OpenEarthMap"), start=1))


def read_label(path: Path) -> np.ndarray:
    """Label raster -> (H, W) array; ValueError when it is not single-band."""
    import rasterio
    from rasterio.errors import NotGeoreferencedWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)  # plain TIFF labels are fine
        with rasterio.open(path) as dataset:
            if dataset.count != 1:
                raise ValueError(f"{path}: {dataset.count} bands, a label must have 1")
            return dataset.read(1)


def read_openearthmap(root: Path, split: str = "train", check_labels: bool = True) -> ReadResult:
    root = require_dir(root, "OpenEarthMap", "expected <region>/{images,labels}/ and <split>.txt")
    list_file = root / f"{split}.txt"
    if not list_file.is_file():
        raise DatasetRootError(f"OpenEarthMap: split list {list_file} not found")
    images = {p.name: p for p in root.glob("*/images/*") if p.is_file()}
    classes = oem_classes()
    allowed = set(classes) | set(OEM_IGNORE)
    report = ReadReport()
    records: list[AnnotationRecord] = []
    for name in read_index_file(list_file, "OpenEarthMap").split():
        image = checked_image(images.get(name), report, f"{list_file.name} {name}")
        if image is None:
            continue
        image_path, width, height = image
        label_path = image_path.parent.parent / "labels" / name
        if not label_path.is_file():
            report.skip(MISSING_LABEL, f"{name}: label {label_path} not found")
            continue
        if check_labels:
            try:
                label = read_label(label_path)
            except Exception as err:  # noqa: BLE001 - rasterio raises its own error types for corrupt files
                report.skip(MALFORMED_FILE, f"{name}: {err}")
                continue
            if label.shape != (height, width):
                report.skip(SIZE_MISMATCH, f"{name}: label {label.shape[1]}x{label.shape[0]} vs {width}x{height}")
                continue
            unknown = sorted(set(np.unique(label).tolist()) - allowed)
            if unknown:
                report.skip(UNKNOWN_CLASS, f"{name}: label codes {unknown[:5]} not in 0..8")
                continue
        semantic = SemanticSegmentation(str(label_path), dict(classes), OEM_IGNORE)
        record = AnnotationRecord("OpenEarthMap", str(image_path), width, height, "optical", split, Path(name).stem)
        record.semantic = semantic
        records.append(record)
    return finish(records, report)
