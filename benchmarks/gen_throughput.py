"""Generation throughput against an OpenAI-compatible endpoint with 200 ms per call, at concurrency 1, 8 and 32.

    python benchmarks/gen_throughput.py [--latency 0.2] [--concurrency 1 8 32] [--per-worker 8] [--repeats 3]

The endpoint is `geopilot.data_gen.loopback_server` in its own process on 127.0.0.1 (so its event loop does not
share a GIL with the generator). The data is `geopilot synth` scenes (DOTA + SARDet-100K, two abilities each, two
LLM calls per sample). Each concurrency runs `concurrency * per-worker` samples (at least `min-samples`) into a
fresh output folder, with the response cache off. samples/s is over the generation phase (`RunResult.seconds`:
reading sources and writing shards + report are one-off costs, shown as "total s"). One round runs every
concurrency once; the speed-up over concurrency 1 is taken within each round and printed per round with its
spread. The target is a speed-up of at least 0.7 x concurrency; a round faster than `concurrency` x the serial
rate contradicts the fixed per-call latency, and rounds that disagree give "noisy, rerun" (benchmarks/rounds.py).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rounds import MAX_SPREAD, Rounds, judge  # benchmarks/rounds.py (this folder is on sys.path when run as a script)

from geopilot.data_gen.generate import generate_dataset
from geopilot.data_gen.generate_config import GenerateConfig
from geopilot.data_gen.synthetic.datasets import write_synthetic
from geopilot.tools.registry import annotation_registry


def start_endpoint(latency: float) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "geopilot.data_gen.loopback_server", "--latency", str(latency)],
        stdout=subprocess.PIPE,
        text=True,
    )
    url = process.stdout.readline().strip()
    if not url.startswith("http://127.0.0.1:"):
        process.kill()
        raise RuntimeError(f"loopback endpoint did not start (got {url!r})")
    return process, url


def run_once(data: Path, out: Path, url: str, concurrency: int, records: int) -> tuple[int, float, float]:
    config = GenerateConfig(
        sources=[
            {
                "reader": "dota",
                "root": data / "DOTA",
                "limit": records,
                "abilities": ["panoptic_detection", "object_detection"],
            },
            {"reader": "sardet", "root": data / "SARDet-100K", "limit": records, "abilities": ["panoptic_detection"]},
        ],
        backend={"kind": "openai", "url": url, "model": "loopback", "concurrency": concurrency, "cache": False},
        shard_size=10_000,
    )
    start = time.perf_counter()
    result = generate_dataset(config, out)
    return result.report["kept"], result.seconds, time.perf_counter() - start


def summarize(rounds: list[dict[int, float]], max_spread: float = MAX_SPREAD) -> list[dict]:
    """Per concurrency: median samples/s, the per-round speed-up over concurrency 1 with its spread, the verdict."""
    serial = min(rounds[0])
    rows = []
    for concurrency in rounds[0]:
        speedup = Rounds(tuple(r[concurrency] / r[serial] for r in rounds))
        impossible = [  # calls have a fixed latency: c workers cannot beat c x the serial rate
            f"round {i}: {s:.2f}x at concurrency {concurrency} is more than linear"
            for i, s in enumerate(speedup.values, 1)
            if s > concurrency * 1.05
        ]
        verdict = judge(speedup, 0.7 * concurrency, True, max_spread, impossible) if concurrency != serial else None
        rows.append(
            {
                "concurrency": concurrency,
                "samples_per_s": statistics.median(r[concurrency] for r in rounds),
                "speedup": speedup.as_dict(),
                "target": 0.7 * concurrency,
                "verdict": None if verdict is None else str(verdict),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per LLM call")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--per-worker", type=int, default=8, help="samples per unit of concurrency")
    parser.add_argument("--min-samples", type=int, default=16, help="at least this many samples per run")
    parser.add_argument("--repeats", type=int, default=3, help="rounds: every concurrency once per round")
    parser.add_argument("--max-spread", type=float, default=MAX_SPREAD, help="rounds spread beyond this: noisy")
    args = parser.parse_args(argv)
    concurrencies = sorted(set(args.concurrency) | {1})
    rounds: list[dict[int, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        most = max(args.min_samples, max(concurrencies) * args.per_worker)
        write_synthetic(tmp / "data", seed=0, optical=(most + 2) // 3 + 1, sar=(most + 2) // 3 + 1)
        assert callable(annotation_registry)  # the tool layer is imported here, outside the timed runs
        process, url = start_endpoint(args.latency)
        try:
            for index in range(args.repeats):
                rates = {}
                for concurrency in concurrencies:
                    samples = max(args.min_samples, concurrency * args.per_worker)
                    records = (samples + 2) // 3  # 3 samples per DOTA + SARDet record pair
                    out = tmp / f"out_r{index}_c{concurrency}"
                    kept, seconds, total = run_once(tmp / "data", out, url, concurrency, records)
                    rates[concurrency] = kept / seconds
                    print(
                        f"round {index + 1}, concurrency {concurrency}: {kept} samples, {seconds:.2f} s ({total:.2f} total)"
                    )
                rounds.append(rates)
        finally:
            process.terminate()
            process.wait(10)
    print(f"latency {args.latency * 1000:.0f} ms per call, 2 calls per sample; samples/s over the generation phase")
    print(f"{'concurrency':>11} {'samples/s':>10}  speed-up over concurrency 1 (per round)      target: verdict")
    for row in summarize(rounds, args.max_spread):
        speedup = Rounds(tuple(row["speedup"]["rounds"]))
        line = f"{row['concurrency']:>11} {row['samples_per_s']:>10.2f}  {speedup.describe():<44}"
        print(line if row["verdict"] is None else f"{line} >= {row['target']:.1f}x: {row['verdict']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
