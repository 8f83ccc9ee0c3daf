"""`geopilot inspect --data FILE.jsonl [--model DIR] [--json]`: what each sample trains on.

For each sample: total tokens, trained (labelled) tokens and the decoded text of every labelled span, or the
error that keeps it out of training. `--json` rows also carry `text` (the whole conversation as the chat template
renders it: `<image>` once per image, BOS and EOS as the tokenizer's text) and `hf_messages` (the sample in the HF
message form that template reads, docs/chat_template.md), so `tokenizer.apply_chat_template(row["hf_messages"],
tokenize=False) == row["text"]`. Exit code 2 when any sample has an error, so it can gate a data pipeline.
Without --model, the tiny test tokenizer and LLaVA-1.5's 576 image tokens are used (counts are then indicative).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from geopilot.errors import GeoPilotInputError, SampleError

LLAVA15_IMAGE_TOKENS = 576
JSON_KEYS = ("id", "num_tokens", "num_trained_tokens", "trained_segments", "text", "hf_messages", "error")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="a JSONL file of samples")
    parser.add_argument("--model", help="model directory whose tokenizer and image-token count to use")
    parser.add_argument("--max-length", type=int, default=None, help="report samples longer than this")
    parser.add_argument("--json", action="store_true", help="one JSON line per sample, then a summary line")


def inspect_line(line: str, line_number: int, tokenizer, image_tokens, max_length: int | None, base_dir: Path) -> dict:
    """`image_tokens`: a number (LLaVA's renderer, every image) or the model's `ImageTokens` (its family's)."""
    from geopilot.errors import ImageInputError
    from geopilot.sample import parse_sample
    from geopilot.training.data import ImageTokens

    tokens = ImageTokens.fixed(image_tokens) if isinstance(image_tokens, int) else image_tokens

    record = {
        "id": None,
        "line": line_number,
        "num_tokens": 0,
        "num_trained_tokens": 0,
        "trained_segments": [],
        "text": None,
        "hf_messages": None,
        "error": None,
    }
    try:
        try:
            data = json.loads(line)
        except json.JSONDecodeError as err:
            raise SampleError(f"not valid JSON ({err.msg} at column {err.colno})", line=line_number) from None
        if isinstance(data, dict) and isinstance(data.get("id"), str):
            record["id"] = data["id"]
        sample = parse_sample(data, line=line_number)
        record["text"] = tokens.family.prompt_text(sample.messages, tokenizer)
        record["hf_messages"] = tokens.family.hf_messages(sample.messages)
        images = sample.image_paths(base_dir)  # in order; each takes the first's count (one size)
        if missing := next((image for image in images if not image.is_file()), None):
            raise SampleError(f"image not found: {missing}", sample_id=sample.id, line=line_number, field="image")
        try:
            count = tokens.count(str(images[0])) if images else 0
            boxes = tokens.boxes(str(images[0])) if images else None
        except ImageInputError as err:
            raise SampleError(
                f"image unreadable: {err}", sample_id=sample.id, line=line_number, field="image"
            ) from None
        # what the model reads: boxes in its family's convention (Qwen2.5-VL: pixels of the resized image)
        record["text"] = tokens.family.prompt_text(sample.messages, tokenizer, boxes=boxes)
        record["hf_messages"] = tokens.family.hf_messages(sample.messages, boxes=boxes)
        rendered = tokens.family.render_sample(sample, tokenizer, count, max_length=max_length, boxes=boxes)
    except SampleError as err:
        record["error"] = str(err)
        return record
    record["num_tokens"] = len(rendered.input_ids)
    record["num_trained_tokens"] = rendered.num_trained
    record["trained_segments"] = [tokenizer.decode(rendered.input_ids[a:b]) for a, b in rendered.trained_spans()]
    return record


def _print_human(record: dict, console) -> None:
    from rich.markup import escape

    name = record["id"] or f"line {record['line']}"
    if record["error"]:  # the error names the sample and the line itself
        console.print(f"[bold red]✗[/] {escape(record['error'])}")
        return
    console.print(
        f"[bold green]✓[/] {escape(name)}: {record['num_tokens']} tokens, {record['num_trained_tokens']} trained"
    )
    for segment in record["trained_segments"]:
        console.print("    [cyan]trained:[/] " + escape(segment if len(segment) < 300 else segment[:297] + "..."))


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    path = Path(args.data)
    if not path.is_file():
        raise GeoPilotInputError(f"data file not found: {path}")
    if args.model:
        from geopilot.image import DEFAULT_MAX_PIXELS
        from geopilot.model import load_model
        from geopilot.training.data import ImageTokens

        _, processor = load_model(args.model)
        tokenizer, image_tokens = processor.tokenizer, ImageTokens.of(processor, DEFAULT_MAX_PIXELS)
    else:
        from geopilot.tokenizer import tiny_tokenizer

        tokenizer, image_tokens = tiny_tokenizer(), LLAVA15_IMAGE_TOKENS
    console = Console(highlight=False)
    summary = {"samples": 0, "ok": 0, "errors": 0, "zero_trained": 0}
    first_line: dict[str, int] = {}  # sample id -> the line it first appeared on
    with path.open("rb") as handle:  # decoded per line: invalid UTF-8 is that line's error
        for line_number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                line = None
                error = str(SampleError(f"not valid UTF-8 (byte {err.start + 1} of the line)", line=line_number))
            if line is None:
                record = {"id": None, "line": line_number, "num_tokens": 0, "num_trained_tokens": 0}
                record |= {"trained_segments": [], "text": None, "hf_messages": None, "error": error}
            else:
                record = inspect_line(line, line_number, tokenizer, image_tokens, args.max_length, path.parent)
            sample_id = record["id"]
            if sample_id is not None and sample_id in first_line and not record["error"]:
                record["error"] = str(
                    SampleError(
                        f"duplicate id (first on line {first_line[sample_id]})", sample_id=sample_id, line=line_number
                    )
                )
            if sample_id is not None:
                first_line.setdefault(sample_id, line_number)
            summary["samples"] += 1
            if record["error"]:
                summary["errors"] += 1
            elif record["num_trained_tokens"] == 0:
                summary["zero_trained"] += 1
            else:
                summary["ok"] += 1
            if args.json:
                print(
                    json.dumps(
                        {k: record[k] for k in JSON_KEYS},
                        ensure_ascii=False,
                    )
                )
            else:
                _print_human(record, console)
    if summary["samples"] == 0:
        raise GeoPilotInputError(f"{path}: no samples (the file is empty or has only blank lines)")
    if args.json:
        print(json.dumps({"summary": summary}))
    else:
        console.print(
            f"{summary['samples']} samples: {summary['ok']} ok, {summary['errors']} errors, {summary['zero_trained']} with zero trained tokens"
        )
    return 2 if summary["errors"] or summary["zero_trained"] else 0
