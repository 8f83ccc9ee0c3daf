"""The OpenAI-compatible backend against a real loopback HTTP server that injects malformed JSON, prose,
out-of-range boxes, 429s and 503s; an endpoint that goes down or is unreachable; the response cache."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers.traces import all_records, fake_readers

from geopilot.cli import main as cli_main
from geopilot.data_gen.generate import generate_dataset
from geopilot.data_gen.generate_config import GenerateConfig
from geopilot.data_gen.llm import (
    EndpointRejected,
    EndpointUnavailable,
    LLMClientConfig,
    LLMRequest,
    OpenAIClient,
    load_prompts,
)
from geopilot.data_gen.loopback_server import Faults, LoopbackLLM
from geopilot.sample import load_samples

FAULTS = Faults(
    rate_limited=0.3, server_error=0.2, malformed_json=0.25, prose=0.2, out_of_range_box=0.5, retry_after_s=0.02
)


def config(tmp: Path, url: str, concurrency: int = 4, **extra) -> GenerateConfig:
    backend = {
        "kind": "openai",
        "url": url,
        "model": "loopback",
        "concurrency": concurrency,
        "backoff_base_s": 0.01,
        "backoff_max_s": 0.05,
    }
    backend.update(extra.pop("backend", {}))
    return GenerateConfig(
        sources=[{"reader": "fake", "root": str(tmp / "data")}], backend=backend, shard_size=4, **extra
    )


def shards(out: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(out.glob("shard-*.jsonl")))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture()
def readers(tmp_path):
    return fake_readers(all_records(tmp_path / "data"))


def test_faults_are_regenerated_or_retried_and_counted(tmp_path, readers):
    with LoopbackLLM(faults=FAULTS) as server:
        result = generate_dataset(config(tmp_path, server.url), tmp_path / "c4", readers=readers)
        served = dict(server.served)
    report = result.report
    for kind in ("rate_limited", "server_error", "malformed_json", "prose", "out_of_range_box"):
        assert served.get(kind, 0) > 0, f"the server injected no {kind}"
    # every 429/503 was retried by the client; every bad reply was regenerated once, with its cause
    assert report["http_retries_by_cause"] == {
        "rate_limited": served["rate_limited"],
        "server_error": served["server_error"],
    }
    regenerated = report["regeneration"]["regenerations_by_cause"]
    assert regenerated["malformed_json"] == served["malformed_json"]
    assert regenerated["prose"] == served["prose"]
    assert regenerated["coordinates"] == served["out_of_range_box"]
    assert report["dropped"] == 0 and report["kept"] == report["jobs"] == result.manifest["samples"]
    assert report["regeneration"]["samples_regenerated"] > 0 and report["regeneration"]["rate_pct"] > 0
    assert "| malformed_json |" in (tmp_path / "c4" / "report.md").read_text()
    for shard in result.manifest["shards"]:
        for sample in load_samples(tmp_path / "c4" / shard["path"]):
            assert "1.4" not in json.dumps(sample.messages[-1].value)  # the out-of-range box never reaches a sample
    # the same seed gives the same samples whatever the concurrency and completion order
    with LoopbackLLM(faults=FAULTS) as server:
        generate_dataset(config(tmp_path, server.url, concurrency=1), tmp_path / "c1", readers=readers)
    assert shards(tmp_path / "c1") == shards(tmp_path / "c4")


def test_unfixable_replies_are_dropped_with_their_reason(tmp_path, readers):
    with LoopbackLLM(faults=Faults(prose=1.0)) as server:
        result = generate_dataset(config(tmp_path, server.url, max_regenerations=0), tmp_path / "out", readers=readers)
    assert result.report["kept"] == 0 and result.report["dropped_by_reason"] == {"prose": result.report["jobs"]}
    meta = json.loads((tmp_path / "out" / "provenance" / "shard-00000.jsonl").read_text().splitlines()[0])
    assert meta["status"] == "dropped" and meta["drop_reason"] == "prose" and "not a JSON object" in meta["drop_detail"]


def _request() -> LLMRequest:
    prompt = load_prompts()["caption_dialogue"]
    facts = {"stage": "caption_dialogue", "sample_id": "x/1/general_understanding/0", "caption": "A harbour."}
    messages = prompt.render({"source": "SARLANG-1M", "facts": json.dumps(facts), "feedback": ""})
    return LLMRequest("caption_dialogue", messages, facts, 7, prompt.version)


def test_retry_after_is_respected(tmp_path):
    async def call(url: str):
        backend = OpenAIClient(
            LLMClientConfig(kind="openai", url=url, model="m", backoff_base_s=0.001, backoff_max_s=1.0)
        )
        try:
            start = time.perf_counter()
            text, info = await backend.complete(_request())
            return time.perf_counter() - start, text, info
        finally:
            await backend.aclose()

    with LoopbackLLM(faults=Faults(rate_limited=1.0, retry_after_s=0.4)) as server:
        seconds, text, info = asyncio.run(call(server.url))
    assert dict(info.retries) == {"rate_limited": 1} and seconds >= 0.4
    assert json.loads(text)["query"]


def test_unreachable_endpoint_fails_after_retries_with_a_clear_message():
    async def call():
        backend = OpenAIClient(
            LLMClientConfig(kind="openai", url=f"http://127.0.0.1:{free_port()}/v1", max_retries=2, backoff_base_s=0.01)
        )
        try:
            await backend.complete(_request())
        finally:
            await backend.aclose()

    with pytest.raises(EndpointUnavailable, match=r"failed 3 times in a row \(last: ClientConnectorError"):
        asyncio.run(call())


def test_a_4xx_is_not_retried():
    calls = []

    class Unauthorised(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's hook name
            calls.append(self.path)
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(401)
            self.end_headers()
            self.wfile.write(b'{"error": "bad api key"}')

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Unauthorised)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    async def call():
        backend = OpenAIClient(
            LLMClientConfig(kind="openai", url=f"http://127.0.0.1:{server.server_address[1]}/v1", max_retries=3)
        )
        try:
            await backend.complete(_request())
        finally:
            await backend.aclose()

    try:
        with pytest.raises(EndpointRejected, match="HTTP 401.*check url, model and api key"):
            asyncio.run(call())
    finally:
        server.shutdown()
    assert calls == ["/v1/chat/completions"]


def test_endpoint_down_stops_clearly_keeps_work_and_resumes(tmp_path, readers, capsys):
    reference = tmp_path / "reference"
    with LoopbackLLM() as server:
        generate_dataset(config(tmp_path, server.url), reference, readers=readers)
    out = tmp_path / "out"
    with LoopbackLLM(faults=Faults(down_after=12)) as server:
        with pytest.raises(EndpointUnavailable, match="failed 3 times in a row .*HTTP 503.*rerun the same command"):
            generate_dataset(config(tmp_path, server.url, backend={"max_retries": 2}), out, readers=readers)
    manifest = json.loads((out / "manifest.json").read_text())
    assert not manifest["complete"] and 0 < manifest["samples"] and manifest["pending"] > 0
    assert "INCOMPLETE" in (out / "report.md").read_text()
    with LoopbackLLM() as server:
        result = generate_dataset(config(tmp_path, server.url), out, readers=readers)
    assert result.resumed > 0 and result.new > 0 and result.manifest["complete"]
    assert shards(out) == shards(reference)


def test_cli_exit_code_1_when_the_endpoint_is_down(tmp_path, capsys):
    data = tmp_path / "data" / "DOTA" / "train"
    (data / "images").mkdir(parents=True)
    (data / "labelTxt").mkdir()
    from PIL import Image

    Image.new("RGB", (100, 100)).save(data / "images" / "P0001.png")
    (data / "labelTxt" / "P0001.txt").write_text("10 10 40 10 40 30 10 30 plane 0\n")
    cfg = tmp_path / "cfg.yaml"
    url = f"http://127.0.0.1:{free_port()}/v1"
    cfg.write_text(
        f"sources: [{{reader: dota, root: {tmp_path / 'data' / 'DOTA'}}}]\n"
        f"backend: {{kind: openai, url: '{url}', max_retries: 1, backoff_base_s: 0.01}}\n"
    )
    assert cli_main(["generate", "--config", str(cfg), "--out", str(tmp_path / "out"), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("geopilot generate: error: LLM endpoint") and "failed 2 times" in err[0]


def test_cache_answers_a_rerun_without_the_endpoint(tmp_path, readers):
    out = tmp_path / "out"
    with LoopbackLLM() as server:
        first = generate_dataset(config(tmp_path, server.url), out, readers=readers)
    before = shards(out)
    for path in [*out.glob("shard-*.jsonl"), out / "manifest.json"]:
        path.unlink()
    shutil.rmtree(out / "journal")
    result = generate_dataset(config(tmp_path, f"http://127.0.0.1:{free_port()}/v1"), out, readers=readers)
    assert result.report["cache_hits"] == first.report["jobs"] * 2 - 2  # two calls per tool sample, one per dialogue
    assert shards(out) == before


def test_retry_after_header_forms():
    from email.utils import formatdate

    from geopilot.data_gen.llm import parse_retry_after

    assert parse_retry_after("2") == 2.0 and parse_retry_after("0.25") == 0.25
    assert 8 <= parse_retry_after(formatdate(time.time() + 10, usegmt=True)) <= 10
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None


def test_cache_key_and_torn_cache_files(tmp_path):
    from geopilot.data_gen.llm import ResponseCache

    cache = ResponseCache(tmp_path)
    messages = [{"role": "user", "content": "hi"}]
    key = ResponseCache.key("m", messages, {"temperature": 0.7, "seed": 1})
    assert key != ResponseCache.key("m2", messages, {"temperature": 0.7, "seed": 1})
    assert key != ResponseCache.key("m", messages, {"temperature": 0.7, "seed": 2})
    cache.put(key, '{"a": 1}')
    assert cache.get(key) == '{"a": 1}'
    next(tmp_path.rglob("*.json")).write_text('{"cont')  # torn
    assert cache.get(key) is None


def test_prompt_versions_follow_file_content(tmp_path):
    from geopilot.data_gen.llm import PROMPT_NAMES, PROMPTS_DIR

    for name in PROMPT_NAMES:
        shutil.copy(PROMPTS_DIR / f"{name}.txt", tmp_path / f"{name}.txt")
    same = load_prompts(tmp_path)
    assert {n: p.version for n, p in same.items()} == {n: p.version for n, p in load_prompts().items()}
    (tmp_path / "answer.txt").write_text((tmp_path / "answer.txt").read_text() + "\nBe concise.\n")
    changed = load_prompts(tmp_path)
    assert changed["answer"].version != same["answer"].version and changed["plan"].version == same["plan"].version


def test_the_client_settings_live_once_in_llm_client_config():
    settings = LLMClientConfig(kind="openai", url="http://127.0.0.1:9/v1", concurrency=3, temperature=0.1)
    client = OpenAIClient(settings)
    assert (client.concurrency, client.max_retries, client.timeout_s) == (3, 5, 60.0)
    assert client.params == {"temperature": 0.1, "max_tokens": 1024, "json_mode": True}
    base = GenerateConfig(sources=[{"reader": "dota", "root": "x"}])
    run_only = {"url": "http://h/v1", "concurrency": 64, "max_retries": 0, "timeout_s": 5.0, "cache": False}
    run_only |= {"backoff_base_s": 2.0, "backoff_max_s": 3.0, "api_key_env": "KEY"}
    assert set(run_only) == set(LLMClientConfig.run_only_keys())
    faster = base.model_copy(update={"backend": base.backend.model_copy(update=run_only)})
    assert faster.content_hash() == base.content_hash()  # where and how fast: not what a sample holds
    other = base.model_copy(update={"backend": base.backend.model_copy(update={"temperature": 0.2})})
    assert other.content_hash() != base.content_hash()
