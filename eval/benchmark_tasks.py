"""The GeoPilotBench model tasks (everything but planning): loader + prompt + scoring + report, one table.

    result = run_task("rsvqa-lr", pilot, "data/RSVQA_LR", Path("runs/eval/lr"), batch_size=16)

`TASKS` is the explicit registry the CLI (`geopilot eval <task>`) reads. Each task loads its benchmark
(`eval.loaders`), runs the model in batches with resumable predictions (`eval.predictions`), scores the predictions
with the pure metrics (`eval.task_metrics`) and writes `metrics.json`, `report.md` and `<task>.png` under the output
folder (`eval.task_report`). End-to-end tool tasks are `eval.tools_e2e`; captions from files are `score_caption_files`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from geopilot.eval.loaders.common import BenchmarkError, Loaded
from geopilot.eval.loaders.referring import decode_boxes, load_referring, text_box_repairs
from geopilot.eval.loaders.rsvqa import AVERAGED_TYPES, load_rsvqa
from geopilot.eval.loaders.sarlang import SAR_TYPES, load_sar_captions, load_sar_vqa
from geopilot.eval.predictions import predict
from geopilot.eval.task_metrics.caption import caption_metrics
from geopilot.eval.task_metrics.grounding import DEFAULT_PROTOCOL, PROTOCOLS, acc_at_iou
from geopilot.eval.task_metrics.tokenize import TOKENIZERS
from geopilot.eval.task_metrics.vqa import accuracy, exact_match, sarlang_match

GROUNDING_TOOLS = ("ground", "segment_referring", "sar_ground")
ALTERNATIVE_KEYS = ("Acc@0.5", "by_size", "by_count", "by_type", "correct")


def _grounding_output(record: dict) -> dict | None:
    """The output of the record's last successful grounding tool call, if any."""
    for call in reversed(record.get("tool_calls") or []):
        output = call.get("output") or {}
        if call.get("tool") in GROUNDING_TOOLS and output and not output.get("error"):
            return output
    return None


def predicted_polygons(record: dict, width: int, height: int) -> list[list[tuple[float, float]]]:
    """The boxes a prediction record gives, in pixels: the detections of its last successful grounding tool call
    (polygon when the tool gave one, else the box), or, when no grounding tool ran, the `{<x1><y1><x2><y2>|θ}` boxes
    written in the answer text."""
    output = _grounding_output(record)
    if output is None:
        return decode_boxes(record.get("answer") or "", width, height)
    polygons = []
    for det in output.get("detections", []):
        if det.get("polygon"):
            polygons.append([(x * width, y * height) for x, y in det["polygon"]])
        else:
            x1, y1, x2, y2 = det["box"]
            polygons.append(
                [
                    (x1 * width, y1 * height),
                    (x2 * width, y1 * height),
                    (x2 * width, y2 * height),
                    (x1 * width, y2 * height),
                ]
            )
    return polygons


def _answers(records: dict[str, dict]) -> dict[str, str]:
    return {i: str(r.get("answer") or "") for i, r in records.items()}


def score_vqa(loaded: Loaded, records: dict[str, dict], averaged: list[str], match=exact_match) -> dict:
    result = accuracy(
        _answers(records),
        {i.id: i.reference for i in loaded.items},
        {i.id: i.kind for i in loaded.items},
        match=match,
        averaged_types=averaged,
    )
    return result.as_dict()


def score_referring(loaded: Loaded, records: dict[str, dict]) -> dict:
    predictions = {
        item.id: predicted_polygons(records[item.id], item.meta["width"], item.meta["height"])
        for item in loaded.items
        if item.id in records
    }
    splits = {
        "size_group": {i.id: i.meta.get("size_group") for i in loaded.items},
        "task_type": {i.id: i.kind for i in loaded.items},
        "targets": {i.id: i.meta.get("targets") for i in loaded.items},
    }
    truth = {i.id: i.reference for i in loaded.items}
    metrics = acc_at_iou(truth, predictions, **splits, protocol=DEFAULT_PROTOCOL).as_dict()
    metrics["alternatives"] = {  # the same predictions under the other protocols (docs/eval_tasks.md)
        protocol: {
            key: value
            for key, value in acc_at_iou(truth, predictions, **splits, protocol=protocol).as_dict().items()
            if key in ALTERNATIVE_KEYS
        }
        for protocol in PROTOCOLS
        if protocol != DEFAULT_PROTOCOL
    }
    repairs = Counter()
    for item_id, record in records.items():
        if item_id in truth and _grounding_output(record) is None:
            repairs.update(text_box_repairs(record.get("answer") or ""))
    metrics["box_repairs"] = dict(sorted(repairs.items()))  # boxes decoded off the grid / with swapped corners, kept
    return metrics


def score_captions(references: dict[str, list[str]], predictions: dict[str, str], tokenizer: str = "raw") -> dict:
    """BLEU-1..4, ROUGE-L, CIDEr (fractions) over every reference id; a missing prediction scores as an empty
    caption and is counted in `missing`, an empty one in `empty`."""
    if tokenizer not in TOKENIZERS:
        raise BenchmarkError(f"unknown tokenizer {tokenizer!r}; choose from {list(TOKENIZERS)}")
    tokenize = TOKENIZERS[tokenizer]
    missing = [i for i in references if i not in predictions]
    refs = {i: [tokenize(r) for r in refs] for i, refs in references.items()}
    for i, tokenized in refs.items():
        if not tokenized or any(not r for r in tokenized):
            raise BenchmarkError(f"reference for id {i!r} is empty (every id needs non-empty reference captions)")
    hyps = {i: tokenize(predictions.get(i, "")) for i in references}
    metrics = caption_metrics(refs, hyps)
    return {
        **metrics,
        "tokenizer": tokenizer,
        "total": len(references),
        "missing": len(missing),
        "missing_ids": missing[:20],
        "empty": sum(1 for i in references if i in predictions and not hyps[i]),
        "unexpected": len([i for i in predictions if i not in references]),
    }


@dataclass(frozen=True)
class Task:
    name: str
    summary: str
    data_help: str
    load: Callable[[Path], Loaded]
    score: Callable[[Loaded, dict[str, dict], dict], dict]  # (loaded, records, options) -> metrics


def _score_captions_task(loaded: Loaded, records: dict[str, dict], options: dict) -> dict:
    return score_captions({i.id: i.reference for i in loaded.items}, _answers(records), options.get("tokenizer", "raw"))


TASKS: dict[str, Task] = {
    "rsvqa-lr": Task(
        "rsvqa-lr",
        "RSVQA-LRBEN accuracy by question type (average over presence/comp/rural_urban)",
        "RSVQA-LR root: LR_split_test_{questions,answers,images}.json + Images_LR/ (+ optional lrben.jsonl)",
        lambda root: load_rsvqa(root, "lr"),
        lambda loaded, records, options: score_vqa(loaded, records, AVERAGED_TYPES["lr"]),
    ),
    "rsvqa-hr": Task(
        "rsvqa-hr",
        "RSVQA-HRBEN (test set 2) accuracy by question type (average over presence/comp)",
        "RSVQA-HR root: USGS_split_test_phili_{questions,answers,images}.json + Data/ (+ optional hrben.jsonl)",
        lambda root: load_rsvqa(root, "hr"),
        lambda loaded, records, options: score_vqa(loaded, records, AVERAGED_TYPES["hr"]),
    ),
    "referring": Task(
        "referring",
        "GeoChat-Bench referring detection Acc@0.5 by size and single/multiple",
        "folder with referring.jsonl + images/ (or the .jsonl itself)",
        load_referring,
        lambda loaded, records, options: score_referring(loaded, records),
    ),
    "sar-vqa": Task(
        "sar-vqa",
        "SAR VQA (SARDet-100K-based SARVQA1) accuracy: OI, IC, OC, OP and their average",
        "SARLANG-1M root: SARimages/ + Text/VQA/SARVQA1_test.{csv,json,jsonl}",
        load_sar_vqa,
        lambda loaded, records, options: score_vqa(loaded, records, SAR_TYPES, match=sarlang_match),
    ),
    "sar-caption": Task(
        "sar-caption",
        "SARLANG-1M-Cap captioning: BLEU-1..4, ROUGE-L, CIDEr",
        "SARLANG-1M root: SARimages/ + Text/caption/Caption_test.{csv,json,jsonl}",
        load_sar_captions,
        _score_captions_task,
    ),
}


def run_task(
    name: str,
    pilot,
    data: Path | str,
    out_dir: Path | str,
    batch_size: int = 8,
    max_rounds: int = 1,
    generation: dict | None = None,
    options: dict | None = None,
    progress: bool = False,
) -> dict:
    """Load, predict (resumable), score and report one task; returns the metrics dict also written to metrics.json."""
    from geopilot.eval.task_report import write_task_report

    if name not in TASKS:
        raise BenchmarkError(f"unknown task {name!r}; choose from {list(TASKS)}")
    task, out_dir = TASKS[name], Path(out_dir)
    loaded = task.load(Path(data))
    records = predict(pilot, loaded.items, out_dir, batch_size, max_rounds, generation, progress)
    records = {item.id: records[item.id] for item in loaded.items if item.id in records}
    metrics = task.score(loaded, records, options or {})
    metrics["data"] = {
        "benchmark": loaded.name,
        "items": len(loaded.items),
        "skipped": loaded.report.skipped,
        "notes": loaded.notes,
        "errors": sum(1 for r in records.values() if r.get("outcome") == "input_error"),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    write_task_report(name, metrics, out_dir)
    return metrics
