"""`geopilot indicators serve --catalog FILE`: the indicator tools as a FastAPI HTTP API with an OpenAPI spec.

    GET  /health                  liveness
    GET  /tools                   name, description, input and data schema of every tool
    POST /tools/{name}            body = the tool's params; 200 with the ToolResult, 400 when the tool
                                  fails (the same `error` text the agent and the MCP server see), 504 on timeout,
                                  422 for a body that does not fit the params (NaN/Infinity included)
    GET  /artifacts/{name}        a chart a call made: its `artifacts[].path` is this name, never a server path

Every call goes through the same `ToolRegistry.call` as the agent loop and `geopilot mcp --catalog`, so the three
return identical results. Binds 127.0.0.1 unless told otherwise; any other address needs an API key
(`--api-key` or GEOPILOT_API_KEY, the check `geopilot serve` and `geopilot mcp` use), and then every route but
/health needs it. Without a key it answers only to loopback Host names (421 otherwise: DNS rebinding), and like
every GeoPilot server refuses cross-site Origins (403) and bodies that are not JSON (415): `BrowserGate`. A body
over 1 MiB is 413; a 422 quotes at most 200 characters of any key.
"""

import argparse
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from fastapi import Body, FastAPI, HTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel

from geopilot.argtypes import add_deprecated_name, port
from geopilot.cli import Command
from geopilot.errors import clipped
from geopilot.network import API_KEY_ENV, BrowserGate, RequireApiKey, answered_host_names, server_api_key
from geopilot.sample import Action
from geopilot.serving.security import BodyLimit
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
MAX_BODY_BYTES = 2**20  # a call's params: a few names and numbers (413 over it, before it is read whole)
MAX_PROBLEMS = 20  # of an invalid body's problems, those a 422 lists
SERVED_ARTIFACTS = 200  # the names /artifacts answers for: the newest charts this server made (as the tools prune)


class ArtifactNames:
    """Public name -> file for the artefacts this server's calls made; nothing else is ever served."""

    def __init__(self, keep: int = SERVED_ARTIFACTS):
        self.keep, self.paths, self.lock = keep, OrderedDict[str, Path](), threading.Lock()

    def publish(self, output: ToolOutput | None) -> ToolOutput | None:
        if output is None or not output.artifacts:
            return output
        artifacts = []
        with self.lock:
            for artifact in output.artifacts:
                path = Path(artifact.path)
                self.paths[path.name] = path
                self.paths.move_to_end(path.name)
                artifacts.append(artifact.model_copy(update={"path": path.name}))
            while len(self.paths) > self.keep:
                self.paths.popitem(last=False)
        return output.model_copy(update={"artifacts": artifacts})

    def path(self, name: str) -> Path | None:
        with self.lock:
            return self.paths.get(name)


def create_app(
    registry: ToolRegistry,
    title: str = "GeoPilot indicator tools",
    api_key: str | None = None,
    host: str | None = None,
):
    """The FastAPI app behind BrowserGate (and the API-key check when `api_key` is given). `host` is the address it
    is served on: without a key it then answers only to that address's loopback Host names (None: any Host, for
    in-process clients such as TestClient)."""
    app = FastAPI(title=title, version="1.0", description=__doc__.split("\n\n")[0])
    names = ArtifactNames()

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request, err: RequestValidationError) -> JSONResponse:
        # FastAPI's own handler echoes the input back, and an echoed NaN cannot be encoded (a 500); a key of the
        # input is shown clipped (a 5 MB key would come back whole)
        detail = [
            {"type": e["type"], "loc": [clipped(p) if isinstance(p, str) else p for p in e["loc"]], "msg": e["msg"]}
            for e in err.errors()[:MAX_PROBLEMS]
        ]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/tools")
    def list_tools() -> list[dict[str, Any]]:
        return registry.schemas()

    @app.get("/artifacts/{name}", response_class=FileResponse)
    def artifact(name: str) -> FileResponse:
        path = names.path(name)
        if path is None or not path.is_file():
            raise HTTPException(404, f"no artefact {clipped(repr(name))} (only the newest {SERVED_ARTIFACTS} are kept)")
        return FileResponse(path)

    for tool in registry:
        app.add_api_route(
            f"/tools/{tool.name}",
            _endpoint(registry, tool.name, tool.params_model, names),
            methods=["POST"],
            name=tool.name,
            summary=tool.description,
            response_model=ToolCallResponse,
            responses={400: {"model": ToolCallResponse}, 504: {"model": ToolCallResponse}},
        )
    limited = BodyLimit(app, MAX_BODY_BYTES)
    keyed = RequireApiKey(limited, api_key, open_paths=("/health",)) if api_key else limited
    return BrowserGate(keyed, None if host is None else answered_host_names(host, api_key))


def _endpoint(registry: ToolRegistry, name: str, params_model: type[BaseModel], names: ArtifactNames):
    optional = not params_model.model_fields  # a tool without parameters takes an empty or missing body

    def call(params: params_model = Body(None if optional else ...)):  # type: ignore[valid-type]
        given = params.model_dump(exclude_none=True) if params is not None else {}
        result = registry.call(Action(tool=name, params=given), image=None)
        body = ToolCallResponse(
            tool=result.tool,
            params=result.params,
            output=names.publish(result.output),
            error=result.error,
            error_kind=result.error_kind,
            seconds=round(result.seconds, 4),
        )
        status = 200 if result.ok else ERROR_STATUS.get(result.error_kind or "", 400)
        return JSONResponse(body.model_dump(mode="json"), status_code=status)

    call.__name__ = f"call_{name}"
    return call


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--catalog", required=True, help="layer + area catalogue (YAML)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s, loopback only)")
    parser.add_argument("--port", type=port, default=8790, help="port (default: %(default)s)")
    parser.add_argument("--out", default=None, help="the folder charts are written to (default: a private temp dir)")
    add_deprecated_name(parser, "--artifacts-dir", "--out")
    parser.add_argument(
        "--api-key", default=None, help=f"the bearer token every request must carry (default: env {API_KEY_ENV})"
    )


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from geopilot.tools.indicators.tools import build_indicator_registry

    key = server_api_key("indicators", args.host, args.api_key)
    registry = build_indicator_registry(Path(args.catalog), args.out)
    app = create_app(registry, api_key=key, host=args.host)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


COMMANDS = {
    "serve": Command("serve the indicator tools over HTTP (OpenAPI at /docs and /openapi.json)", add_arguments, run)
}
