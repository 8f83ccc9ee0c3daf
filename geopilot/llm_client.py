"""The one client for OpenAI-compatible servers (vLLM, `geopilot serve`, FastChat, hosted APIs): the `openai` SDK,
configured here and nowhere else. `GeoPilot.from_endpoint` (geopilot/agent/http_engine.py), the eval `openai`
agent and data_gen's LLM client all build their clients with these functions (a test checks that no other
module constructs an HTTP client for those calls).

    client = sync_client("http://127.0.0.1:8001/v1", api_key=None, timeout_s=300, max_retries=2)
    reply = client.chat.completions.create(model=..., messages=[...])

What the SDK does for every caller: retries of connection errors, timeouts, 408/409/429/5xx with exponential
backoff and the server's `Retry-After` (honoured up to 120 s), per-request timeouts, SSE streaming, and one error
type per status (`openai.BadRequestError`, `RateLimitError`, `APITimeoutError`, ...). `transport="aiohttp"` runs
the async client on aiohttp (`openai[aiohttp]`) instead of httpx2.
"""

from __future__ import annotations

from typing import Literal

NO_KEY = "none"  # the SDK needs some key; a server without one ignores the header
Transport = Literal["httpx", "aiohttp"]
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_RETRIES = 2


def _key(api_key: str | None) -> str:
    return api_key or NO_KEY


def sync_client(
    base_url: str,
    api_key: str | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_retries: int = DEFAULT_RETRIES,
):
    """An `openai.OpenAI` for `base_url` (the API root, e.g. `http://host:8001/v1`)."""
    from openai import OpenAI

    return OpenAI(base_url=base_url.rstrip("/"), api_key=_key(api_key), timeout=timeout_s, max_retries=max_retries)


def async_client(
    base_url: str,
    api_key: str | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_retries: int = DEFAULT_RETRIES,
    transport: Transport = "httpx",
    connections: int | None = None,
):
    """An `openai.AsyncOpenAI` for `base_url`; `connections` bounds the pool (None: the SDK's default)."""
    from openai import AsyncOpenAI

    http_client = None
    if transport == "aiohttp":
        from openai import DefaultAioHttpClient

        http_client = DefaultAioHttpClient(**_limits(connections))
    elif connections is not None:
        from openai import DefaultAsyncHttpxClient

        http_client = DefaultAsyncHttpxClient(**_limits(connections))
    return AsyncOpenAI(
        base_url=base_url.rstrip("/"),
        api_key=_key(api_key),
        timeout=timeout_s,
        max_retries=max_retries,
        http_client=http_client,
    )


def _limits(connections: int | None) -> dict:
    if connections is None:
        return {}
    import httpx2

    return {"limits": httpx2.Limits(max_connections=connections, max_keepalive_connections=connections)}


def describe(err: Exception) -> str:
    """One line for an SDK error: the status and the server's message, or what failed on the way."""
    from openai import APIStatusError

    if isinstance(err, APIStatusError):
        return f"HTTP {err.status_code}: {str(err.message)[:300]}"
    return f"{type(err).__name__}: {err}"
