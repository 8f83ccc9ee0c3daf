"""Training throughput: LLaVA-style random-order padded batches vs GeoPilot's length-grouped batches.

Same tiny model, same data (synthetic optical + SAR tool traces of varied length), same optimizer; each round runs
one epoch of each mode back to back, `--repeats` rounds. Reports trained (non-padding) tokens per second (median
epoch per mode), the useful-token fraction (non-padding / all tokens processed; deterministic), and the throughput
ratio of every round with its spread. Targets: useful fraction >= 0.90 and throughput >= 1.3x the padded baseline;
the throughput verdict is "noisy, rerun" when the rounds disagree (benchmarks/rounds.py).

    python benchmarks/train_throughput.py [--samples 192] [--batch-size 8] [--device cpu] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from output import emit  # benchmarks/output.py
from rounds import MAX_SPREAD, Rounds, judge  # benchmarks/rounds.py (this folder is on sys.path when run as a script)

from geopilot.data_gen.synthetic.samples import write_demo_dataset
from geopilot.model import ModelConfig, build_model, num_image_tokens
from geopilot.training.batching import Collator, LengthGroupedBatches, RandomBatches, padding_stats
from geopilot.training.config import DataConfig
from geopilot.training.data import build_training_data

MODES = {"llava_random_padded": RandomBatches, "geopilot_length_grouped": LengthGroupedBatches}


def run_epoch(mode: str, data, processor, batch_size: int, device: str, seed: int, warmup: int) -> dict:
    model, _ = build_model(ModelConfig(init="tiny"))
    model.to(device).train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    collate = Collator(processor)
    inputs = []
    for indices in MODES[mode](list(data.dataset["length"]), batch_size, 1, seed):  # collated up front: time the model
        batch = collate([data.dataset[i] for i in indices])
        batch.pop("sample_ids")
        inputs.append({k: v.to(device) for k, v in batch.items()})
    # Warm-up pass over every batch shape: on CPU the first step at a new sequence length costs seconds of kernel
    # set-up (measured 1-4 s vs 0.03-0.3 s warm), which would otherwise bill the mode with more distinct lengths.
    for batch in inputs if warmup else []:
        model(**batch).loss.backward()
        optimizer.zero_grad()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    useful = processed = 0
    start = time.perf_counter()
    for batch in inputs:
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        n_useful, n_all = padding_stats(batch)
        useful, processed = useful + n_useful, processed + n_all
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {
        "mode": mode,
        "batches": len(inputs),
        "tokens_processed": processed,
        "tokens_useful": useful,
        "useful_fraction": useful / processed,
        "seconds": seconds,
        "useful_tokens_per_s": useful / seconds,
        "processed_tokens_per_s": processed / seconds,
    }


def summarize(runs: dict[str, list[dict]], max_spread: float = MAX_SPREAD) -> dict:
    """Median epoch per mode, the per-round throughput ratio with its spread, and the two target verdicts."""
    base, ours = (runs[mode] for mode in MODES)
    ratio = Rounds(tuple(o["useful_tokens_per_s"] / b["useful_tokens_per_s"] for b, o in zip(base, ours, strict=True)))
    results = []
    for epochs in runs.values():  # batches, tokens and the useful fraction are the same every epoch; speeds vary
        speeds = ("seconds", "useful_tokens_per_s", "processed_tokens_per_s")
        results.append({**epochs[0], **{key: statistics.median(e[key] for e in epochs) for key in speeds}})
    fraction = ours[0]["useful_fraction"]
    return {
        "results": results,
        "throughput_ratio": ratio.as_dict(),
        "target_useful_fraction": "met" if fraction >= 0.90 else "NOT met",
        "target_throughput_ratio": str(judge(ratio, 1.3, True, max_spread)),
    }


def print_text(summary: dict, lengths: list[int], repeats: int) -> None:
    print(
        f"device {summary['device']}, {summary['samples']} samples, batch {summary['batch_size']}, lengths "
        f"{min(lengths)}-{max(lengths)} tokens"
    )
    print(f"median epoch of {repeats} rounds")
    print(f"{'':26}{'useful frac':>12}{'useful tok/s':>14}{'all tok/s':>12}{'seconds':>10}")
    for r in summary["results"]:
        print(
            f"{r['mode']:26}{r['useful_fraction']:12.3f}{r['useful_tokens_per_s']:14.0f}"
            f"{r['processed_tokens_per_s']:12.0f}{r['seconds']:10.2f}"
        )
    print(f"useful fraction of grouped batches, target >= 0.90: {summary['target_useful_fraction']}")
    ratio = Rounds(tuple(summary["throughput_ratio"]["rounds"]))
    print(f"throughput ratio (useful tokens/s, grouped / random): {ratio.describe()}")
    print(f"  target >= 1.3x: {summary['target_throughput_ratio']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=192)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--warmup", type=int, default=1, help="1: an untimed pass over every batch first; 0: none")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="rounds: one epoch of each mode per round")
    parser.add_argument("--max-spread", type=float, default=MAX_SPREAD, help="rounds spread beyond this: noisy")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        path = write_demo_dataset(
            Path(tmp) / "data", optical=args.samples * 2 // 3, sar=args.samples // 3, seed=args.seed
        )
        model, processor = build_model(ModelConfig(init="tiny"))
        cfg = DataConfig(files=[str(path)], replay_alpha=1.0, max_length=4096)
        data = build_training_data(cfg, 2, processor.tokenizer, num_image_tokens(model.config), Path(tmp) / "cache")
        runs = {mode: [] for mode in MODES}
        for _ in range(args.repeats):  # one round = both modes back to back: a busy host hits both alike
            for mode in MODES:
                runs[mode].append(
                    run_epoch(mode, data, processor, args.batch_size, args.device, args.seed, args.warmup)
                )
    summary = {
        "device": args.device,
        "samples": len(data.dataset),
        "batch_size": args.batch_size,
        **summarize(runs, args.max_spread),
    }
    lengths = data.dataset["length"]
    return emit(summary, args.json, lambda: print_text(summary, lengths, args.repeats))


if __name__ == "__main__":
    raise SystemExit(main())
