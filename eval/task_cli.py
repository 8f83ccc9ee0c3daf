"""`geopilot eval <task>` for the benchmark tasks, `geopilot eval captions`, `geopilot eval referring-answers` and
`geopilot eval tools-e2e`.

`task_command(task)` makes the command of a benchmark task (`geopilot.eval.benchmark_tasks.TASKS`); `CAPTIONS`,
`REFERRING_ANSWERS` and `TOOLS_E2E` are the others. `eval/cli.py`'s table lists them all.

    geopilot eval rsvqa-lr --model runs/stage2/export --data data/RSVQA_LR --out runs/eval/lr [--batch-size 16]
    geopilot eval captions --pred preds.jsonl --ref refs.jsonl --json
    geopilot eval referring-answers --pred geochat_referring_answers.jsonl --json
    geopilot eval tools-e2e --model DIR --segmentation data/OpenEarthMap --referring data/GeoChat-Bench --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from geopilot.argtypes import add_tools_config_argument
from geopilot.cli import Command
from geopilot.errors import GeoPilotInputError
from geopilot.fileio import iter_jsonl


def _model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="a GeoPilot / llava-hf model directory")
    parser.add_argument("--out", required=True, help="output folder: predictions.jsonl (resumable), metrics, report")
    parser.add_argument("--batch-size", type=int, default=8, help="requests per GeoPilot.chat_batch call")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="generation limit per turn")
    parser.add_argument("--device", default="auto", help="cuda, cpu or auto")
    parser.add_argument("--dtype", default=None, help="e.g. bfloat16 (default: the model's)")
    add_tools_config_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the metrics as JSON")


def _pilot(args: argparse.Namespace):
    from geopilot import GeoPilot

    model = Path(args.model)
    if not (model / "config.json").is_file():
        raise GeoPilotInputError(f"--model {model} is not a model directory (no config.json)")
    return GeoPilot.from_pretrained(model, device=args.device, dtype=args.dtype, tools_config=args.tools_config)


def _print(metrics: dict, args: argparse.Namespace, out: Path) -> None:
    print(json.dumps(metrics, sort_keys=True) if args.json else f"wrote {out / 'report.md'} and {out / 'metrics.json'}")


def task_command(task) -> Command:
    """The `geopilot eval <task>` command of a `Task`: --data, the model options; run_task, then its metrics."""
    name = task.name

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--data", required=True, help=task.data_help)
        _model_arguments(parser)
        if name == "sar-caption":
            parser.add_argument("--tokenize", choices=["raw", "ptb"], default="raw", help="caption tokenisation")

    def run(args: argparse.Namespace) -> int:
        from geopilot.eval.benchmark_tasks import run_task

        metrics = run_task(
            name,
            _pilot(args),
            args.data,
            Path(args.out),
            batch_size=args.batch_size,
            generation={"max_new_tokens": args.max_new_tokens},
            options={"tokenizer": getattr(args, "tokenize", "raw")},
            progress=not args.json,
        )
        _print(metrics, args, Path(args.out))
        return 0

    return Command(task.summary, add_arguments, run)


def _read_jsonl(path: str, what: str) -> list[dict]:
    if not Path(path).is_file():
        raise GeoPilotInputError(f"{what} file {path} not found")
    rows = []
    for number, row in iter_jsonl(path):
        if not isinstance(row.get("id"), (str, int)):
            raise GeoPilotInputError(f"{path} line {number}: expected an object with an 'id'")
        rows.append(row)
    return rows


def read_caption_files(pred: str, ref: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    """`--ref` lines `{"id", "references": [...]}`, `--pred` lines `{"id", "caption"}`; duplicate ids are errors."""
    references: dict[str, list[str]] = {}
    for row in _read_jsonl(ref, "--ref"):
        key, refs = str(row["id"]), row.get("references")
        if key in references:
            raise GeoPilotInputError(f"--ref: duplicate id {key!r}")
        if not isinstance(refs, list) or not refs or not all(isinstance(r, str) and r.strip() for r in refs):
            raise GeoPilotInputError(f"--ref: id {key!r} needs 'references', a non-empty list of non-empty strings")
        references[key] = refs
    predictions: dict[str, str] = {}
    for row in _read_jsonl(pred, "--pred"):
        key, caption = str(row["id"]), row.get("caption")
        if key in predictions:
            raise GeoPilotInputError(f"--pred: duplicate id {key!r}")
        if not isinstance(caption, str):
            raise GeoPilotInputError(f"--pred: id {key!r} needs 'caption', a string")
        predictions[key] = caption
    if not references:
        raise GeoPilotInputError("--ref holds no captions")
    return references, predictions


def _captions_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pred", required=True, help='predictions JSONL: {"id", "caption"} per line')
    parser.add_argument("--ref", required=True, help='references JSONL: {"id", "references": [...]} per line')
    parser.add_argument("--tokenize", choices=["raw", "ptb"], default="raw", help="raw (SARLANG official) or ptb")
    parser.add_argument("--json", action="store_true", help="print BLEU-1..4, ROUGE-L, CIDEr as JSON fractions")


def _captions_run(args: argparse.Namespace) -> int:
    import sys

    from geopilot.eval.benchmark_tasks import score_captions

    references, predictions = read_caption_files(args.pred, args.ref)
    metrics = score_captions(references, predictions, args.tokenize)
    if metrics["missing"]:
        print(
            f"geopilot eval captions: {metrics['missing']} id(s) have no prediction and score as empty captions "
            f"(first: {', '.join(metrics['missing_ids'][:5])})",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(metrics, sort_keys=True))
    else:
        for key in ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr"):
            print(f"{key:8} {metrics[key]:.4f}")
    return 0


def _referring_answers_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pred",
        required=True,
        help="answers JSONL as GeoChat's batch_geochat_grounding.py writes it: a referring.jsonl row plus 'answer'",
    )
    parser.add_argument("--json", action="store_true", help="print the metrics (both protocols) as JSON fractions")


def _referring_answers_run(args: argparse.Namespace) -> int:
    """Score another model's GeoChat-format answers without a model: Acc@0.5 under both protocols."""
    from geopilot.eval.benchmark_tasks import score_referring
    from geopilot.eval.loaders.common import BenchmarkError
    from geopilot.eval.loaders.referring import load_referring

    path = Path(args.pred)
    if not path.is_file():
        raise GeoPilotInputError(f"--pred file {path} not found")
    records: dict[str, dict] = {}
    seen: set[str] = set()
    for number, row in iter_jsonl(path):  # a line that is not a JSON object (or not UTF-8): one line, exit 2
        key = str(row.get("question_id"))
        if key in seen:
            raise GeoPilotInputError(f"--pred line {number}: duplicate question_id {key!r}")
        seen.add(key)
        if isinstance(row.get("answer"), str):
            records[key] = {"answer": row["answer"]}  # a row without an answer scores as a missing prediction
    try:
        loaded = load_referring(path, check_images=False)
    except BenchmarkError as err:
        raise GeoPilotInputError(str(err)) from err
    metrics = score_referring(loaded, records) | {"skipped": dict(loaded.report.skipped)}
    if args.json:
        print(json.dumps(metrics, sort_keys=True))
        return 0
    runs = {metrics["protocol"]: metrics, **metrics["alternatives"]}
    for protocol, result in runs.items():
        splits = {**result["by_size"], **result["by_count"], **{f"[{k}]": v for k, v in result["by_type"].items()}}
        cells = ", ".join(f"{k} {100 * v:.1f}" for k, v in splits.items())
        print(f"{protocol:15} Acc@0.5 {100 * result['Acc@0.5']:.1f} ({cells})")
    return 0


def _e2e_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--segmentation", help="OpenEarthMap root (semantic segmentation, mIoU)")
    parser.add_argument("--referring", help="GeoChat-Bench referring.jsonl or its folder (Acc@0.5)")
    parser.add_argument("--split", default="test", help="OpenEarthMap split list (test.txt, val.txt)")
    _model_arguments(parser)


def _e2e_run(args: argparse.Namespace) -> int:
    from geopilot.eval.tools_e2e import run_tools_e2e

    result = run_tools_e2e(
        _pilot(args),
        Path(args.out),
        args.segmentation,
        args.referring,
        split=args.split,
        batch_size=args.batch_size,
        generation={"max_new_tokens": args.max_new_tokens},
    )
    _print(result, args, Path(args.out))
    return 0


CAPTIONS = Command("caption metrics of --pred/--ref JSONL files (no model)", _captions_arguments, _captions_run)
REFERRING_ANSWERS = Command(
    "Acc@0.5 of GeoChat-format referring answers (no model), both protocols",
    _referring_answers_arguments,
    _referring_answers_run,
)
TOOLS_E2E = Command("end-to-end tool tasks: GeoPilot vs the standalone tool", _e2e_arguments, _e2e_run)
