"""CityScale ("20cities") reader: `region_<i>_sat.png` + a road-graph pickle of the same region.

Graph files (`graph=`): "refine_gt_graph" = `region_<i>_refine_gt_graph.p`, what SAM-Road trains on
(htcr/sam_road `dataset.py`, `cityscale/generate_labels.py`); "gt_graph" = `region_<i>_gt_graph.p`; "graph_gt" =
`region_<i>_graph_gt.pickle`, what SAM-Road scores its test regions against (`inferencer.py`, `apls.bash`). The
default "auto" reads the refined graph when the region has one, else `gt_graph.p`, else `graph_gt.pickle`.
A pickle is a Python-2 adjacency dict `{(row, col): [(row2, col2), ...]}`: x = col, y = row, read with a restricted
unpickler (builtin containers and numbers only). Split by region index i (SAM-Road):
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
from geopilot.records import AnnotationRecord, ReadReport

SPLITS = {
    "train": lambda i: i % 10 < 8,
    "val": lambda i: i % 20 == 18,
    "test": lambda i: i % 10 == 9 or i % 20 == 8,
}
GRAPH_FILES = {
    "refine_gt_graph": "region_{}_refine_gt_graph.p",
    "gt_graph": "region_{}_gt_graph.p",
    "graph_gt": "region_{}_graph_gt.pickle",
}
GRAPH_KINDS = ("auto", *GRAPH_FILES)  # "auto": the first of GRAPH_FILES the region has
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


def graph_file(folder: Path, index: int, graph: str) -> Path:
    """The region's graph pickle for `graph` ("auto": the refined graph when present, as SAM-Road trains on it)."""
    kinds = list(GRAPH_FILES) if graph == "auto" else [graph]
    paths = [folder / GRAPH_FILES[kind].format(index) for kind in kinds]
    return next((p for p in paths if p.is_file()), paths[0])


def read_cityscale(root: Path, split: str = "train", graph: str = "auto") -> ReadResult:
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
        graph_path = graph_file(folder, index, graph)
        if not graph_path.is_file():
            kinds = list(GRAPH_FILES) if graph == "auto" else [graph]
            names = " or ".join(GRAPH_FILES[kind].format(index) for kind in kinds)
            report.skip(MISSING_LABEL, f"region {index}: no {names}")
            continue
        roads = read_graph_pickle(graph_path, lambda rc: (rc[1], rc[0]), width, height, report, f"region {index}")
        if roads is None:
            continue
        record = AnnotationRecord("CityScale", str(image_path), width, height, "optical", split, f"region_{index}")
        record.roads = roads
        records.append(record)
    return finish(records, report)
