"""GeoChat-Bench referring / grounding test set (`referring.jsonl`) in its real format.

Lines: `{"question_id", "image_id", "question", "ground_truth", "type": "ref"|"grounding", "dataset", "obj_ids",
"size_group"}`. `ground_truth` is a list of 4-point polygons in PIXELS (each `[[x, y] x 4]` or 8 flat numbers; a
single polygon not wrapped in a list is accepted). Images are SAMRS patches whose size follows the name, not the
file: `P*` -> DOTA 1024 px, `train*` / `valid*` -> FAIR1M 600 px, anything else -> DIOR 800 px (`image_size`); predicted
`{<x1><y1><x2><y2>|θ}` boxes (0-100 grid) are decoded against that size by the ONE GeoChat decoder,
`geopilot.data_gen.readers.geochat.decode_box` (off-grid values kept, never clipped; `text_box_repairs` counts
them). Prompts are GeoChat's: `[refer] Give me the location of <p> {question} </p>` for `ref`, `[grounding]{question}`
otherwise.

Splits: size from `size_group`; single vs multiple from `len(obj_ids)` (falling back to `len(ground_truth)`).
Ground truth with no area is skipped and counted (`bad_polygon`); a self-intersecting (bow-tie) corner order is
kept and repaired to its convex hull by the metric, and counted in the load notes.
Root layout: `referring.jsonl` + `images/<image_id>[.png|.jpg|.tif]` (or the images beside the file).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from geopilot.data_gen.readers.common import BAD_POLYGON, IMAGE_SUFFIXES, MALFORMED_LINE, MISSING_IMAGE, parse_json
from geopilot.data_gen.readers.geochat import BOX, box_repairs, decode_box
from geopilot.eval.loaders.common import BenchmarkError, EvalItem, Loaded
from geopilot.polygons import DegeneratePolygonError, convex_polygon, is_simple
from geopilot.records import ReadReport

FILE = "referring.jsonl"


def image_size(image_id: str) -> int:
    """SAMRS patch size by source: DOTA `P*` 1024, FAIR1M `train*` / `valid*` 600, DIOR otherwise 800 (square)."""
    name = Path(image_id).name
    if name.startswith("P"):
        return 1024
    if name.startswith(("train", "valid")):
        return 600
    return 800


def decode_boxes(text: str, width: int, height: int) -> list[list[tuple[float, float]]]:
    """Every `{<x1><y1><x2><y2>|<θ>}` box in `text` as 4 pixel corners, decoded as GeoChat does (`decode_box`: values
    as written, rotated about the unclipped centre, never clipped: IoU needs the whole box); empty boxes dropped."""
    polygons = []
    for match in BOX.finditer(text):
        corners = decode_box(match, width, height)
        if corners is not None:
            polygons.append(corners)
    return polygons


def text_box_repairs(text: str) -> Counter:
    """How many boxes in `text` were kept off the grid or with swapped corners, and how many were empty (dropped)."""
    counts: Counter = Counter()
    for match in BOX.finditer(text):
        counts.update(box_repairs(match))
        if decode_box(match, 100, 100) is None:
            counts["box_empty"] += 1
    return counts


def _polygons(value) -> list[list[tuple[float, float]]]:
    if not isinstance(value, list) or not value:
        raise ValueError("ground_truth is not a non-empty list")
    if all(isinstance(v, (int, float)) for v in value) or (
        all(isinstance(v, list) and len(v) == 2 and all(isinstance(c, (int, float)) for c in v) for v in value)
    ):
        value = [value]  # one polygon, not wrapped
    polygons = []
    for polygon in value:
        if not isinstance(polygon, list):
            raise ValueError(f"polygon {polygon!r:.60} is not a list")
        flat = [c for point in polygon for c in (point if isinstance(point, list) else [point])]
        if len(flat) < 6 or len(flat) % 2 or not all(isinstance(c, (int, float)) for c in flat):
            raise ValueError(f"polygon {polygon!r:.60} is not a list of x, y pixel pairs")
        polygons.append([(float(flat[i]), float(flat[i + 1])) for i in range(0, len(flat), 2)])
    return polygons


def _find_image(root: Path, image_id: str) -> Path:
    stem = Path(image_id)
    candidates = [root / "images" / image_id, root / image_id]
    candidates += [root / folder / f"{stem.stem}{s}" for folder in ("images", ".") for s in IMAGE_SUFFIXES]
    return next((p for p in candidates if p.is_file()), candidates[0])


def prompt_for(question: str, task_type: str) -> str:
    question = question.strip()
    refer = task_type.startswith("ref")  # "ref", and the region-captioning rows' "ref1"
    return f"[refer] Give me the location of <p> {question} </p>" if refer else f"[grounding]{question}"


def load_referring(root: Path | str, check_images: bool = True) -> Loaded:
    root = Path(root)
    path = root / FILE if root.is_dir() else root
    root = path.parent
    if not path.is_file():
        raise BenchmarkError(f"GeoChat referring: {path} not found")
    report, items, repaired = ReadReport(), [], 0
    for number, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path.name}:{number}"
        try:
            row = parse_json(line)
            qid, image_id, question = str(row["question_id"]), str(row["image_id"]), str(row["question"])
            polygons = _polygons(row["ground_truth"])
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            report.skip(MALFORMED_LINE, f"{where}: {err}")
            continue
        try:
            for polygon in polygons:
                convex_polygon(polygon)
        except DegeneratePolygonError as err:
            report.skip(BAD_POLYGON, f"{where}: {err}")
            continue
        repaired += sum(not is_simple(p) for p in polygons)
        image = _find_image(root, image_id)
        if check_images and not image.is_file():
            report.skip(MISSING_IMAGE, f"{where}: {image} not found")
            continue
        task_type = str(row.get("type") or "ref")
        size = image_size(image_id)
        obj_ids = row.get("obj_ids") if isinstance(row.get("obj_ids"), list) else None
        items.append(
            EvalItem(
                id=qid,
                image=str(image),
                prompt=prompt_for(question, task_type),
                reference=polygons,
                kind=task_type,
                meta={
                    "width": size,
                    "height": size,
                    "size_group": row.get("size_group"),
                    "targets": "single" if len(obj_ids or polygons) == 1 else "multiple",
                    "dataset": row.get("dataset"),
                    "expression": question,
                },
            )
        )
    notes = [f"{repaired} self-intersecting ground-truth polygon(s) repaired to their convex hull"] if repaired else []
    return Loaded("GeoChat-referring", items, report, notes)
