"""A loopback OpenAI-compatible chat endpoint that answers generation prompts from their FACTS line, via the
template backend, with injectable latency and faults. For tests, `benchmarks/gen_throughput.py` and dry runs
of the HTTP path with no LLM:

    with LoopbackLLM(latency_s=0.2, faults=Faults(rate_limited=0.1, malformed_json=0.1)) as server:
        ...  # backend.url = server.url  (http://127.0.0.1:<random port>/v1)

Faults are decided per (sample, stage) from a hash, so a run injects the same faults whatever its concurrency:
`malformed_json`, `prose` and `out_of_range_box` (answer stage) hit the first attempt only, which the generator
must regenerate; `rate_limited` (429 + Retry-After) and `server_error` (503) hit the first delivery of a request
only, which the client must retry. `served` counts what was sent, by kind.

Standalone (prints the URL, serves until killed): `python -m geopilot.data_gen.loopback_server --latency 0.2`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import threading
from collections import Counter
from dataclasses import dataclass

from geopilot.data_gen.llm import facts_from_messages
from geopilot.data_gen.templates import TemplateClient

BAD_BOX = " The main object is at [0.2, 0.3, 1.4, 0.5]."


@dataclass(frozen=True)
class Faults:
    rate_limited: float = 0.0
    server_error: float = 0.0
    malformed_json: float = 0.0
    prose: float = 0.0
    out_of_range_box: float = 0.0
    retry_after_s: float = 0.05
    down_after: int | None = None  # answer 503 to every request after this many (an endpoint that goes down)


def _hit(rate: float, *key: object) -> bool:
    if rate <= 0:
        return False
    digest = hashlib.sha256("/".join(str(k) for k in key).encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < rate


class LoopbackLLM:
    def __init__(self, latency_s: float = 0.0, faults: Faults | None = None, port: int = 0):
        self.latency_s, self.faults, self.port = latency_s, faults or Faults(), port
        self.served: Counter = Counter()
        self._seen: set[str] = set()
        self._templates = TemplateClient()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> LoopbackLLM:
        self._thread = threading.Thread(target=self._serve, name="loopback-llm", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("loopback LLM server did not start")
        return self

    def __exit__(self, *exc) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def _serve(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))  # port 0: the OS picks a free one
        self.port = sock.getsockname()[1]
        await web.SockSite(runner, sock, backlog=1024).start()
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    async def _handle(self, request):
        from aiohttp import web

        body = await request.json()
        self.served["requests"] += 1
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        messages = body.get("messages", [])
        facts = facts_from_messages(messages) or {}
        sample, stage = facts.get("sample_id", ""), facts.get("stage", "")
        first_delivery = (
            digest := hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        ) not in self._seen
        self._seen.add(digest)
        f = self.faults
        if f.down_after is not None and self.served["requests"] > f.down_after:
            self.served["down"] += 1
            return web.json_response({"error": {"message": "service unavailable"}}, status=503)
        if first_delivery and _hit(f.rate_limited, sample, stage, "429"):
            self.served["rate_limited"] += 1
            return web.json_response(
                {"error": {"message": "rate limited"}}, status=429, headers={"Retry-After": str(f.retry_after_s)}
            )
        if first_delivery and _hit(f.server_error, sample, stage, "503"):
            self.served["server_error"] += 1
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        first_attempt = not any("previous reply was rejected" in m.get("content", "") for m in messages)
        if not stage:
            content = "Sure! I'd be happy to help with that."
            self.served["prose"] += 1
        elif first_attempt and _hit(f.prose, sample, stage, "prose"):
            content = "Sure! Here is a realistic query about the image and my reasoning."
            self.served["prose"] += 1
        else:
            reply = self._templates.reply(stage, facts, int(body.get("seed", 0)))
            content = json.dumps(reply)
            if first_attempt and _hit(f.malformed_json, sample, stage, "json"):
                content = content[:-2] + ","  # cut off: not parseable
                self.served["malformed_json"] += 1
            elif first_attempt and stage == "answer" and _hit(f.out_of_range_box, sample, stage, "box"):
                content = json.dumps({**reply, "answer": reply["answer"] + BAD_BOX})
                self.served["out_of_range_box"] += 1
            else:
                self.served["ok"] += 1
        return web.json_response(
            {
                "id": f"chatcmpl-{self.served['requests']}",
                "object": "chat.completion",
                "model": body.get("model", "loopback"),
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                ],
            }
        )


def main(argv: list[str] | None = None) -> int:
    import argparse
    import time

    parser = argparse.ArgumentParser(
        description="loopback OpenAI-compatible endpoint answering from the template backend"
    )
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per call")
    args = parser.parse_args(argv)
    with LoopbackLLM(latency_s=args.latency, port=args.port) as server:
        print(server.url, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
