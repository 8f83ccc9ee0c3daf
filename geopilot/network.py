"""What every GeoPilot server on a socket shares (`geopilot serve`, `geopilot mcp --transport http`,
`geopilot indicators serve`): whether a bind address stays on this machine, which key a server needs, and the one
API-key check."""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import json
import os
import sys

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
                body = json.dumps({"error": "missing or wrong API key (Authorization: Bearer KEY)"}).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
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
