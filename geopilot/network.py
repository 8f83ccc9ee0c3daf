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
