"""iSAID reader: COCO JSON with pixel polygons over the DOTA images (or the devkit's 800x800 patches).

Layout: `<root>/<split>/Annotations/iSAID_<split>.json` (or the devkit's `instancesonly_filtered_<split>.json`)
with images in `<root>/<split>/images/`. Class names are mixed case in the file ("Small_Vehicle"); they are
named through `categories` and become canonical ("small vehicle", `geopilot.vocabulary` dataset "iSAID"). Run: `read_isaid(Path("iSAID"), split="val")`.
"""

from __future__ import annotations

from pathlib import Path

from geopilot.data_gen.readers.coco import coco_records
from geopilot.data_gen.readers.common import DatasetRootError, ReadResult, require_dir


def read_isaid(root: Path, split: str = "train", with_masks: bool = True) -> ReadResult:
    split_dir = require_dir(Path(root) / split, "iSAID", "expected <root>/<split>/Annotations/iSAID_<split>.json")
    candidates = [
        split_dir / "Annotations" / f"iSAID_{split}.json",
        split_dir / f"instancesonly_filtered_{split}.json",
        split_dir / "Annotations" / f"instancesonly_filtered_{split}.json",
    ]
    annotation_file = next((p for p in candidates if p.is_file()), None)
    if annotation_file is None:
        raise DatasetRootError(f"iSAID: none of {', '.join(str(p) for p in candidates)} exists")
    image_dirs = [split_dir / "images", split_dir]
    return coco_records(
        annotation_file,
        image_dirs,
        source="iSAID",
        modality="optical",
        dataset="iSAID",
        split=split,
        with_masks=with_masks,
    )
