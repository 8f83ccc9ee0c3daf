"""`ServeConfig`: every limit the server enforces, typed; `geopilot serve` flags fill it."""

from __future__ import annotations

from pydantic import Field

from geopilot.config import StrictConfig


class ServeConfig(StrictConfig):
    model_name: str  # what clients put in "model" (the model directory's name)
    api_key: str | None = None  # None: no key (only allowed on loopback; `geopilot serve` enforces it)
    host: str = "127.0.0.1"  # the bind address; a keyless server answers only to loopback Host headers and this one
    max_batch: int = Field(8, ge=1)  # requests per chat_batch
    batch_wait_ms: float = Field(10.0, ge=0)  # how long the first request of a batch waits for company
    max_concurrency: int = Field(64, ge=1)  # requests admitted at once (running + queued); more get 503
    request_timeout_s: float = Field(300.0, gt=0)  # a request still unanswered after this gets 504
    tool_timeout_s: float = Field(60.0, gt=0)  # per tool call; a hanging tool becomes a recorded timeout
    max_body_bytes: int = Field(20 * 2**20, ge=1024)  # request body; more gets 413 (before it is read whole)
    max_image_pixels: int = Field(40_000_000, ge=1)  # decoded image size; more gets 413 (checked from the header)
    allowed_url_hosts: list[str] = []  # http(s) image URLs only from these hosts / IPs / CIDRs (empty: none)
    url_timeout_s: float = Field(10.0, gt=0)  # a whole image URL fetch (and always inside request_timeout_s)
    max_text_chars: int = Field(100_000, ge=1)  # text of all messages; more is refused before tokenising
    max_rounds: int = Field(1, ge=0)  # tool rounds per request unless the request asks for fewer
    max_new_tokens: int = Field(512, ge=1)  # per generated turn; a request's max_tokens may only lower it
    allow_unknown_tools: bool = False  # client-run tools the model was not trained on (schemas in the system prompt)
    prefix_cache_entries: int = Field(8, ge=0)  # think turns kept for client-run tools' answers (0: none)
    prefix_cache_ttl_s: float = Field(120.0, gt=0)  # how long one is kept for a client that does not come back
