"""Generation throughput against an OpenAI-compatible endpoint with 200 ms per call, at concurrency 1, 8 and 32.

    python benchmarks/gen_throughput.py [--latency 0.2] [--concurrency 1 8 32] [--per-worker 8]

The endpoint is `geopilot.data_gen.loopback_server` in its own process on 127.0.0.1 (so its event loop does not
share a GIL with the generator). The data is `geopilot synth` scenes (DOTA + SARDet-100K, two abilities each, two
LLM calls per sample). Each concurrency runs `concurrency * per-worker` samples (at least `min-samples`) into a
fresh output folder, with the response cache off. samples/s is over the generation phase (`RunResult.seconds`:
reading sources and writing shards + report are one-off costs, shown as "total s"). Prints samples/s and the
speed-up over concurrency 1 side by side; the target is a speed-up of at least 0.7 x concurrency at 32.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from geopilot.data_gen.generate import GenerateConfig, generate_dataset
from geopilot.data_gen.synth import write_synthetic
from geopilot.data_gen.validate import tool_registry


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per LLM call")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--per-worker", type=int, default=8, help="samples per unit of concurrency")
    parser.add_argument("--min-samples", type=int, default=16, help="at least this many samples per run")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        most = max(args.min_samples, max(args.concurrency) * args.per_worker)
        write_synthetic(tmp / "data", seed=0, optical=(most + 2) // 3 + 1, sar=(most + 2) // 3 + 1)
        tool_registry()  # import the tool layer once, outside the timed runs
        process, url = start_endpoint(args.latency)
        try:
            rows = []
            for concurrency in args.concurrency:
                samples = max(args.min_samples, concurrency * args.per_worker)
                records = (samples + 2) // 3  # 3 samples per DOTA + SARDet record pair
                kept, seconds, total = run_once(tmp / "data", tmp / f"out_c{concurrency}", url, concurrency, records)
                rows.append((concurrency, kept, seconds, total, kept / seconds))
        finally:
            process.terminate()
            process.wait(10)
    base = rows[0][4]
    print(f"latency {args.latency * 1000:.0f} ms per call, 2 calls per sample; samples/s over the generation phase")
    print(
        f"{'concurrency':>11} {'samples':>8} {'gen s':>7} {'total s':>8} {'samples/s':>10} {'speed-up':>9} {'target':>7}"
    )
    for concurrency, kept, seconds, total, rate in rows:
        line = f"{concurrency:>11} {kept:>8} {seconds:>7.2f} {total:>8.2f} {rate:>10.2f} {rate / base:>8.2f}x"
        print(f"{line} {0.7 * concurrency:>6.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
