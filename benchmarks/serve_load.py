"""Serving load: 32 concurrent clients for a bounded time against `geopilot serve` on loopback (tiny model), with
batching (`--max-batch 32`) and without (`--max-batch 1`), side by side.

    python benchmarks/serve_load.py                      # tiny model built in a temp dir; 2 rounds x 20 s per server
    python benchmarks/serve_load.py --model runs/stage2/export --seconds 60 --rounds 3 --json
    python benchmarks/serve_load.py --mixed --json       # answer lengths 8..128: unbatched / static / step

Both servers run as subprocesses (`python serve.py ...`) for the whole run; each round loads one, then the other
(the order alternates), so a shared machine's load hits both alike. Reported per server: requests/s, p50/p95
latency, 503s (explicit back-pressure, allowed) and errors (anything else: must be zero), and the server's RSS
before the first round (after a warm-up) and after the last. The per-round throughput ratio is judged by
benchmarks/rounds.py (target >= 3x); the last line states it.

`--mixed`: every request draws its answer length from 8..128 tokens (`min_tokens` = the draw, `max_tokens` =
the draw but at least PLAN_FLOOR, the shortest room a plan needs; the same seeded draws for every server), and three servers run side by side: unbatched (`--max-batch 1`), the static
batcher (`--scheduler static`) and the per-step scheduler (`--scheduler step`); the report adds
`ratio_vs_unbatched` and `ratio_vs_static` (the step server's throughput over theirs, per round; targets 6x and
1.3x) and each server's time to first token. A non-streamed agent reply is sent whole, so its first token reaches
the client with the last: `ttft_*` is the time to the reply's first byte.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
from output import emit  # benchmarks/output.py
from PIL import Image
from rounds import MAX_SPREAD, Rounds, judge  # benchmarks/rounds.py (this folder is on sys.path when run as a script)

ROOT = Path(__file__).resolve().parents[1]
KEY = "load-test"
TARGET = 3.0
MIXED_TARGETS = {"ratio_vs_unbatched": 6.0, "ratio_vs_static": 1.3}
MIXED_LENGTHS = (8, 128)
PLAN_FLOOR = 24  # max_tokens below the shortest plan the tiny model's plan grammar allows (19) is a 400
RSS_TOLERANCE = 0.10


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _image_url() -> str:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


class Server:
    def __init__(self, model: Path, max_batch: int, args, logs: Path, scheduler: str = "step"):
        self.port, self.max_batch = _free_port(), max_batch
        self.url = f"http://127.0.0.1:{self.port}"
        command = [
            sys.executable,
            str(ROOT / "serve.py"),
            "--model",
            str(model),
            "--port",
            str(self.port),
            "--api-key",
            KEY,
            "--max-batch",
            str(max_batch),
            "--scheduler",
            scheduler,
            "--batch-wait-ms",
            str(args.batch_wait_ms),
            "--max-concurrency",
            str(args.max_concurrency),
            "--max-new-tokens",
            str(
                max(args.max_tokens, MIXED_LENGTHS[1]) if args.mixed else args.max_tokens
            ),  # a request's may only lower it
            "--device",
            args.device,
        ]
        command += ["--dtype", args.dtype] if args.dtype else []
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
        self.log = open(logs / f"server-{scheduler}-batch{max_batch}.log", "w")  # noqa: SIM115
        self.process = subprocess.Popen(command, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server --max-batch {self.max_batch} exited ({self.log.name})")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"server --max-batch {self.max_batch} not ready")

    def rss_mb(self) -> float:
        return psutil.Process(self.process.pid).memory_info().rss / 2**20

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def mixed_lengths(client: int):
    """Client `client`'s answer lengths, drawn from MIXED_LENGTHS (the same for every server)."""
    rng = np.random.default_rng(client)
    while True:
        yield int(rng.integers(MIXED_LENGTHS[0], MIXED_LENGTHS[1] + 1))


async def load(url: str, clients: int, seconds: float, body: dict, mixed: bool = False) -> dict:
    """`clients` concurrent loops posting `body` until `seconds` have passed; latencies of the 200s. `mixed`:
    each request's `max_tokens` and `min_tokens` are the client's next drawn length."""
    latencies, first_bytes, busy, errors = [], [], 0, []
    stop = time.monotonic() + seconds
    headers = {"authorization": f"Bearer {KEY}"}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits) as client:

        async def one_client(index: int):
            nonlocal busy
            lengths = mixed_lengths(index)
            while time.monotonic() < stop:
                sent = body
                if mixed:
                    length = next(lengths)
                    sent = {**body, "max_tokens": max(length, PLAN_FLOOR), "min_tokens": length}
                start = time.monotonic()
                try:
                    async with client.stream("POST", "/v1/chat/completions", json=sent) as reply:
                        chunks = reply.aiter_bytes()
                        first = await anext(chunks, b"")
                        first_byte = time.monotonic() - start
                        content = first + b"".join([chunk async for chunk in chunks])
                except httpx.HTTPError as err:
                    errors.append(type(err).__name__)
                    continue
                if reply.status_code == 200 and json.loads(content)["choices"][0]["message"]["content"] is not None:
                    latencies.append(time.monotonic() - start)
                    first_bytes.append(first_byte)
                elif reply.status_code == 503:
                    busy += 1
                    await asyncio.sleep(0.05)
                else:
                    errors.append(f"HTTP {reply.status_code}: {content[:120].decode(errors='replace')}")

        started = time.monotonic()
        await asyncio.gather(*(one_client(index) for index in range(clients)))
        wall = time.monotonic() - started
    ordered = sorted(latencies) or [float("nan")]
    firsts = sorted(first_bytes) or [float("nan")]
    return {
        "requests": len(latencies),
        "req_per_s": len(latencies) / wall,
        "p50_s": statistics.median(ordered),
        "p95_s": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
        "ttft_p50_s": statistics.median(firsts),
        "ttft_p95_s": firsts[min(len(firsts) - 1, int(0.95 * len(firsts)))],
        "busy_503": busy,
        "errors": len(errors),
        "error_examples": sorted(set(errors))[:3],
        "wall_s": wall,
    }


def _tiny_model(directory: Path) -> Path:
    from geopilot.cli import main as geopilot_main

    out = directory / "tiny"
    if geopilot_main(["init-model", "--config", str(ROOT / "configs" / "model" / "tiny.yaml"), "--out", str(out)]):
        raise RuntimeError("init-model failed")
    return out


def print_text(report: dict, args: argparse.Namespace, model: str) -> None:
    print(
        f"{args.clients} clients x {args.seconds:g} s per server per round, {args.rounds} rounds, "
        f"max_tokens {args.max_tokens}, model {model}"
    )
    print(f"{'':16}{'req/s':>10}{'p50 s':>10}{'p95 s':>10}{'503s':>8}{'errors':>8}")
    for i, each in enumerate(report["rounds"], 1):
        for name in report["rss"]:  # the servers, in the same order every round
            r = each[name]
            print(
                f"{f'r{i} {name}':16}{r['req_per_s']:10.2f}{r['p50_s']:10.3f}{r['p95_s']:10.3f}"
                f"{r['busy_503']:8d}{r['errors']:8d}"
            )
    for name, v in report["rss"].items():
        print(
            f"RSS {name}: {v['before_mb']:.0f} MB before, {v['after_mb']:.0f} MB after ({v['growth']:+.1%}; "
            f"within 10%: {abs(v['growth']) <= RSS_TOLERANCE})"
        )
    for line in report["errors"]:
        print("ERROR", line)


def _servers(model: Path, args, logs: Path) -> dict[str, Server]:
    if args.mixed:
        return {
            "unbatched": Server(model, 1, args, logs, "static"),
            "static": Server(model, args.max_batch, args, logs, "static"),
            "step": Server(model, args.max_batch, args, logs, "step"),
        }
    return {"batched": Server(model, args.max_batch, args, logs), "max_batch_1": Server(model, 1, args, logs)}


def _mixed_report(rounds: list[dict], rss_before: dict, rss_after: dict, args, model: Path) -> int:
    """The --mixed report: the step server's per-round throughput over the unbatched and the static one's."""
    ratios = {
        key: Rounds(tuple(r["step"]["req_per_s"] / (r[other]["req_per_s"] or float("nan")) for r in rounds))
        for key, other in (("ratio_vs_unbatched", "unbatched"), ("ratio_vs_static", "static"))
    }
    verdicts = {key: str(judge(ratio, MIXED_TARGETS[key], True, args.max_spread)) for key, ratio in ratios.items()}
    bad = [f"round {i}: {n} had {r[n]['errors']} errors" for i, r in enumerate(rounds, 1) for n in r if r[n]["errors"]]
    report = {
        "clients": args.clients,
        "seconds": args.seconds,
        "answer_tokens": list(MIXED_LENGTHS),
        "rounds": rounds,
        "rss": {n: {"before_mb": rss_before[n], "after_mb": rss_after[n]} for n in rss_before},
        **{key: ratio.as_dict() for key, ratio in ratios.items()},
        "targets": {key: f"{MIXED_TARGETS[key]:g}x: {verdicts[key]}" for key in ratios},
        "errors": bad,
    }
    emit(report, args.json, lambda: print_mixed(report))
    for key, ratio in ratios.items():
        print(f"step {key}: {ratio.describe()}; target >= {MIXED_TARGETS[key]:g}x: {verdicts[key]}")
    return 1 if bad else 0


def print_mixed(report: dict) -> None:
    print(f"{report['clients']} clients x {report['seconds']:g} s per server per round, answers 8..128 tokens")
    print(f"{'':16}{'req/s':>10}{'p50 s':>10}{'p95 s':>10}{'ttft50':>10}{'503s':>8}{'errors':>8}")
    for i, each in enumerate(report["rounds"], 1):
        for name in report["rss"]:
            r = each[name]
            print(
                f"{f'r{i} {name}':16}{r['req_per_s']:10.2f}{r['p50_s']:10.3f}{r['p95_s']:10.3f}"
                f"{r['ttft_p50_s']:10.3f}{r['busy_503']:8d}{r['errors']:8d}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model directory (default: the tiny random model)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20.0, help="load time per server per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup-seconds", type=float, default=3.0, help="4 clients per server before the rounds")
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--batch-wait-ms", type=float, default=20.0)
    parser.add_argument("--max-concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=PLAN_FLOOR, help="per generated turn (at least a plan)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per server")
    parser.add_argument("--device", default="cpu", help="the servers' device (cpu, cuda)")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"], help="the model's dtype")
    parser.add_argument("--max-spread", type=float, default=MAX_SPREAD)
    parser.add_argument("--mixed", action="store_true", help="answer lengths 8..128; unbatched / static / step")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    body = {
        "model": "",
        "max_tokens": args.max_tokens,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": _image_url()}},
                    {"type": "text", "text": "How many planes?"},
                ],
            }
        ],
    }
    with tempfile.TemporaryDirectory() as scratch:
        model = Path(args.model) if args.model else _tiny_model(Path(scratch))
        body["model"] = model.name
        servers = _servers(model, args, Path(scratch))
        try:
            for server in servers.values():
                server.wait_ready()
            for server in servers.values():  # warm-up: first requests allocate caches, load the tool registry
                asyncio.run(load(server.url, 4, args.warmup_seconds, body, args.mixed))
            rss_before = {name: s.rss_mb() for name, s in servers.items()}
            rounds = []
            for index in range(args.rounds):
                order = list(servers) if index % 2 == 0 else list(reversed(servers))
                rounds.append(
                    {
                        name: asyncio.run(load(servers[name].url, args.clients, args.seconds, body, args.mixed))
                        for name in order
                    }
                )
            rss_after = {name: s.rss_mb() for name, s in servers.items()}
        finally:
            for server in servers.values():
                server.stop()
    if args.mixed:
        return _mixed_report(rounds, rss_before, rss_after, args, model)
    ratio = Rounds(tuple(r["batched"]["req_per_s"] / r["max_batch_1"]["req_per_s"] for r in rounds))
    bad = [
        f"round {i}: {name} had {r[name]['errors']} errors"
        for i, r in enumerate(rounds, 1)
        for name in r
        if r[name]["errors"]
    ]
    verdict = judge(ratio, TARGET, True, args.max_spread)
    rss = {
        name: {
            "before_mb": rss_before[name],
            "after_mb": rss_after[name],
            "growth": rss_after[name] / rss_before[name] - 1,
        }
        for name in servers
    }
    report = {
        "clients": args.clients,
        "seconds": args.seconds,
        "rounds": rounds,
        "rss": rss,
        "throughput_ratio": ratio.as_dict(),
        "target_3x": str(verdict),
        "errors": bad,
        "rss_within_10pct": all(abs(v["growth"]) <= RSS_TOLERANCE for v in rss.values()),
    }
    emit(report, args.json, lambda: print_text(report, args, model.name))
    print(f"batching vs --max-batch 1: throughput {ratio.describe()}; target >= {TARGET:g}x: {verdict}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
