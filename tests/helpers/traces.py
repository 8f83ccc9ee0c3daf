"""Annotation records for the generator tests, written with real image (and mask) files, one per ability.

`fake_readers(tmp)` returns a READERS-style dict (`name -> read(root) -> (records, ReadReport)`) serving them,
so the generator can be tested without depending on any one dataset's on-disk format.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from geopilot.records import (
    AnnotationRecord,
    Dialogue,
    ObjectAnnotation,
    ReadReport,
    ReferringExpression,
    RoadGraphAnnotation,
    SemanticSegmentation,
)


def _image(path: Path, size: int = 64, mode: str = "RGB") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(path.name))
    shape = (size, size, 3) if mode == "RGB" else (size, size)
    Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8), mode).save(path)
    return path.name


def optical_records(root: Path, n: int = 3) -> list[AnnotationRecord]:
    records = []
    for i in range(n):
        name = _image(root / f"P{i:04d}.png")
        objects = [
            ObjectAnnotation(
                "plane", (0.1, 0.1, 0.2, 0.25), polygon=((0.1, 0.1), (0.2, 0.1), (0.2, 0.25), (0.1, 0.25))
            ),
            ObjectAnnotation("plane", (0.3, 0.3, 0.4, 0.45)),
            ObjectAnnotation("storage tank", (0.6, 0.6, 0.7, 0.7)),
            ObjectAnnotation("small vehicle", (0.75, 0.1, 0.8, 0.15)),
        ][: 2 + i]
        referring = [ReferringExpression("the storage tank in the lower right", (2,))] if i == 2 else []
        records.append(
            AnnotationRecord("DOTA", name, 64, 64, record_id=f"P{i:04d}", objects=objects, referring=referring)
        )
    return records


def semantic_record(root: Path) -> AnnotationRecord:
    name = _image(root / "aachen_1.png")
    mask = np.zeros((64, 64), dtype=np.uint8)
    mask[:32] = 2
    mask[32:, :16] = 5
    Image.fromarray(mask, "L").save(root / "aachen_1_label.png")
    semantic = SemanticSegmentation(
        "aachen_1_label.png", {1: "bareland", 2: "rangeland", 5: "water", 6: "building"}, (0,)
    )
    return AnnotationRecord("OpenEarthMap", name, 64, 64, record_id="aachen_1", semantic=semantic)


def road_record(root: Path) -> AnnotationRecord:
    name = _image(root / "region_0_sat.png")
    roads = RoadGraphAnnotation(
        ((0.1, 0.5), (0.5, 0.5), (0.9, 0.5), (0.5, 0.1), (0.5, 0.9)), ((0, 1), (1, 2), (1, 3), (1, 4))
    )
    return AnnotationRecord("CityScale", name, 64, 64, record_id="region_0", roads=roads)


def cloud_record(root: Path) -> AnnotationRecord:
    name = _image(root / "cloud" / "1.png")
    _image(root / "label" / "1.png")
    return AnnotationRecord("RICE", f"cloud/{name}", 64, 64, record_id="RICE1_1", cloud_free_image="label/1.png")


def geochat_records(root: Path) -> list[AnnotationRecord]:
    name = _image(root / "P0003_0004.png")
    kept = Dialogue(
        (
            ("user", "<image>\nIs it a rural or an urban area? Answer in one word or a short phrase."),
            ("assistant", "Urban"),
            ("user", "How many tennis courts are there?"),
            ("assistant", "There are two tennis courts."),
        ),
        task="vqa",
    )
    grounding = Dialogue(
        (
            ("user", "<image>\n[refer] give me the location of <p>the small vehicle on the left</p>"),
            ("assistant", "{<12><40><15><44>|<35>}"),
        ),
        task="refer",
    )
    return [AnnotationRecord("GeoChat-Instruct", name, 64, 64, record_id="P0003_0004", dialogues=[kept, grounding])]


def _sar_record(root: Path, source: str, record_id: str, **annotations) -> AnnotationRecord:
    """A 64 x 64 single-band record whose image is `<record_id>.png`."""
    name = _image(root / f"{record_id}.png", mode="L")
    return AnnotationRecord(source, name, 64, 64, modality="sar", record_id=record_id, **annotations)


def sar_records(root: Path) -> list[AnnotationRecord]:
    ships = [
        ObjectAnnotation("ship", (0.1, 0.1, 0.3, 0.2)),
        ObjectAnnotation("ship", (0.5, 0.5, 0.6, 0.6)),
        ObjectAnnotation("harbor", (0.0, 0.7, 0.4, 1.0)),
    ]
    caption = Dialogue(
        (("assistant", "A coastal city with dense buildings and a harbour with several moored ships."),), task="caption"
    )
    return [
        _sar_record(root, "SARDet-100K", "0000001", objects=ships),
        _sar_record(root, "SARLANG-1M", "Nice_3", dialogues=[caption]),
    ]


def all_records(root: Path) -> list[AnnotationRecord]:
    return (
        optical_records(root)
        + [semantic_record(root), road_record(root), cloud_record(root)]
        + geochat_records(root)
        + sar_records(root)
    )


def fake_readers(records: list[AnnotationRecord]) -> dict:
    def read(root):
        report = ReadReport(records=len(records))
        report.skip("missing_image", "P9999.png is not on disk")
        return list(records), report

    return {"fake": read}
