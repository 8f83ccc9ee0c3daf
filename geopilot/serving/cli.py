"""`geopilot serve` / `python serve.py` (the same code): GeoPilot's OpenAI-compatible API and web demo, or, with
`--controller`, a FastChat worker.

    geopilot serve --model DIR [--host 127.0.0.1] [--port 8000] [--api-key KEY | env GEOPILOT_API_KEY]
                   [--tools configs/tools.yaml] [--max-batch N] [--batch-wait-ms MS] [--controller URL]
                   [--scheduler step|static] [--kv-budget-tokens N]
                   [--engine-url URL] [--allow-unknown-tools] [--prefix-cache N] [--prefix-cache-ttl S]
                   [--examples DIR]

`--engine-url` generates the LLM turns on an OpenAI-compatible server (vLLM serving DIR) while the tools run
here. Without an API key the server only binds to loopback. Bad arguments exit 2 with one line.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from geopilot.argtypes import add_tools_config_argument, port
from geopilot.config import Flag, add_config_flags, config_from_flags
from geopilot.errors import GeoPilotInputError
from geopilot.families import FAMILIES
from geopilot.network import API_KEY_ENV, is_loopback, server_api_key
from geopilot.serving.config import MIB, ServeConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "images"

# `geopilot serve` flags that set a ServeConfig field: name, type, default and help come from the field.
SERVE_FLAGS = {
    "host": Flag("--host"),
    "max_batch": Flag("--max-batch"),
    "batch_wait_ms": Flag("--batch-wait-ms"),
    "scheduler": Flag("--scheduler"),
    "kv_budget_tokens": Flag("--kv-budget-tokens"),
    "max_concurrency": Flag("--max-concurrency"),
    "request_timeout_s": Flag("--request-timeout"),
    "tool_timeout_s": Flag("--tool-timeout"),
    "max_body_bytes": Flag("--max-body-mb", unit=MIB),
    "max_image_pixels": Flag("--max-image-pixels"),
    "max_images": Flag("--max-images"),
    "allowed_url_hosts": Flag("--allow-url-host", metavar="HOST"),
    "url_timeout_s": Flag("--url-timeout"),
    "max_text_chars": Flag("--max-text-chars"),
    "max_rounds": Flag("--max-rounds"),
    "max_new_tokens": Flag("--max-new-tokens"),
    "allow_unknown_tools": Flag("--allow-unknown-tools"),
    "unconstrained_plans": Flag("--unconstrained-plans"),
    "prefix_cache_entries": Flag("--prefix-cache"),
    "prefix_cache_ttl_s": Flag("--prefix-cache-ttl"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model directory (llava-hf layout, e.g. a training export)")
    parser.add_argument("--port", type=port, default=8000, help="port to bind")
    parser.add_argument(
        "--api-key", default=None, help="required on every route but /health (default: env GEOPILOT_API_KEY)"
    )
    add_tools_config_argument(parser, old_names=("--tools",))
    parser.add_argument("--controller", default=None, help="run as a FastChat worker registered with this controller")
    parser.add_argument("--engine-url", default=None, help="OpenAI-compatible server for the LLM turns (e.g. vLLM /v1)")
    parser.add_argument(
        "--model-family",
        choices=list(FAMILIES),
        default=None,
        help="the model's family (docs/models.md); default: read from the model folder's config.json",
    )
    parser.add_argument(
        "--examples",
        type=Path,
        default=EXAMPLES,
        help="folder of example images the web demo offers (default: the source checkout's examples/images)",
    )
    add_config_flags(parser, ServeConfig, SERVE_FLAGS)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, ...")
    parser.add_argument(
        "--dtype", choices=["float32", "bfloat16", "float16"], default=None, help="model dtype (default: as saved)"
    )


def build_config(args: argparse.Namespace) -> ServeConfig:
    from pydantic import ValidationError

    from geopilot.errors import describe_validation_error

    if args.controller is None:
        key = server_api_key("serve", args.host, args.api_key)
    else:  # a FastChat worker: the controller in front of it is what clients reach
        key = args.api_key or os.environ.get(API_KEY_ENV) or None
    try:
        return ServeConfig(
            model_name=Path(args.model).name or str(args.model), api_key=key, **config_from_flags(args, SERVE_FLAGS)
        )
    except ValidationError as err:
        raise GeoPilotInputError(describe_validation_error(err, source="serve")) from None


def build_pilot(args: argparse.Namespace, config):
    from geopilot.agent import GeoPilot

    if args.engine_url:
        return GeoPilot.from_endpoint(
            args.engine_url,
            args.model,
            family=args.model_family,
            tools_config=args.tools_config,
            tool_timeout_s=config.tool_timeout_s,
            max_pixels=config.max_image_pixels,
            max_images=config.max_images,
            constrain_plans=not config.unconstrained_plans,
        )
    if not Path(args.model).is_dir():
        raise GeoPilotInputError(f"model directory not found: {args.model}")
    from geopilot.agent import PrefixCache
    from geopilot.families import family_of_dir

    if args.model_family and (Path(args.model) / "config.json").is_file():
        found = family_of_dir(args.model).NAME
        if found != args.model_family:
            raise GeoPilotInputError(f"{args.model} is a {found} model, not --model-family {args.model_family}")
    entries = config.prefix_cache_entries
    return GeoPilot.from_pretrained(
        args.model,
        device=args.device,
        dtype=args.dtype,
        tools_config=args.tools_config,
        tool_timeout_s=config.tool_timeout_s,
        max_pixels=config.max_image_pixels,
        max_images=config.max_images,
        prefix_cache=PrefixCache(entries, config.prefix_cache_ttl_s) if entries else None,
        constrain_plans=not config.unconstrained_plans,
    )


def tools_line(tools, source: str | None = None) -> str:
    """Which tools are ready and which lack their weights (the demo shows it too)."""
    from geopilot.tools.registry import binding_status

    ready = [name for name, binding in tools.tools.items() if binding_status(binding)[0] == "ready"]
    missing = [name for name in tools.tools if name not in ready]
    return (
        (f"tools config {source}: " if source else "")
        + f"tools ready: {', '.join(ready) or 'none'}"
        + (f"; weights missing: {', '.join(missing)} (geopilot weights check)" if missing else "")
    )


def startup_line(args: argparse.Namespace, config, tools) -> str:
    """What is being served, where, behind which key, with which tools and whether their weights are there."""
    key = "API key required" if config.api_key else "no API key (loopback only)"
    engine = f", turns on {args.engine_url}" if args.engine_url else ""
    return f"geopilot serve: {config.model_name} on http://{args.host}:{args.port} ({key}{engine}; demo: /demo); " + (
        tools_line(tools)
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
    from geopilot.serving.web import example_images

    print(startup_line(args, config, tools), file=sys.stderr, flush=True)
    app = create_app(
        pilot, config, tools_line=tools_line(tools, args.tools_config), examples=example_images(args.examples)
    )
    # open demo tabs keep a heartbeat stream: Ctrl-C waits 5 s for them, not forever
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5)
    return 0
