"""`geopilot eval change-masks`: the `detect_changes` tool standalone on a LEVIR-CD split, scored as BIT and
LEVIR-CD report it (precision, recall, F1, IoU of the changed class and OA from one confusion matrix over the split:
`geopilot.eval.task_metrics.change`).

    geopilot eval change-masks --data LEVIR-CD --split test --out runs/eval/levir-cd device=cuda

Each pair of the split (`geopilot.data_gen.readers.levir_cd`: `<split>/{A,B,label}`, pairs whose label or after image
is missing or of another size are skipped and counted) is run through the tools registry of `--tools-config` (BIT by
default); the predicted mask is the output's `change` segment (none: nothing changed). A failed call is counted and
named in `failures`, its pixels left out. Writes `<out>/metrics.json` and prints one line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from PIL import Image

from geopilot.argtypes import add_tools_config_argument, output_folder
from geopilot.config import add_override_arguments

SHOWN_FAILURES = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_tools_config_argument(parser)
    parser.add_argument("--data", required=True, help="LEVIR-CD root: <split>/A, <split>/B, <split>/label")
    parser.add_argument("--split", default="test", choices=("train", "val", "test"), help="which split to score")
    parser.add_argument("--out", type=output_folder, required=True, help="folder for metrics.json")
    add_override_arguments(parser, "device=cpu")


def score_change_masks(registry, records) -> dict:
    """Scores of `registry`'s detect_changes on labelled pairs (AnnotationRecords with after_image, change_mask)."""
    from geopilot.eval.task_metrics.change import ChangeConfusion
    from geopilot.image import load_image
    from geopilot.sample import Action
    from geopilot.tool_output import decode_mask
    from geopilot.tools.change_output import label_mask

    confusion, failures = ChangeConfusion(), []
    for record in records:
        images = [load_image(record.image), load_image(record.after_image)]
        result = registry.call(Action(tool="detect_changes", params={}), images[0], images=images)
        if not result.ok:
            failures.append(f"{record.record_id}: {result.error}")
            continue
        segments = result.output.segments
        with Image.open(record.change_mask) as label:
            truth = label_mask(np.asarray(label))
        predicted = decode_mask(segments[0].mask) if segments else np.zeros(truth.shape, dtype=bool)
        confusion.add(predicted, truth)
    return {
        **confusion.scores(),
        "pairs": len(records) - len(failures),
        "failed": len(failures),
        "failures": failures[:SHOWN_FAILURES],
    }


def run(args: argparse.Namespace) -> int:
    from geopilot.data_gen.readers.levir_cd import read_levir_cd
    from geopilot.tools.registry import build_registry, load_tools_config

    records, report = read_levir_cd(Path(args.data), args.split)
    registry = build_registry(config=load_tools_config(args.tools_config, args.overrides))
    metrics = score_change_masks(registry, records)
    metrics["data"] = {"root": str(args.data), "split": args.split, "skipped": report.skipped}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    shown = {k: "-" if metrics[k] is None else f"{metrics[k]:.4f}" for k in ("precision", "recall", "f1", "iou")}
    print(
        f"change masks on {metrics['pairs']} pairs ({metrics['failed']} failed, "
        f"{sum(report.skipped.values())} skipped): " + ", ".join(f"{k} {v}" for k, v in shown.items())
    )
    return 0
