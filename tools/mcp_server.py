"""`geopilot mcp`: the task-level tool registry served over MCP (mcp 2.x low-level `Server`, tools capability only).

    geopilot mcp --transport stdio                        # for Claude Desktop / agent frameworks
    geopilot mcp --transport http --host 127.0.0.1 --port 8765     # streamable HTTP at http://HOST:PORT/mcp

Each MCP tool takes the registry tool's parameters plus `image`: either a path to a local file on the server's
machine, or the image bytes in base64 (plain, or as a `data:image/...;base64,` URI). URLs are refused: the server
never fetches anything. Parameters are checked by the ToolRegistry dispatcher (the same one inference uses);
any failure comes back as a result with `is_error=True` and a message naming the field. A success returns the
canonical ToolOutput as JSON text and as `structured_content`.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import re
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server

from geopilot.errors import GeoPilotInputError
from geopilot.image import LoadedImage, load_image
from geopilot.sample import Action
from geopilot.tool_protocol import ToolCallError, ToolRegistry

SERVER_NAME = "geopilot-tools"
IMAGE_ARGUMENT = "image"
IMAGE_SCHEMA = {
    "type": "string",
    "description": "the image: a path to a local file on the server's machine, or base64-encoded PNG/JPEG/TIFF bytes "
    "(optionally as a data:image/...;base64, URI). URLs are refused.",
}
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
_DATA_URI = re.compile(r"^data:image/[a-zA-Z0-9.+-]+;base64,", re.ASCII)
MAX_PATH_CHARS = 4096


def input_schema(params_schema: dict[str, Any]) -> dict[str, Any]:
    """A registry tool's params schema plus the required `image` argument."""
    schema = dict(params_schema)
    schema["properties"] = {IMAGE_ARGUMENT: IMAGE_SCHEMA, **schema.get("properties", {})}
    schema["required"] = [IMAGE_ARGUMENT, *schema.get("required", [])]
    return schema


def decode_image(value: Any, max_pixels: int) -> LoadedImage:
    """`image` argument -> LoadedImage; raises GeoPilotInputError naming the field."""
    if not isinstance(value, str) or not value.strip():
        raise GeoPilotInputError(f"{IMAGE_ARGUMENT}: required (a local file path or base64 image data)")
    value = value.strip()
    if _URL.match(value):
        raise GeoPilotInputError(f"{IMAGE_ARGUMENT}: URLs are not fetched; pass a local file path or base64 image data")
    if _DATA_URI.match(value):
        value = value.split(",", 1)[1]
    elif len(value) < MAX_PATH_CHARS and "\n" not in value and Path(value).expanduser().is_file():
        return load_image(Path(value).expanduser(), max_pixels=max_pixels)
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise GeoPilotInputError(
            f"{IMAGE_ARGUMENT}: neither an existing local file nor valid base64 image data"
        ) from None
    return load_image(data, max_pixels=max_pixels)


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


def build_server(registry: ToolRegistry, max_pixels: int) -> Server:
    async def list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(name=s["name"], description=s["description"], input_schema=input_schema(s["input_schema"]))
                for s in registry.schemas()
            ]
        )

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = dict(params.arguments or {})
        image_value = arguments.pop(IMAGE_ARGUMENT, None)
        action = Action(tool=params.name, params=arguments)
        try:
            registry.validate(action)  # params errors first, even without an image
            image = await anyio.to_thread.run_sync(decode_image, image_value, max_pixels)
        except (ToolCallError, GeoPilotInputError) as err:
            return _error(str(err))
        result = await anyio.to_thread.run_sync(registry.call, action, image)
        if not result.ok:
            return _error(str(result.error))
        output = result.output.model_dump(mode="json")
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(output))], structured_content=output
        )

    return Server(SERVER_NAME, version="1", on_list_tools=list_tools, on_call_tool=call_tool)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1", help="http only")
    parser.add_argument("--port", type=int, default=8765, help="http only")
    parser.add_argument("--config", default=None, help="tools YAML (default: configs/tools.yaml)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")


def run(args: argparse.Namespace) -> int:
    from geopilot.tools.registry import build_registry, load_tools_config

    config = load_tools_config(args.config, args.set)
    server = build_server(build_registry(config=config), config.max_pixels)
    if args.transport == "stdio":
        from mcp.server.stdio import stdio_server

        async def serve() -> None:
            async with stdio_server() as (read_stream, write_stream):
                await server.run(read_stream, write_stream, server.create_initialization_options())

        anyio.run(serve)
        return 0
    import uvicorn

    uvicorn.run(server.streamable_http_app(host=args.host), host=args.host, port=args.port, log_level="warning")
    return 0
