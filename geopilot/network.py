"""What every GeoPilot server on a socket shares (`geopilot serve`, `geopilot mcp --transport http`): whether a bind
address stays on this machine, and the one API-key check."""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress


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
