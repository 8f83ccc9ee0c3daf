"""`geopilot indicators serve --catalog FILE`: the indicator tools as a FastAPI HTTP API with an OpenAPI spec.

    GET  /health                  liveness
    GET  /tools                   name, description, input and data schema of every tool
    POST /tools/{name}            body = the tool's params; 200 with the ToolResult, 400 when the tool
                                  fails (the same `error` text the agent and the MCP server see), 504 on timeout

Every call goes through the same `ToolRegistry.call` as the agent loop and `geopilot mcp --catalog`, so the three
return identical results. Binds 127.0.0.1 unless told otherwise.
"""

import argparse
import sys
from pathlib import Path
from typing import Any

from fastapi import Body, FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from geopilot.sample import Action
from geopilot.tool_output import ToolOutput
from geopilot.tool_protocol import ToolRegistry


class ToolCallResponse(BaseModel):
    tool: str
    params: dict[str, Any]
    output: ToolOutput | None = None
    error: str | None = None
    error_kind: str | None = None
    seconds: float


ERROR_STATUS = {"timeout": 504}  # any other failure of a valid request (no such area, display-only layer): 400


def create_app(registry: ToolRegistry, title: str = "GeoPilot indicator tools") -> FastAPI:
    app = FastAPI(title=title, version="1.0", description=__doc__.split("\n\n")[0])

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/tools")
    def list_tools() -> list[dict[str, Any]]:
        return registry.schemas()

    for tool in registry:
        app.add_api_route(
            f"/tools/{tool.name}",
            _endpoint(registry, tool.name, tool.params_model),
            methods=["POST"],
            name=tool.name,
            summary=tool.description,
            response_model=ToolCallResponse,
            responses={400: {"model": ToolCallResponse}, 504: {"model": ToolCallResponse}},
        )
    return app


def _endpoint(registry: ToolRegistry, name: str, params_model: type[BaseModel]):
    optional = not params_model.model_fields  # a tool without parameters takes an empty or missing body

    def call(params: params_model = Body(None if optional else ...)):  # type: ignore[valid-type]
        given = params.model_dump(exclude_none=True) if params is not None else {}
        result = registry.call(Action(tool=name, params=given), image=None)
        body = ToolCallResponse(
            tool=result.tool,
            params=result.params,
            output=result.output,
            error=result.error,
            error_kind=result.error_kind,
            seconds=round(result.seconds, 4),
        )
        status = 200 if result.ok else ERROR_STATUS.get(result.error_kind or "", 400)
        return JSONResponse(body.model_dump(mode="json"), status_code=status)

    call.__name__ = f"call_{name}"
    return call


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="{serve}")
    serve = sub.add_parser("serve", help="serve the indicator tools over HTTP (OpenAPI at /docs and /openapi.json)")
    serve.add_argument("--catalog", required=True, help="layer + area catalogue (YAML)")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s, loopback only)")
    serve.add_argument("--port", type=int, default=8790, help="port (default: %(default)s)")
    serve.add_argument("--artifacts-dir", default=None, help="where charts are written (default: a private temp dir)")


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from geopilot.tools.indicators.tools import build_indicator_registry

    registry = build_indicator_registry(Path(args.catalog), args.artifacts_dir)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: serving on {args.host}: anyone who can reach it can run the tools", file=sys.stderr)
    uvicorn.run(create_app(registry), host=args.host, port=args.port, log_level="warning")
    return 0
