"""What every GeoPilot server on a socket shares (`geopilot serve`, `geopilot mcp --transport http`,
`geopilot indicators serve`): whether a bind address stays on this machine, which key a server needs, the one
API-key check, and the one browser check (`BrowserGate`: a keyless server answers only to loopback Host names, 421
otherwise, so a DNS-rebound page cannot reach it; cross-site Origins 403; bodies that are not JSON 415)."""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import json
import os
import sys
from urllib.parse import urlsplit

from geopilot.errors import GeoPilotInputError

API_KEY_ENV = "GEOPILOT_API_KEY"


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses: a server bound there is unreachable from other machines."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def key_matches(authorization: str | None, key: str) -> bool:
    """True when the Authorization header carries `key` (Bearer, or Basic with any user and the key as password),
    compared in constant time."""
    if not authorization:
        return False
    scheme, _, value = authorization.partition(" ")
    scheme, value = scheme.lower(), value.strip()
    if scheme == "basic":
        try:
            value = base64.b64decode(value, validate=True).decode().partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return False
    elif scheme != "bearer":
        return False
    return hmac.compare_digest(value.encode(), key.encode())


def server_api_key(server: str, host: str, api_key: str | None) -> str | None:
    """The key every request must carry (`--api-key`, else $GEOPILOT_API_KEY, else none). Binding an address other
    machines can reach needs one: refused without it, and a one-line warning with it."""
    if api_key is not None and not api_key.strip():  # `--api-key "$KEY"` with KEY unset: never "no key" silently
        raise GeoPilotInputError("--api-key is empty (an unset variable?); give the key, or leave the flag out")
    key = api_key or os.environ.get(API_KEY_ENV) or None
    if not is_loopback(host):
        if key is None:
            raise GeoPilotInputError(
                f"refusing to serve {server} on {host} (not loopback) without an API key: "
                f"pass --api-key or set {API_KEY_ENV}"
            )
        print(
            f"geopilot {server}: warning: serving on {host}, reachable from other machines; "
            "every request needs the API key",
            file=sys.stderr,
        )
    return key


class RequireApiKey:
    """ASGI middleware: 401 unless the Authorization header carries the key (`key_matches`); `open_paths` (e.g.
    /health) answer without one."""

    def __init__(self, app, key: str, open_paths: tuple[str, ...] = ()):
        self.app, self.key, self.open_paths = app, key, open_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("path") not in self.open_paths:
            headers = dict(scope.get("headers") or [])
            if not key_matches(headers.get(b"authorization", b"").decode("latin-1") or None, self.key):
                body = {"error": "missing or wrong API key (Authorization: Bearer KEY)"}
                return await send_json(send, 401, body, [(b"www-authenticate", b"Bearer")])
        await self.app(scope, receive, send)


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def host_name(header: str) -> str:
    """A Host header's name without its port, lower-case: `[::1]:8000` -> `::1`, `Example.org:80` -> `example.org`."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def loopback_host_names(bind_host: str) -> set[str]:
    """The Host names a browser on this machine reaches a loopback server `bind_host` by. DNS rebinding (a page
    whose name the attacker re-points at 127.0.0.1) arrives with the attacker's name, which is not among them."""
    return {*LOOPBACK_NAMES, bind_host.strip().strip("[]").lower()}


async def send_json(send, status: int, payload: dict, extra_headers: list | None = None) -> None:
    """An ASGI middleware's own answer: `payload` as a JSON response with `status`."""
    body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra_headers or [])})
    await send({"type": "http.response.body", "body": body})


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None, param=None) -> dict:
    """The one shape of a refusal GeoPilot's servers write themselves (OpenAI's error object)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


JSON_TYPES = ("application/json",)
NOSNIFF = (b"x-content-type-options", b"nosniff")


class BrowserGate:
    """ASGI middleware for what a browser can be made to send. With `hosts` (a keyless loopback server): the Host
    header must name one of them (421 otherwise), so a DNS-rebound page cannot read answers. Always: an Origin
    must be this server's own (403 otherwise), and a body must be JSON (415 for `text/plain`, forms: the content
    types a cross-site page may POST without a preflight), except under `form_paths` (a web app's file uploads,
    still same-Origin only). Every response gets `X-Content-Type-Options: nosniff`."""

    def __init__(self, app, hosts: set[str] | None, form_paths: tuple[str, ...] = ()):
        self.app, self.hosts, self.form_paths = app, hosts, form_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        problem = self._problem(
            headers.get(b"host", b"").decode("latin-1"),
            headers.get(b"origin", b"").decode("latin-1") or None,
            headers.get(b"content-type", b"").decode("latin-1") or None,
            scope["method"],
            scope["path"],
        )
        if problem is not None:
            status, message, code = problem
            return await send_json(send, status, error_body(message, code=code), [NOSNIFF])

        async def with_nosniff(message):
            headers = list(message.get("headers", []))
            if message["type"] == "http.response.start" and all(k.lower() != NOSNIFF[0] for k, _ in headers):
                message = {**message, "headers": [*headers, NOSNIFF]}
            await send(message)

        await self.app(scope, receive, with_nosniff)

    def _problem(
        self, host: str, origin: str | None, content_type: str | None, method: str, path: str
    ) -> tuple[int, str, str] | None:
        """(status, message, code) of the first thing refused, or None."""
        if self.hosts is not None and host_name(host) not in self.hosts:
            return (
                421,
                f"Host {host[:100]!r} is not this server's (a keyless server answers only to loopback names)",
                "bad_host",
            )
        if origin is not None:
            try:
                same = urlsplit(origin).netloc.lower() == host.lower() and origin.lower().startswith(
                    ("http:", "https:")
                )
            except ValueError:
                same = False
            if not same:
                return 403, f"cross-site request from Origin {origin[:100]!r} refused", "cross_origin"
        forms = any(path == p or path.startswith(p + "/") for p in self.form_paths)
        if method in ("POST", "PUT", "PATCH") and content_type is not None and not forms:
            media = content_type.split(";", 1)[0].strip().lower()
            if media not in JSON_TYPES:
                return (
                    415,
                    f"request bodies must be JSON (Content-Type: application/json), got {media[:100] or 'none'!r}",
                    "unsupported_media_type",
                )
        return None


def answered_host_names(bind_host: str, api_key: str | None) -> set[str] | None:
    """The Host names BrowserGate lets through on a server bound to `bind_host`: a keyless one (which
    `server_api_key` lets bind only loopback) answers only to the loopback names; one with a key to any (None)."""
    return None if api_key else loopback_host_names(bind_host)
