"""SARDet-100K reader: `<root>/Annotations/<split>.json` (COCO, bbox [x, y, w, h] px) + `<root>/JPEGImages/...`.

The official config's image prefix is `JPEGImages/`, third-party configs use `JPEGImages/<split>/`: both are tried.
Width and height come from the JSON (several sources were cropped to 512x512). Single-channel SAR, mixed JPG/PNG.
The six classes become canonical (`geopilot.vocabulary`): aircraft -> airplane, tank -> storage tank.
Run: `read_sardet(Path("SARDet_100K"), split="train")`.
"""

from __future__ import annotations

from pathlib import Path

from geopilot.data_gen.readers.coco import coco_records
from geopilot.data_gen.readers.common import DatasetRootError, ReadResult, require_dir


def read_sardet(root: Path, split: str = "train") -> ReadResult:
    root = require_dir(root, "SARDet-100K", "expected <root>/Annotations/<split>.json and <root>/JPEGImages/")
    annotation_file = root / "Annotations" / f"{split}.json"
    if not annotation_file.is_file():
        raise DatasetRootError(f"SARDet-100K: annotation file {annotation_file} not found")
    image_dirs = [root / "JPEGImages" / split, root / "JPEGImages"]
    return coco_records(
        annotation_file,
        image_dirs,
        source="SARDet-100K",
        modality="sar",
        dataset="SARDet-100K",
        split=split,
        with_masks=False,
    )
