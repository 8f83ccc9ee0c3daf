"""End-to-end tool tasks (paper Table 13): the same metric on (a) GeoPilot choosing the tool and its parameters and
(b) the standalone tool called directly with the ground-truth parameters, and the gap (a - b).

- Semantic segmentation, OpenEarthMap (`read_openearthmap`, label 0 ignored): prompt `SEGMENT_PROMPT` with the
  eight class names; standalone = `segment_semantic(classes=<the eight names>)`. The prediction is the label map of
  the last successful `segment_semantic` call of the record: each returned class mask (COCO RLE) paints its class
  id, the first class listed wins where masks overlap, unpainted pixels are "no prediction" (false negatives). A
  record without that call (the model answered directly or chose another tool) predicts nothing. A mask whose size
  differs from the label map is not resized: the image is scored as "no prediction" and counted in `size_mismatch`.
  mIoU over classes 1-8 from one confusion matrix over the split.
- Referring detection, GeoChat-Bench `referring.jsonl`: prompt `REFER_PROMPT` with the expression; standalone =
  `ground(expression=<the expression>)`. Acc@0.5 as in `eval.task_metrics.grounding`.

Both sides keep resumable predictions under `<out>/<task>/{geopilot,standalone}/predictions.jsonl`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from geopilot.errors import GeoPilotInputError
from geopilot.eval.benchmark_tasks import score_referring
from geopilot.eval.loaders.common import BenchmarkError, EvalItem
from geopilot.eval.loaders.referring import load_referring
from geopilot.eval.predictions import PREDICTIONS, predict, read_predictions
from geopilot.eval.task_metrics.segmentation import ConfusionMatrix, MaskShapeError
from geopilot.fileio import append_jsonl

SEGMENT_PROMPT = "Segment this image into these land-cover classes: {classes}."
REFER_PROMPT = "Locate {expression} in this image."


def _standalone(registry, items: list[EvalItem], tool: str, params_of, out_dir: Path) -> dict[str, dict]:
    """Call `tool` with ground-truth params on every item (resumable, same record format as `predict`)."""
    from geopilot.image import load_image
    from geopilot.sample import Action

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / PREDICTIONS
    done = read_predictions(path)
    for item in items:
        if item.id in done:
            continue
        params = params_of(item)
        try:
            result = registry.call(Action(tool=tool, params=params), load_image(item.image), modality=None)
            call = {
                "tool": tool,
                "params": params,
                "output": result.output.model_dump(mode="json", exclude_none=True) if result.output else None,
                "error": result.error,
            }
        except GeoPilotInputError as err:
            call = {"tool": tool, "params": params, "output": None, "error": str(err)}
        record = {
            "id": item.id,
            "answer": "",
            "outcome": "standalone",
            "error": call["error"],
            "tool_calls": [call],
        }
        append_jsonl(path, [record])  # closes a line torn by a kill first: no record is glued onto it
        done[item.id] = record
    return done


def label_map(record: dict | None, class_ids: dict[str, int], shape: tuple[int, int]) -> np.ndarray:
    """The predicted label map of a record (-1 = no prediction); MaskShapeError when a mask has another size."""
    from pycocotools import mask as mask_utils

    out = np.full(shape, -1, dtype=np.int64)
    calls = [c for c in (record or {}).get("tool_calls") or [] if c.get("tool") == "segment_semantic"]
    output = next((c.get("output") for c in reversed(calls) if c.get("output") and not c.get("error")), None)
    for segment in reversed((output or {}).get("segments", [])):  # reversed: the first listed class paints last
        class_id = class_ids.get(segment["label"].strip().lower())
        if class_id is None or not segment.get("mask"):
            continue
        rle = segment["mask"]
        if tuple(rle["size"]) != tuple(shape):
            raise MaskShapeError(f"mask of {segment['label']!r} is {tuple(rle['size'])}, the label map {shape}")
        decoded = mask_utils.decode({"size": list(rle["size"]), "counts": rle["counts"].encode()}).astype(bool)
        out[decoded] = class_id
    return out


def segmentation_e2e(
    pilot, registry, root: Path, out_dir: Path, split: str, batch_size: int, generation: dict | None = None
) -> dict:
    from geopilot.data_gen.readers.openearthmap import OEM_IGNORE, read_label, read_openearthmap

    records, _report = read_openearthmap(root, split=split)
    if not records:
        raise BenchmarkError(f"OpenEarthMap: no usable images in split {split!r} under {root}")
    names = records[0].semantic.class_names  # code -> name
    classes = [names[c] for c in sorted(names) if c not in OEM_IGNORE]
    items = [
        EvalItem(r.record_id, r.image, SEGMENT_PROMPT.format(classes=", ".join(classes)), r.semantic.mask_path, "seg")
        for r in records
    ]
    sides = {
        "geopilot": predict(pilot, items, out_dir / "geopilot", batch_size, generation=generation),
        "standalone": _standalone(
            registry, items, "segment_semantic", lambda i: {"classes": classes}, out_dir / "standalone"
        ),
    }
    class_ids = {name.lower(): code for code, name in names.items()}
    num_classes = max(names) + 1
    scores = {}
    for side, predictions in sides.items():
        matrix = ConfusionMatrix(num_classes, OEM_IGNORE, [names.get(c, str(c)) for c in range(num_classes)])
        mismatched = 0
        for item in items:
            truth = read_label(Path(item.reference))
            try:
                predicted = label_map(predictions.get(item.id), class_ids, truth.shape)
            except MaskShapeError:
                mismatched += 1
                predicted = np.full(truth.shape, -1, dtype=np.int64)
            matrix.update(truth, predicted)
        scores[side] = {
            **matrix.as_dict(),
            "size_mismatch": mismatched,
            "missing": sum(i.id not in predictions for i in items),
        }
    return scores


def referring_e2e(pilot, registry, root: Path, out_dir: Path, batch_size: int, generation: dict | None = None) -> dict:
    loaded = load_referring(root)
    for item in loaded.items:
        item.prompt = REFER_PROMPT.format(expression=item.meta["expression"])
    sides = {
        "geopilot": predict(pilot, loaded.items, out_dir / "geopilot", batch_size, generation=generation),
        "standalone": _standalone(
            registry, loaded.items, "ground", lambda i: {"expression": i.meta["expression"]}, out_dir / "standalone"
        ),
    }
    return {side: score_referring(loaded, records) for side, records in sides.items()}


def run_tools_e2e(
    pilot,
    out_dir: Path | str,
    segmentation: Path | str | None = None,
    referring: Path | str | None = None,
    registry=None,
    split: str = "test",
    batch_size: int = 8,
    generation: dict | None = None,
) -> dict:
    """Table 13: rows {task, metric, standalone, geopilot, gap} (fractions); writes metrics.json, report.md, PNG."""
    from geopilot.eval.task_report import write_e2e_report

    if segmentation is None and referring is None:
        raise BenchmarkError("tools-e2e needs --segmentation (OpenEarthMap root) and/or --referring (referring.jsonl)")
    out_dir, registry = Path(out_dir), registry if registry is not None else pilot.tools
    result: dict = {"rows": []}
    if segmentation is not None:
        seg = segmentation_e2e(
            pilot, registry, Path(segmentation), out_dir / "segmentation", split, batch_size, generation
        )
        result["segmentation"] = seg
        result["rows"].append(_row("Semantic Segmentation", "mIoU", seg["standalone"]["mIoU"], seg["geopilot"]["mIoU"]))
    if referring is not None:
        ref = referring_e2e(pilot, registry, Path(referring), out_dir / "referring", batch_size, generation)
        result["referring"] = ref
        result["rows"].append(
            _row("Referring Object Detection", "Acc@0.5", ref["standalone"]["Acc@0.5"], ref["geopilot"]["Acc@0.5"])
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "metrics.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    write_e2e_report(result, out_dir)
    return result


def _row(task: str, metric: str, standalone: float, geopilot: float) -> dict:
    return {
        "task": task,
        "metric": metric,
        "standalone": standalone,
        "geopilot": geopilot,
        "gap": geopilot - standalone,
    }
