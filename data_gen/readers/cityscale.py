"""CityScale ("20cities") reader: `region_<i>_sat.png` + `region_<i>_gt_graph.p` (or `_refine_gt_graph.p`).

The graph pickle is a Python-2 adjacency dict `{(row, col): [(row2, col2), ...]}`: x = col, y = row. It is read
with a restricted unpickler (builtin containers and numbers only). Split by region index i (SAM-Road):
train `i % 10 < 8`, val `i % 20 == 18`, test `i % 10 == 9 or i % 20 == 8`.
Run: `read_cityscale(Path("cityscale"), split="test")`.
"""

from __future__ import annotations

import re
from pathlib import Path

from geopilot.data_gen.readers.common import (
    MALFORMED_FILE,
    MISSING_LABEL,
    UNSAFE_PICKLE,
    DatasetRootError,
    ReadResult,
    checked_image,
    finish,
    require_dir,
)
from geopilot.data_gen.readers.graphs import adjacency_graph
from geopilot.data_gen.readers.safe_pickle import UnsafePickleError, safe_load
from geopilot.data_gen.records import AnnotationRecord, ReadReport

SPLITS = {
    "train": lambda i: i % 10 < 8,
    "val": lambda i: i % 20 == 18,
    "test": lambda i: i % 10 == 9 or i % 20 == 8,
}
GRAPH_KINDS = ("gt_graph", "refine_gt_graph")
_SAT = re.compile(r"region_(\d+)_sat\.png$")


def read_graph_pickle(path: Path, to_xy, width: int, height: int, report: ReadReport, where: str):
    """A graph pickle -> RoadGraphAnnotation, or None after counting why not."""
    try:
        return adjacency_graph(safe_load(path), to_xy, width, height)
    except UnsafePickleError as err:
        report.skip(UNSAFE_PICKLE, f"{where}: {path.name}: {err}")
    except Exception as err:  # noqa: BLE001 - corrupt pickles raise almost any type (Unpickling, EOF, Key, Memory...)
        report.skip(MALFORMED_FILE, f"{where}: {path.name}: {type(err).__name__}: {err}")
    return None


def read_cityscale(root: Path, split: str = "train", graph: str = "gt_graph") -> ReadResult:
    if split not in SPLITS or graph not in GRAPH_KINDS:
        raise DatasetRootError(f"CityScale: split must be one of {list(SPLITS)}, graph one of {list(GRAPH_KINDS)}")
    root = require_dir(root, "CityScale", "expected region_<i>_sat.png files, or a 20cities/ folder of them")
    folder = root / "20cities" if (root / "20cities").is_dir() else root
    regions = sorted((int(m.group(1)), p) for p in folder.glob("region_*_sat.png") if (m := _SAT.search(p.name)))
    if not regions:
        raise DatasetRootError(f"CityScale: no region_<i>_sat.png in {folder}")
    report = ReadReport()
    records: list[AnnotationRecord] = []
    for index, sat in regions:
        if not SPLITS[split](index):
            continue
        image = checked_image(sat, report, f"region {index}")
        if image is None:
            continue
        image_path, width, height = image
        graph_path = folder / f"region_{index}_{graph}.p"
        if not graph_path.is_file():
            report.skip(MISSING_LABEL, f"region {index}: {graph_path.name} not found")
            continue
        roads = read_graph_pickle(graph_path, lambda rc: (rc[1], rc[0]), width, height, report, f"region {index}")
        if roads is None:
            continue
        record = AnnotationRecord("CityScale", str(image_path), width, height, "optical", split, f"region_{index}")
        record.roads = roads
        records.append(record)
    return finish(records, report)
