"""How a browser passes the API key to `/demo` once: a login form (or a `?key=` link) that becomes a cookie.

The HTTP API keeps its `Authorization` header; under `/demo` the `geopilot_key` cookie (HttpOnly, SameSite=Strict,
Path=/demo) works too. A `?key=` that matches is answered with a redirect to the same address without it, setting
the cookie, so the key does not stay in the address bar or the history. Anything else gets 401: a browser's page
load the login form, other requests one JSON line.
"""

from __future__ import annotations

import hmac
import html
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, urlencode

DEMO_PATH = "/demo"
COOKIE = "geopilot_key"


def is_demo(path: str) -> bool:
    return path == DEMO_PATH or path.startswith(DEMO_PATH + "/")


def cookie_key(headers: dict[bytes, bytes]) -> str | None:
    raw = headers.get(b"cookie")
    if not raw:
        return None
    cookies = SimpleCookie()
    try:
        cookies.load(raw.decode("latin-1"))
    except Exception:  # a malformed Cookie header is simply no key  # noqa: BLE001
        return None
    morsel = cookies.get(COOKIE)
    return morsel.value if morsel else None


def same_key(given: str | None, key: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), key.encode())


def query_key(query_string: bytes) -> tuple[str | None, str]:
    """The `key` query parameter and the query string without it."""
    pairs = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)
    key = next((value for name, value in pairs if name == "key"), None)
    return key, urlencode([(name, value) for name, value in pairs if name != "key"])


async def redirect_with_cookie(send, path: str, rest: str, key: str) -> None:
    cookie = f"{COOKIE}={key}; Path={DEMO_PATH}; HttpOnly; SameSite=Strict"
    location = path + (f"?{rest}" if rest else "")
    headers = [
        (b"location", location.encode("latin-1")),
        (b"set-cookie", cookie.encode("latin-1")),
        (b"referrer-policy", b"no-referrer"),
        (b"content-length", b"0"),
    ]
    await send({"type": "http.response.start", "status": 303, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


def login_page(message: str) -> bytes:
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>GeoPilot: sign in</title></head>
<body style="font-family:sans-serif;max-width:28rem;margin:4rem auto">
<h1>GeoPilot</h1><p id="login-message">{html.escape(message)}</p>
<form method="get" action="{DEMO_PATH}/"><label>API key <input id="key" name="key" type="password"
 autocomplete="current-password" required autofocus></label> <button id="login" type="submit">Open the demo</button>
</form></body></html>""".encode()


async def refuse(scope, send, message: str) -> None:
    """401: the login form for a browser's page load, one JSON error line otherwise."""
    from geopilot.network import error_body, send_json

    accept = dict(scope.get("headers") or []).get(b"accept", b"")
    if scope["method"] != "GET" or b"text/html" not in accept:
        return await send_json(send, 401, error_body(message, "authentication_error"))
    body = login_page(message)
    headers = [(b"content-type", b"text/html; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def framing_refused(send):
    """`send` adding what the demo's pages need against clickjacking and leaking addresses to other sites."""
    extra = [(b"x-frame-options", b"DENY"), (b"referrer-policy", b"no-referrer")]

    async def with_headers(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return with_headers
