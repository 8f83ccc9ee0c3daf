"""`geopilot serve` / `python serve.py` (the same code): GeoPilot's OpenAI-compatible API and web demo, or, with
`--controller`, a FastChat worker.

    geopilot serve --model DIR [--host 127.0.0.1] [--port 8000] [--api-key KEY | env GEOPILOT_API_KEY]
                   [--tools configs/tools.yaml] [--max-batch N] [--batch-wait-ms MS] [--controller URL]
                   [--engine-url URL] [--allow-unknown-tools] [--prefix-cache N] [--prefix-cache-ttl S]

`--engine-url` generates the LLM turns on an OpenAI-compatible server (vLLM serving DIR) while the tools run
here. Without an API key the server only binds to loopback. Bad arguments exit 2 with one line.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from geopilot.argtypes import add_tools_config_argument, finite_float, port
from geopilot.errors import GeoPilotInputError
from geopilot.network import API_KEY_ENV, is_loopback, server_api_key

MIB = 2**20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model directory (llava-hf layout, e.g. a training export)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=port, default=8000, help="port to bind")
    parser.add_argument(
        "--api-key", default=None, help="required on every route but /health (default: env GEOPILOT_API_KEY)"
    )
    add_tools_config_argument(parser, old_names=("--tools",))
    parser.add_argument("--max-batch", type=int, default=8, help="requests per batched chat (1: no batching)")
    parser.add_argument(
        "--batch-wait-ms",
        type=finite_float(0.0, low_open=False),
        default=10.0,
        help="how long a request waits for a batch",
    )
    parser.add_argument("--controller", default=None, help="run as a FastChat worker registered with this controller")
    parser.add_argument("--engine-url", default=None, help="OpenAI-compatible server for the LLM turns (e.g. vLLM /v1)")
    parser.add_argument("--max-concurrency", type=int, default=64, help="requests admitted at once; more get 503")
    parser.add_argument(
        "--request-timeout", type=finite_float(0.0), default=300.0, help="seconds per request (then 504)"
    )
    parser.add_argument("--tool-timeout", type=finite_float(0.0), default=60.0, help="seconds per tool call")
    parser.add_argument(
        "--max-body-mb", type=finite_float(0.0, 4096.0), default=20.0, help="request body limit (then 413)"
    )
    parser.add_argument("--max-image-pixels", type=int, default=40_000_000, help="image size limit (then 413)")
    parser.add_argument(
        "--allow-url-host",
        action="append",
        default=[],
        metavar="HOST",
        help="fetch http(s) image URLs from this host / IP / CIDR (repeatable; default: none)",
    )
    parser.add_argument("--url-timeout", type=float, default=10.0, help="seconds for a whole image URL fetch")
    parser.add_argument(
        "--max-text-chars", type=int, default=100_000, help="characters of text per request (then 400, untokenised)"
    )
    parser.add_argument("--max-rounds", type=int, default=1, help="tool rounds per request")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="per generated turn")
    parser.add_argument(
        "--allow-unknown-tools",
        action="store_true",
        help="accept client tools the model was not trained on (their schemas go into the system prompt)",
    )
    parser.add_argument(
        "--prefix-cache", type=int, default=8, help="think turns kept for client-run tools' answers (0: none)"
    )
    parser.add_argument(
        "--prefix-cache-ttl", type=finite_float(0.0), default=120.0, help="seconds a kept think turn waits"
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, ...")
    parser.add_argument(
        "--dtype", choices=["float32", "bfloat16", "float16"], default=None, help="model dtype (default: as saved)"
    )


def build_config(args: argparse.Namespace):
    from pydantic import ValidationError

    from geopilot.errors import describe_validation_error
    from geopilot.serving.config import ServeConfig

    if args.controller is None:
        key = server_api_key("serve", args.host, args.api_key)
    else:  # a FastChat worker: the controller in front of it is what clients reach
        key = args.api_key or os.environ.get(API_KEY_ENV) or None
    try:
        return ServeConfig(
            model_name=Path(args.model).name or str(args.model),
            api_key=key,
            host=args.host,
            max_batch=args.max_batch,
            batch_wait_ms=args.batch_wait_ms,
            max_concurrency=args.max_concurrency,
            request_timeout_s=args.request_timeout,
            tool_timeout_s=args.tool_timeout,
            max_body_bytes=int(args.max_body_mb * MIB),
            max_image_pixels=args.max_image_pixels,
            allowed_url_hosts=args.allow_url_host,
            url_timeout_s=args.url_timeout,
            max_text_chars=args.max_text_chars,
            max_rounds=args.max_rounds,
            max_new_tokens=args.max_new_tokens,
            allow_unknown_tools=args.allow_unknown_tools,
            prefix_cache_entries=args.prefix_cache,
            prefix_cache_ttl_s=args.prefix_cache_ttl,
        )
    except ValidationError as err:
        raise GeoPilotInputError(describe_validation_error(err, source="serve")) from None


def build_pilot(args: argparse.Namespace, config):
    from geopilot.agent import GeoPilot

    if args.engine_url:
        return GeoPilot.from_endpoint(
            args.engine_url,
            args.model,
            tools_config=args.tools_config,
            tool_timeout_s=config.tool_timeout_s,
            max_pixels=config.max_image_pixels,
        )
    if not Path(args.model).is_dir():
        raise GeoPilotInputError(f"model directory not found: {args.model}")
    from geopilot.agent import PrefixCache

    entries = config.prefix_cache_entries
    return GeoPilot.from_pretrained(
        args.model,
        device=args.device,
        dtype=args.dtype,
        tools_config=args.tools_config,
        tool_timeout_s=config.tool_timeout_s,
        max_pixels=config.max_image_pixels,
        prefix_cache=PrefixCache(entries, config.prefix_cache_ttl_s) if entries else None,
    )


def startup_line(args: argparse.Namespace, config, tools) -> str:
    """What is being served, where, behind which key, with which tools and whether their weights are there."""
    from geopilot.tools.registry import binding_status

    ready = [name for name, binding in tools.tools.items() if binding_status(binding)[0] == "ready"]
    missing = [name for name in tools.tools if name not in ready]
    key = "API key required" if config.api_key else "no API key (loopback only)"
    engine = f", turns on {args.engine_url}" if args.engine_url else ""
    return (
        f"geopilot serve: {config.model_name} on http://{args.host}:{args.port} ({key}{engine}; demo: /demo); "
        f"tools ready: {', '.join(ready) or 'none'}"
        + (f"; weights missing: {', '.join(missing)} (geopilot weights check)" if missing else "")
    )


def run(args: argparse.Namespace) -> int:
    from geopilot.tools.registry import load_tools_config

    config = build_config(args)
    tools = load_tools_config(
        args.tools_config
    )  # a missing or bad tools YAML is this command's error, not every client's 400
    pilot = build_pilot(args, config)
    if args.controller:
        from geopilot.serving.worker import serve_worker

        if not is_loopback(args.host):
            print(
                "geopilot serve: warning: the FastChat worker protocol has no authentication; keep "
                f"{args.host}:{args.port} off public networks",
                file=sys.stderr,
            )
        serve_worker(pilot, config, args.controller, args.host, args.port)
        return 0
    import uvicorn

    from geopilot.serving.api import create_app

    print(startup_line(args, config, tools), file=sys.stderr, flush=True)
    uvicorn.run(create_app(pilot, config), host=args.host, port=args.port, log_level="warning")
    return 0
