"""Batched, resumable model inference for the benchmark tasks: `predict(pilot, items, out_dir)`.

Each finished item is appended to `<out>/predictions.jsonl` as one line and flushed, so a killed run re-started
with the same command skips every id already there and continues. A line records what scoring needs: the answer
text, the outcome, the error (if any) and every tool call with its full canonical output (boxes, polygons, masks).
Items go through `GeoPilot.chat_batch` `batch_size` at a time; if a batch fails on bad input (an unreadable
image) the items are retried one by one and the bad one is recorded with its error and an empty answer, which
scores as wrong — never dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from geopilot.errors import GeoPilotInputError
from geopilot.eval.loaders.common import BenchmarkError, EvalItem
from geopilot.fileio import append_jsonl, iter_jsonl

PREDICTIONS = "predictions.jsonl"


def read_predictions(path: Path) -> dict[str, dict]:
    """id -> record from a predictions JSONL; a line that does not parse (a torn last write) is ignored."""
    return {record["id"]: record for _, record in iter_jsonl(path, "skip") if isinstance(record.get("id"), str)}


def prediction_record(item_id: str, result) -> dict:
    """One prediction line: what scoring reads of a `ChatResult` (answer, outcome, error, every tool call)."""
    return {
        "id": item_id,
        "answer": result.answer,
        "outcome": result.outcome,
        "error": result.error,
        "tool_calls": [
            {
                "tool": call.tool,
                "params": call.params,
                "output": call.output.model_dump(mode="json", exclude_none=True) if call.output is not None else None,
                "error": call.error,
            }
            for call in result.tool_calls
        ],
    }


def failed_record(item_id: str, err: Exception) -> dict:
    return {"id": item_id, "answer": "", "outcome": "input_error", "error": str(err), "tool_calls": []}


def _batches(items: list[EvalItem], size: int) -> Iterable[list[EvalItem]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def predict(
    pilot,
    items: list[EvalItem],
    out_dir: Path,
    batch_size: int = 8,
    max_rounds: int = 1,
    generation: dict | None = None,
    progress: bool = False,
) -> dict[str, dict]:
    """Run `pilot` on every item not yet in `<out_dir>/predictions.jsonl`; return all records by id."""
    if batch_size < 1:
        raise BenchmarkError("--batch-size must be >= 1")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / PREDICTIONS
    done = read_predictions(path)
    todo = [item for item in items if item.id not in done]
    batches = _batches(todo, batch_size)
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, total=-(-len(todo) // batch_size), desc="batches", unit="batch")
    for batch in batches:
        requests = [{"image": i.image, "query": i.prompt, "modality": i.modality} for i in batch]
        try:
            results = pilot.chat_batch(requests, max_rounds, generation)
            records = [prediction_record(i.id, r) for i, r in zip(batch, results, strict=True)]
        except GeoPilotInputError:
            records = []
            for item, request in zip(batch, requests, strict=True):
                try:
                    records.append(prediction_record(item.id, pilot.chat_batch([request], max_rounds, generation)[0]))
                except GeoPilotInputError as err:
                    records.append(failed_record(item.id, err))
        append_jsonl(path, records)  # closes a line torn by a kill first: no record is glued onto it
        done.update((record["id"], record) for record in records)
    return done
