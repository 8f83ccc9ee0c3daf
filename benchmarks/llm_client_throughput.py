"""data_gen's LLM client at 32 requests in flight: today's aiohttp `OpenAIClient` vs the shared `openai` SDK client
(`geopilot.llm_client`) on its default httpx2 transport and on aiohttp (issue 25 item 3: data_gen moves to the SDK
unless that is more than 20 % slower).

    python benchmarks/llm_client_throughput.py [--requests 256] [--in-flight 32] [--latency 0.2] [--rounds 3]

The endpoint is `geopilot.data_gen.loopback_server` in its own process (200 ms per call). Each round runs every
client once in turn (interleaved, so machine load hits all alike); a client's time is wall seconds for all requests,
its ratio is its time over today's in the same round. The floor is requests / in-flight x latency.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from gen_throughput import start_endpoint  # benchmarks/ is on sys.path when run as a script

from geopilot.data_gen.llm import LLMClientConfig, LLMRequest, OpenAIClient
from geopilot.llm_client import async_client

MAX_SLOWER = 1.20


def messages(index: int) -> list[dict]:
    return [{"role": "system", "content": "Write JSON."}, {"role": "user", "content": f"request {index}"}]


async def today(url: str, count: int, in_flight: int) -> float:
    settings = LLMClientConfig(
        kind="openai", url=url, model="loopback", concurrency=in_flight, max_retries=0, json_mode=False
    )
    client = OpenAIClient(settings)
    started = time.perf_counter()
    await asyncio.gather(*(client.complete(LLMRequest("plan", messages(i), {}, i, "v")) for i in range(count)))
    seconds = time.perf_counter() - started
    await client.aclose()
    return seconds


async def sdk(url: str, count: int, in_flight: int, transport: str) -> float:
    client = async_client(url, None, timeout_s=60, max_retries=0, transport=transport, connections=in_flight)
    gate = asyncio.Semaphore(in_flight)

    async def one(index: int) -> str:
        async with gate:
            reply = await client.chat.completions.create(model="loopback", messages=messages(index), seed=index)
            return reply.choices[0].message.content

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(count)))
    seconds = time.perf_counter() - started
    await client.close()
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    process, url = start_endpoint(args.latency)
    clients = {
        "today (aiohttp OpenAIClient)": lambda: today(url, args.requests, args.in_flight),
        "openai SDK, httpx2": lambda: sdk(url, args.requests, args.in_flight, "httpx"),
        "openai SDK, aiohttp": lambda: sdk(url, args.requests, args.in_flight, "aiohttp"),
    }
    times: dict[str, list[float]] = {name: [] for name in clients}
    try:
        asyncio.run(sdk(url, 8, 8, "httpx"))  # warm: imports, the endpoint's first connections
        for _ in range(args.rounds):
            for name, run in clients.items():
                times[name].append(asyncio.run(run()))
    finally:
        process.kill()
    floor = args.requests / args.in_flight * args.latency
    base = times["today (aiohttp OpenAIClient)"]
    print(
        f"{args.requests} requests, {args.in_flight} in flight, {args.latency * 1000:.0f} ms each (floor {floor:.2f} s)"
    )
    print("| client | s per round | median s | ratio to today (per round) |")
    print("|---|---|---|---|")
    for name, values in times.items():
        ratios = [v / b for v, b in zip(values, base, strict=True)]
        rounds = " ".join(f"{v:.2f}" for v in values)
        print(
            f"| {name} | {rounds} | {statistics.median(values):.2f} | {statistics.median(ratios):.2f}x "
            f"({' '.join(f'{r:.2f}' for r in ratios)}) |"
        )
    best = min(statistics.median(v / b for v, b in zip(times[n], base, strict=True)) for n in list(clients)[1:])
    verdict = "within" if best <= MAX_SLOWER else "more than"
    print(f"best SDK transport: {best:.2f}x today's time, {verdict} the {MAX_SLOWER:.2f}x limit")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
