"""`geopilot mcp`: the task-level tool registry served over MCP (mcp 2.x low-level `Server`, tools capability only).

    geopilot mcp --transport stdio                        # for Claude Desktop / agent frameworks
    geopilot mcp --transport http --host 127.0.0.1 --port 8765     # streamable HTTP at http://HOST:PORT/mcp
    geopilot mcp --transport stdio device=cpu             # key=value overrides of configs/tools.yaml

Each MCP tool takes the registry tool's parameters plus `image` (a several-image tool, detect_changes: `images`, a
list of them in order): the image bytes in base64 (plain, or as a
`data:image/...;base64,` URI), or a path to a file under one of the `image_roots` of the tools config (none by
default: then only inline bytes are accepted). URLs are refused: the server never fetches anything. What a caller
may read is `geopilot.image_access.ImageAccessPolicy`; its refusals never say whether a path exists. Parameters are
checked by the ToolRegistry dispatcher (the same one inference uses, with its timeout that stops the work); any
failure comes back as a result with `is_error=True` and a one-line message naming the field. A success returns the
canonical ToolOutput as JSON text and as `structured_content`.

HTTP: `--api-key KEY` (or env GEOPILOT_API_KEY) makes every request carry `Authorization: Bearer KEY` (401
otherwise). Binding a host that is not loopback prints a warning and needs a key: without one the server refuses
to start (exit 2). On any loopback address (127.0.0.0/8, ::1, localhost) the Host header must be a loopback name
or the bound address (421 otherwise) and an Origin must be one too (403), so a DNS-rebound page cannot drive it.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from typing import Any

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server

from geopilot.argtypes import add_tools_config_argument, port
from geopilot.config import add_override_arguments
from geopilot.errors import GeoPilotInputError
from geopilot.image_access import ARGUMENT, ImageAccessPolicy
from geopilot.network import API_KEY_ENV, BrowserGate, RequireApiKey, answered_host_names, server_api_key
from geopilot.sample import Action
from geopilot.tool_protocol import ToolRegistry, image_count
from geopilot.tool_result import ToolCallError

SERVER_NAME = "geopilot-tools"
IMAGE_ARGUMENT = ARGUMENT
IMAGE_SCHEMA = {
    "type": "string",
    "description": "the image: base64-encoded PNG/JPEG/TIFF/WebP bytes (optionally as a data:image/...;base64, URI), "
    "or a path to a file under the server's image roots, if it has any. URLs are refused. (Inside a GeoPilot chat "
    "the tools' `image` may name an earlier call's artefact as 'result:N'; an MCP call stands alone, so here it is "
    "the image itself.)",
}


IMAGES_ARGUMENT = "images"  # a several-image tool's images, in order (in a chat: 'input:K' names; here the images)


def input_schema(params_schema: dict[str, Any], image_count: int = 1) -> dict[str, Any]:
    """A registry tool's params schema with its `image` as the required MCP image argument (in a chat the param
    may be a `result:N` reference, which no stand-alone MCP call has); a tool that reads several images takes
    `images`, exactly `image_count` of them in order (detect_changes: before, after)."""
    schema = dict(params_schema)
    name = IMAGE_ARGUMENT if image_count == 1 else IMAGES_ARGUMENT
    argument = IMAGE_SCHEMA
    if image_count > 1:
        argument = {"type": "array", "items": IMAGE_SCHEMA, "minItems": image_count, "maxItems": image_count}
    params = {k: v for k, v in schema.get("properties", {}).items() if k not in (IMAGE_ARGUMENT, IMAGES_ARGUMENT)}
    schema["properties"] = {name: argument, **params}
    schema["required"] = [name, *(r for r in schema.get("required", []) if r not in (IMAGE_ARGUMENT, name))]
    return schema


def _error(message: str) -> types.CallToolResult:
    """A failed call: its message on one line (a pydantic error spans several)."""
    one_line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    return types.CallToolResult(content=[types.TextContent(type="text", text=one_line)], is_error=True)


def build_server(registry: ToolRegistry, max_pixels: int, access: ImageAccessPolicy | None = None) -> Server:
    """`access`: which images callers may name (default: inline bytes only)."""
    access = access if access is not None else ImageAccessPolicy()

    async def list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=s["name"],
                    description=s["description"],
                    # image-free tools (modality None, e.g. indicator rasters) take their params alone
                    input_schema=(
                        input_schema(s["input_schema"], image_count(registry.get(s["name"])))
                        if s["modality"] is not None
                        else s["input_schema"]
                    ),
                )
                for s in registry.schemas()
            ]
        )

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = dict(params.arguments or {})
        several = params.name in registry and image_count(registry.get(params.name)) > 1
        image_value = arguments.pop(IMAGES_ARGUMENT if several else IMAGE_ARGUMENT, None)
        action = Action(tool=params.name, params=arguments)
        try:
            tool, _ = registry.validate(action)  # params errors first, even without an image
            images = None
            if tool.modality is None:
                image = None
            elif several:
                if not isinstance(image_value, list) or not image_value:
                    raise GeoPilotInputError(f"{tool.name} takes `images`: a list of images in order (before, after)")
                images = [await anyio.to_thread.run_sync(access.load, value, max_pixels) for value in image_value]
                image = images[0]
            else:
                image = await anyio.to_thread.run_sync(access.load, image_value, max_pixels)
        except (ToolCallError, GeoPilotInputError) as err:
            return _error(str(err))
        result = await anyio.to_thread.run_sync(partial(registry.call, action, image, images=images))
        if not result.ok:
            return _error(str(result.error))
        output = result.output.model_dump(mode="json")
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(output))], structured_content=output
        )

    return Server(SERVER_NAME, version="1", on_list_tools=list_tools, on_call_tool=call_tool)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio", help="how clients connect")
    parser.add_argument("--host", default="127.0.0.1", help="http only: address to bind (not loopback: needs a key)")
    parser.add_argument("--port", type=port, default=8765, help="http only")
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"http only: the bearer token every request must carry (default: env {API_KEY_ENV}; none on loopback)",
    )
    add_tools_config_argument(parser, old_names=("--config",))
    parser.add_argument("--catalog", default=None, help="serve the indicator tools of this catalogue (YAML) instead")
    add_override_arguments(parser, "device=cpu max_pixels=50000000 'image_roots=[/data/scenes]'")


def transport_security():
    """The MCP SDK's own Host/Origin check, off: BrowserGate (`geopilot.network`) checks every request instead, by
    the rule `geopilot serve` and `geopilot indicators serve` follow (the SDK turns its check on only for 127.0.0.1,
    localhost and ::1, and lets any loopback Origin through)."""
    from mcp.server.transport_security import TransportSecuritySettings

    return TransportSecuritySettings(enable_dns_rebinding_protection=False)


def run(args: argparse.Namespace) -> int:
    from geopilot.tools.registry import build_registry, load_tools_config

    config = load_tools_config(args.tools_config, args.overrides)
    key = server_api_key("mcp", args.host, args.api_key) if args.transport == "http" else None
    access = ImageAccessPolicy.from_roots(config.image_roots)
    if args.catalog:
        from geopilot.tools.indicators.tools import build_indicator_registry

        server = build_server(build_indicator_registry(args.catalog), config.max_pixels, access)
    else:
        server = build_server(build_registry(config=config), config.max_pixels, access)
    if args.transport == "stdio":
        from mcp.server.stdio import stdio_server

        async def serve() -> None:
            async with stdio_server() as (read_stream, write_stream):
                await server.run(read_stream, write_stream, server.create_initialization_options())

        anyio.run(serve)
        return 0
    import uvicorn

    app = server.streamable_http_app(host=args.host, transport_security=transport_security())
    gated = BrowserGate(RequireApiKey(app, key) if key else app, answered_host_names(args.host, key))
    uvicorn.run(gated, host=args.host, port=args.port, log_level="warning")
    return 0
