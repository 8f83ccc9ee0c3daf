"""One client library for OpenAI-compatible calls. `geopilot/llm_client.py` builds every `openai`
SDK client; the only other HTTP clients in the package are named here with the reason they are not it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONSTRUCTS = re.compile(
    r"httpx2?\.(Async)?Client\(|httpx2?\.(post|get|put|stream|request)\(|aiohttp\.ClientSession\(|"
    r"\b(Async)?OpenAI\(|requests\.(post|get|Session)\(|urlopen\(|http\.client\.HTTPS?Connection\("
)
ALLOWED = {
    "geopilot/llm_client.py": "the shared client",
    "geopilot/serving/security.py": "fetches image URLs of requests (not an OpenAI-compatible call)",
    "data_gen/llm.py": "kept on aiohttp: the SDK was 1.38x slower at 32 in flight (docs/benchmarks.md)",
}


def test_no_other_module_constructs_an_http_client():
    found = {}
    for folder in ("geopilot", "tools", "eval", "data_gen"):
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            if CONSTRUCTS.search(text):
                found[path.relative_to(REPO).as_posix()] = CONSTRUCTS.search(text).group(0)
    for name in ("train.py", "serve.py"):
        if CONSTRUCTS.search((REPO / name).read_text(encoding="utf-8")):
            found[name] = "?"
    assert set(found) == set(ALLOWED), {k: v for k, v in found.items() if k not in ALLOWED}


def test_the_endpoint_engine_and_the_eval_agent_use_the_shared_client():
    for path in ("geopilot/agent/http_engine.py", "eval/agents.py"):
        assert "from geopilot.llm_client import" in (REPO / path).read_text(encoding="utf-8"), path
