"""`ServeConfig`: every limit the server enforces, typed; `geopilot serve` derives its flags from these fields
(`geopilot.config.add_config_flags`), so each default and help text lives here once."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from geopilot.config import StrictConfig
from geopilot.sample import DEFAULT_MAX_IMAGES

MIB = 2**20


class ServeConfig(StrictConfig):
    model_name: str = Field(description='what clients put in "model" (the model directory\'s name)')
    api_key: str | None = Field(None, description="None: no key (only allowed on loopback; `geopilot serve` checks)")
    host: str = Field(
        "127.0.0.1",
        description="address to bind; a keyless server answers only to loopback Host headers and this one",
    )
    max_batch: int = Field(8, ge=1, description="requests decoded together (1: no batching)")
    scheduler: Literal["step", "static"] = Field(
        "step",  # it beat static 2.2x on serve_load --mixed (docs/serving.md); static where step cannot drive
        description="step: requests join and leave the batch at every decoding step; static: per wait window",
    )
    kv_budget_tokens: int = Field(
        0, ge=0, description="KV cache tokens the running requests may hold (step scheduler; 0: from free memory)"
    )
    batch_wait_ms: float = Field(10.0, ge=0, description="how long the first request of a batch waits for company")
    max_concurrency: int = Field(64, ge=1, description="requests admitted at once (running + queued); more get 503")
    request_timeout_s: float = Field(300.0, gt=0, description="seconds per request (then 504)")
    tool_timeout_s: float = Field(60.0, gt=0, description="seconds per tool call (then a recorded timeout)")
    max_body_bytes: int = Field(
        20 * MIB, ge=1024, le=4096 * MIB, description="request body limit (then 413, before it is read whole)"
    )
    max_image_pixels: int = Field(40_000_000, ge=1, description="decoded image size limit (then 413, from the header)")
    max_images: int = Field(
        DEFAULT_MAX_IMAGES, ge=1, description="images per conversation (before, after, ...; then 400)"
    )
    allowed_url_hosts: list[str] = Field(
        [], description="fetch http(s) image URLs from this host / IP / CIDR (repeatable; default: none)"
    )
    url_timeout_s: float = Field(10.0, gt=0, description="seconds for a whole image URL fetch (within the request's)")
    max_text_chars: int = Field(100_000, ge=1, description="characters of text per request (then 400, untokenised)")
    max_rounds: int = Field(1, ge=0, description="tool rounds per request unless the request asks for fewer")
    max_new_tokens: int = Field(512, ge=1, description="per generated turn; a request's max_tokens may only lower it")
    allow_unknown_tools: bool = Field(
        False, description="accept client tools the model was not trained on (their schemas go into the system prompt)"
    )
    unconstrained_plans: bool = Field(
        False, description="decode think turns freely instead of in the plan grammar (an ablation; docs/serving.md)"
    )
    prefix_cache_entries: int = Field(8, ge=0, description="think turns kept for client-run tools' answers (0: none)")
    prefix_cache_ttl_s: float = Field(120.0, gt=0, description="seconds a kept think turn waits for its client")
