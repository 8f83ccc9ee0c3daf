"""LLM clients for trace generation behind one small interface: `await client.complete(request) -> (text, CallInfo)`.

- `OpenAIClient`: any OpenAI-compatible `/v1/chat/completions` endpoint (Gemini, vLLM, FastChat) over aiohttp,
  with bounded concurrency (an asyncio semaphore), retries with exponential backoff + jitter on 429 / 5xx /
  timeouts / refused connections (Retry-After respected), and an on-disk response cache keyed by
  (model, prompt hash, params). After the last retry it raises `EndpointUnavailable` with a clear message.
- `geopilot.data_gen.templates.TemplateClient`: the offline client (no LLM at all), same interface.

Prompts are files in `data_gen/prompts/`, versioned by the hash of their content (recorded in every sample's
provenance and in the manifest). Every request carries the structured facts its prompt was rendered from, so
the template client (and a loopback test server) can answer the same request without an LLM.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Literal, Protocol

from pydantic import Field, model_validator

from geopilot.config import StrictConfig
from geopilot.errors import ConfigError, GeoPilotError
from geopilot.fileio import atomic_write

PROMPTS_DIR = Path(__file__).parent / "prompts"
PROMPT_NAMES = ("plan", "answer", "reasoning", "caption_dialogue")
USER_MARKER = "=== user ==="
FACTS_PREFIX = "FACTS: "  # the prompt line that carries the request's facts as one line of JSON


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class PromptFile:
    """One versioned prompt: a system part and a user part with `$name` placeholders."""

    name: str
    system: str
    user: str
    version: str  # hash of the file's content

    def render(self, values: dict[str, str]) -> list[dict[str, str]]:
        try:
            system = Template(self.system).substitute(values)
            user = Template(self.user).substitute(values)
        except KeyError as err:
            raise ConfigError(f"prompt {self.name!r} needs a value for ${err.args[0]}") from None
        return [{"role": "system", "content": system.strip()}, {"role": "user", "content": user.strip()}]


def load_prompts(directory: Path = PROMPTS_DIR) -> dict[str, PromptFile]:
    prompts = {}
    for name in PROMPT_NAMES:
        path = Path(directory) / f"{name}.txt"
        if not path.is_file():
            raise ConfigError(f"prompt file missing: {path}")
        text = path.read_text(encoding="utf-8")
        system, marker, user = text.partition(USER_MARKER)
        if not marker:
            raise ConfigError(f"{path}: needs a line {USER_MARKER!r} between the system and the user part")
        prompts[name] = PromptFile(name, system, user, content_hash(text))
    return prompts


@dataclass(frozen=True)
class LLMRequest:
    stage: str  # the prompt name: plan | answer | reasoning | caption_dialogue
    messages: list[dict[str, str]]
    facts: dict  # the structured inputs the prompt was rendered from
    seed: int
    prompt_version: str


@dataclass
class CallInfo:
    """What one completion cost: retries by cause, and whether the cache answered it."""

    retries: Counter = field(default_factory=Counter)
    cached: bool = False
    seconds: float = 0.0


class LLMClient(Protocol):
    name: str  # "template" | "openai"
    model: str
    concurrency: int

    async def complete(self, request: LLMRequest) -> tuple[str, CallInfo]: ...

    async def aclose(self) -> None: ...


class EndpointUnavailable(GeoPilotError):
    """The endpoint kept failing (down, unreachable, rate-limited or erroring) through every retry."""


class EndpointRejected(GeoPilotError):
    """The endpoint refused the request itself (a 4xx other than 429): retrying cannot help."""


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds (delta-seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class ResponseCache:
    """One JSON file per response, written atomically; the key covers model, prompt hash and sampling params."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)

    @staticmethod
    def key(model: str, messages: list[dict], params: dict) -> str:
        prompt_hash = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()
        return hashlib.sha256(json.dumps([model, prompt_hash, params], sort_keys=True).encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> str | None:
        path = self._path(key)
        try:
            return json.loads(path.read_text(encoding="utf-8"))["content"]
        except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError):
            return None  # a torn or foreign file is a miss, not an error

    def put(self, key: str, content: str) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps({"content": content}))


RUN_ONLY = {"run_only": True}  # a setting that may change between a run and its resumption (a new port, more speed)


class LLMClientConfig(StrictConfig):
    """The LLM client of `geopilot generate` (config key `backend`): each setting, its default and bounds, once."""

    kind: Literal["template", "openai"] = Field(
        "template", description="template: offline template answers; openai: an OpenAI-compatible endpoint"
    )
    url: str | None = Field(
        None,
        description="OpenAI-compatible API base, e.g. http://127.0.0.1:8000/v1 (kind: openai)",
        json_schema_extra=RUN_ONLY,
    )
    model: str = Field("gemini-2.5-flash", description="the model the endpoint serves")
    api_key_env: str | None = Field(
        None, description="name of the environment variable holding the API key", json_schema_extra=RUN_ONLY
    )
    concurrency: int = Field(8, ge=1, le=1024, description="requests in flight at once", json_schema_extra=RUN_ONLY)
    max_retries: int = Field(
        5, ge=0, description="per request, on 429 / 5xx / timeouts / refused connections", json_schema_extra=RUN_ONLY
    )
    timeout_s: float = Field(60.0, gt=0, description="seconds per attempt", json_schema_extra=RUN_ONLY)
    backoff_base_s: float = Field(0.5, ge=0, description="first retry delay (doubling)", json_schema_extra=RUN_ONLY)
    backoff_max_s: float = Field(30.0, ge=0, description="longest retry delay", json_schema_extra=RUN_ONLY)
    temperature: float = Field(0.7, ge=0, description="sampling temperature")
    max_tokens: int = Field(1024, ge=16, description="reply length limit")
    json_mode: bool = Field(True, description='send response_format={"type": "json_object"}')
    cache: bool = Field(True, description="on-disk response cache under <out>/llm_cache", json_schema_extra=RUN_ONLY)

    @model_validator(mode="after")
    def _openai_needs_a_url(self) -> LLMClientConfig:
        if self.kind == "openai" and not self.url:
            raise ValueError("url is required for kind: openai")
        return self

    @classmethod
    def run_only_keys(cls) -> list[str]:
        """Settings that decide where and how fast replies are fetched, never what a sample holds."""
        return [name for name, info in cls.model_fields.items() if info.json_schema_extra == RUN_ONLY]


class OpenAIClient:
    """An OpenAI-compatible chat endpoint. `url` is the API base (e.g. `http://127.0.0.1:8000/v1`).

    The client is aiohttp: at 32 requests in flight httpx 0.28 spent 9-10 s of CPU in its connection pool for 256
    loopback requests that aiohttp served in 2.1-2.3 s (200 ms latency each; 1.6 s is the floor), and the shared
    openai SDK client (`geopilot.llm_client`) took 1.38x (aiohttp transport) / 1.58x (httpx2) this client's time
    (benchmarks/llm_client_throughput.py, docs/benchmarks.md): over issue 25's 20 % limit, so it stays.
    """

    name = "openai"

    def __init__(self, settings: LLMClientConfig, api_key: str | None = None, cache_dir: Path | None = None):
        if not settings.url:
            raise ConfigError("the openai LLM client needs backend.url (an OpenAI-compatible API base)")
        base = settings.url.rstrip("/")
        self.endpoint = base if base.endswith("/chat/completions") else base + "/chat/completions"
        self.model, self.concurrency, self.max_retries = settings.model, settings.concurrency, settings.max_retries
        self.params = {
            "temperature": settings.temperature,
            "max_tokens": settings.max_tokens,
            "json_mode": settings.json_mode,
        }
        self.backoff_base_s, self.backoff_max_s = settings.backoff_base_s, settings.backoff_max_s
        self.timeout_s = settings.timeout_s
        self.cache = ResponseCache(cache_dir) if cache_dir is not None else None
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session = None  # created inside the running event loop, as aiohttp requires
        self._semaphore = asyncio.Semaphore(self.concurrency)
        self._jitter = random.Random()  # timing only; never affects content

    def _client(self):
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                connector=aiohttp.TCPConnector(limit=self.concurrency),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _body(self, request: LLMRequest) -> dict:
        body = {
            "model": self.model,
            "messages": request.messages,
            "temperature": self.params["temperature"],
            "max_tokens": self.params["max_tokens"],
            "seed": request.seed,
        }
        if self.params["json_mode"]:
            body["response_format"] = {"type": "json_object"}
        return body

    def _backoff(self, attempt: int) -> float:
        """Exponential backoff with jitter in [cap/2, cap]."""
        cap = min(self.backoff_max_s, self.backoff_base_s * 2**attempt)
        return cap * (0.5 + 0.5 * self._jitter.random())

    async def complete(self, request: LLMRequest) -> tuple[str, CallInfo]:
        info = CallInfo()
        key = None
        if self.cache is not None:
            key = ResponseCache.key(self.model, request.messages, {**self.params, "seed": request.seed})
            cached = self.cache.get(key)
            if cached is not None:
                info.cached = True
                return cached, info
        start = time.perf_counter()
        text = await self._post_with_retries(self._body(request), info)
        info.seconds = time.perf_counter() - start
        if self.cache is not None:
            self.cache.put(key, text)
        return text, info

    async def _post_once(self, body: dict) -> tuple[int, dict, str]:
        async with self._semaphore:
            async with self._client().post(self.endpoint, json=body) as response:
                return response.status, dict(response.headers), await response.text()

    async def _post_with_retries(self, body: dict, info: CallInfo) -> str:
        import aiohttp

        for attempt in range(self.max_retries + 1):
            retry_after = None
            try:
                status, headers, text = await self._post_once(body)
            except asyncio.TimeoutError:
                cause, detail = "timeout", f"no answer within {self.timeout_s:g} s"
            except aiohttp.ClientError as err:  # refused, reset, DNS: the endpoint is down or unreachable
                cause, detail = "connect_error", f"{type(err).__name__}: {err}"
            else:
                if status == 200:
                    content = _message_content(text)
                    if content is not None:
                        return content
                    cause, detail = "bad_response", "HTTP 200 whose body has no choices[0].message"
                elif status == 429:
                    cause, detail = "rate_limited", "HTTP 429 Too Many Requests"
                    retry_after = parse_retry_after(headers.get("Retry-After"))
                elif status >= 500:
                    cause, detail = "server_error", f"HTTP {status}"
                else:
                    raise EndpointRejected(
                        f"LLM endpoint {self.endpoint} rejected the request with HTTP {status}: {text[:200]!r} "
                        "(check url, model and api key)"
                    )
            info.retries[cause] += 1
            if attempt == self.max_retries:
                raise EndpointUnavailable(
                    f"LLM endpoint {self.endpoint} failed {attempt + 1} times in a row (last: {detail}); "
                    "the samples done so far are kept -- rerun the same command to resume"
                )
            delay = self._backoff(attempt)
            if retry_after is not None:
                delay = max(delay, min(retry_after, self.backoff_max_s * 4))
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")


def _message_content(text: str) -> str | None:
    """The reply text; None for a body that is not a chat completion at all. A null content (a refusal or a
    safety block) is an empty reply: that sample is regenerated, the run goes on."""
    try:
        message = json.loads(text)["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) else ""


def facts_from_messages(messages: list[dict]) -> dict | None:
    """The facts a prompt carries (its `FACTS: {...}` line): what a loopback test server answers from."""
    for message in reversed(messages):
        for line in message.get("content", "").splitlines():
            if line.startswith(FACTS_PREFIX):
                try:
                    return json.loads(line[len(FACTS_PREFIX) :])
                except json.JSONDecodeError:
                    return None
    return None
