"""Validation during training: the loss on held-out samples (`data.eval_files`), overall and per source, modality
and ability, and the planning scores of the current weights (geopilot.eval.planning_probe, which the command
hands to the recipe).

A loss over a set of samples is token-weighted, as the training loss of one batch is: the sum of every target
token's cross-entropy divided by the number of target tokens. The held-out batches are split across processes,
every process runs the same number of forwards (ZeRO-3 gathers weights collectively), and the sums are combined.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from geopilot.training.config import DataConfig
from geopilot.training.data import ImageTokens, TrainingDataError, _image_problem, tokenised_file

log = logging.getLogger("geopilot.train")
GROUPS = ("source", "modality", "ability")


@dataclass
class EvalData:
    dataset: object  # datasets.Dataset: id, image, modality, source, ability, input_ids, labels, length
    skipped: Counter
    shared_with_training: int


def build_eval_data(
    cfg: DataConfig, tokenizer, num_image_tokens: int | ImageTokens, cache_root: Path, train_ids
) -> EvalData:
    """Every usable sample of data.eval_files (no stage selection: a stage-1 run also reports SAR loss)."""
    import datasets

    parts, skipped = [], Counter()
    for file in cfg.eval_files:
        dataset, report = tokenised_file(file, tokenizer, num_image_tokens, cfg, cache_root)
        if report["loaded"] == 0:
            raise TrainingDataError(f"data.eval_files: {file} holds no valid sample (an empty held-out set)")
        skipped["bad_line"] += report["bad_lines"]
        parts.append(dataset)
    rows = datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]
    keep, seen = [], set()
    for index, (sample_id, images, skip) in enumerate(zip(rows["id"], rows["images"], rows["skip"], strict=True)):
        cause = "duplicate_id" if sample_id in seen else "too_long" if skip else None
        if cause is None and cfg.check_images and _image_problem(images, cfg.max_pixels):
            cause = "image"
        seen.add(sample_id)
        if cause:
            skipped[cause] += 1
        else:
            keep.append(index)
    if not keep:
        raise TrainingDataError(f"data.eval_files: no usable held-out sample ({dict(skipped)})")
    usable = rows.select(keep).remove_columns("skip")
    shared = set(usable["id"]) & set(train_ids)
    if shared:
        log.warning(
            "data.eval_files: %d of %d held-out sample ids are also in the training set (e.g. %s): their validation "
            "loss is not held-out",
            len(shared),
            len(usable),
            sorted(shared)[0],
        )
    if sum(skipped.values()):
        log.warning("data.eval_files: %d held-out samples skipped (%s)", sum(skipped.values()), dict(skipped))
    return EvalData(usable, skipped, len(shared))


def _batches(lengths: list[int], batch_size: int, world: int) -> list[list[int]]:
    """Length-sorted batches (little padding), padded with empty batches to a multiple of the world size."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    return batches + [[] for _ in range(-len(batches) % world)]


def validation_loss(accelerator, model, eval_data: EvalData, collator, batch_size: int, pixel_dtype) -> dict:
    """Collective. {"val/loss": ..., "val/loss/source/<s>": ..., "val/loss/modality/<m>": ..., ...}."""
    import torch
    from accelerate.utils import gather_object

    from geopilot.training.target_loss import target_loss, target_positions

    dataset = eval_data.dataset
    rank, world = accelerator.process_index, accelerator.num_processes
    mine = _batches(list(dataset["length"]), batch_size, world)[rank::world]
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for indices in mine:
            rows = [dataset[i] for i in (indices or [0])]  # an empty batch still runs one forward (ZeRO-3)
            batch = collator(rows)
            batch.pop("sample_ids")
            batch = {k: v.to(accelerator.device) for k, v in batch.items()}
            if "pixel_values" in batch:
                batch["pixel_values"] = batch["pixel_values"].to(pixel_dtype)
            labels = batch.pop("labels")
            positions = target_positions(labels)
            logits = model(**batch, logits_to_keep=positions).logits
            if not indices:
                continue
            for row, loss_sum, count in zip(rows, *target_loss(logits, labels, positions)[1], strict=True):
                for key in ["all", *(f"{group}/{row[group] or 'unknown'}" for group in GROUPS)]:
                    totals[key][0] += loss_sum
                    totals[key][1] += count
    if was_training:
        model.train()
    merged: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for part in gather_object([dict(totals)]):
        for key, (loss_sum, count) in part.items():
            merged[key][0] += loss_sum
            merged[key][1] += count
    metrics = {"val/loss": merged["all"][0] / merged["all"][1] if merged["all"][1] else float("nan")}
    for key in sorted(k for k in merged if k != "all"):
        loss_sum, count = merged[key]
        metrics[f"val/loss/{key}"] = loss_sum / count if count else float("nan")
    return metrics
