"""What keeps the server safe on a network: the API key, the body limit, image decoding limits and the image URL
policy. Every refusal is a `ServeError` carrying its HTTP status and a one-line message (never a traceback).

- key: `Authorization: Bearer KEY`, or HTTP Basic with the key as password (browsers: the demo), compared in
  constant time; every route but /health needs it.
- body: `BodyLimit` refuses a declared Content-Length over the limit, and stops reading a chunked body at it: 413.
- images: `data:image/...;base64,` URLs; anything else in a data URL is 400, more pixels than the limit 413
  (read from the header before decoding).
- URLs: http(s) only for hosts on the allowlist; every address the host resolves to must be public unless that
  address is listed itself (so `127.0.0.1`, `169.254.169.254`, RFC 1918 and link-local are refused unless named);
  redirects are not followed; the body is capped like an upload; the whole fetch has one deadline (a server that
  drips a byte at a time is cut off at it) and holds no thread while it waits.
- browsers: `geopilot.network.BrowserGate` (every GeoPilot server's) checks the Host header of a keyless loopback
  server (DNS rebinding), refuses cross-site Origins and bodies that are not JSON, and sends `nosniff`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import json
import re
import socket
import time
from urllib.parse import urlsplit

from geopilot.errors import GeoPilotInputError, ImageTooLargeError, clipped
from geopilot.image import TIFF_MAGIC, check_size, rasterio_available, read_size
from geopilot.network import error_body, send_json

MAX_ERROR_CHARS = 1000  # a refusal's whole message, however many problems it lists


class ServeError(Exception):
    """A request the server refuses: HTTP `status`, OpenAI error `kind`, one-line message."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ):
        super().__init__(clipped(message, MAX_ERROR_CHARS))  # what it quotes of the request is clipped already
        self.status, self.kind, self.code, self.param = status, kind, code, param

    def body(self) -> dict:
        return error_body(str(self), self.kind, self.code, self.param)


class BodyLimit:
    """ASGI middleware: 413 for a body over `max_bytes`, by its Content-Length or while it streams in."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await _refuse(send, self._error())
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _BodyTooLarge
            return message

        started = False

        async def tracking_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await _refuse(send, self._error())

    def _error(self) -> ServeError:
        return ServeError(413, f"request body over the limit of {self.max_bytes:,} bytes", code="body_too_large")


class _BodyTooLarge(Exception):
    pass


async def _refuse(send, error: ServeError) -> None:
    await send_json(send, error.status, error.body())


_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^,;]*)*?);base64,(?P<data>.*)", re.S)


def decode_data_url(url: str) -> bytes:
    """`data:image/<type>;base64,<data>` -> bytes; 400 for a non-image or undecodable one."""
    match = _DATA_URL.fullmatch(url.strip())
    if match is None:
        raise ServeError(400, "image_url: a data URL must look like data:image/png;base64,<data>", code="bad_image")
    mime = (match["mime"] or "").lower()
    if not mime.startswith("image/"):
        raise ServeError(
            400, f"image_url: data URL of type {clipped(repr(mime or 'none'))}, not an image", code="bad_image"
        )
    try:
        return base64.b64decode(re.sub(r"\s+", "", match["data"]), validate=True)
    except (binascii.Error, ValueError):
        raise ServeError(400, "image_url: the data URL's base64 does not decode", code="bad_image") from None


def decode_base64_image(data: str) -> bytes:
    """A FastChat `images` entry: a data URL or bare base64 (a JPEG's starts with `/9j/`, so a leading `/` is not
    taken for a path: a path simply does not decode)."""
    if not isinstance(data, str):
        raise ServeError(400, f"images must be base64 strings, got {type(data).__name__}", code="bad_image")
    if data.startswith("data:"):
        return decode_data_url(data)
    if data.startswith(("http://", "https://", "file:")):
        raise ServeError(400, "images must be base64 data, not URLs or paths", code="bad_image")
    try:
        return base64.b64decode(re.sub(r"\s+", "", data), validate=True)
    except (binascii.Error, ValueError):
        raise ServeError(
            400, "an image's base64 does not decode (images must be base64 data, not URLs or paths)", code="bad_image"
        ) from None


def check_image(data: bytes, max_pixels: int) -> None:
    """400 for bytes that are not an image, 413 for an image over the size rule of `geopilot.image` (header only,
    nothing decoded): more pixels than `max_pixels`, a padded square over it, or over Pillow's bomb limit. A TIFF
    is left to rasterio (Pillow reads no TIFF of more than 4 bands, e.g. Sentinel-2's 13), which applies the same
    rule when it opens the header: a larger scene is read decimated, never whole."""
    if data[:4] in TIFF_MAGIC and rasterio_available():
        return
    try:
        check_size(*read_size(data, "image_url"), max_pixels, "image_url")
    except ImageTooLargeError as err:
        raise ServeError(413, str(err), code="image_too_large") from None
    except GeoPilotInputError as err:
        raise ServeError(400, str(err), code="bad_image") from None


class UrlPolicy:
    """Which http(s) image URLs may be fetched: hosts on the allowlist, resolving to public addresses only unless
    the address itself is listed. Entries are host names, IP addresses or CIDR networks."""

    def __init__(self, allowed: list[str], timeout_s: float, max_bytes: int):
        self.hosts = {a.lower() for a in allowed if not _network(a)}
        self.networks = [n for a in allowed if (n := _network(a)) is not None]
        self.timeout_s, self.max_bytes = timeout_s, max_bytes
        self._http = None  # the httpx.AsyncClient, made on the first fetch (inside the server's event loop)

    def _client(self):
        """One client for every fetch (a new one per fetch costs a TLS context: tens of ms of CPU each)."""
        import httpx

        if self._http is None:
            self._http = httpx.AsyncClient(follow_redirects=False)
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    def _listed(self, address: ipaddress._BaseAddress) -> bool:
        return any(address in network for network in self.networks)

    def check(self, url: str) -> str:
        """The URL's host if it may be fetched; 400 naming the reason otherwise."""
        scheme, host, port = _split(url)
        literal = _address(host)
        if not (self.hosts or self.networks):
            raise ServeError(
                400,
                "image URLs are not fetched by this server (send a data: URL, or start it with --allow-url-host)",
                code="url_not_allowed",
            )
        if host not in self.hosts and not (literal is not None and self._listed(literal)):
            raise ServeError(
                400, f"image URL host {clipped(repr(host))} is not on the allowlist", code="url_not_allowed"
            )
        try:
            infos = socket.getaddrinfo(host, port or (443 if scheme == "https" else 80))
        except (OSError, UnicodeError, ValueError):
            raise ServeError(
                400, f"image URL host {clipped(repr(host))} does not resolve", code="bad_image_url"
            ) from None
        for info in infos:
            address = ipaddress.ip_address(info[4][0])
            if not address.is_global and not self._listed(address):
                raise ServeError(
                    400,
                    f"image URL host {clipped(repr(host))} resolves to the non-public address {address} (list it explicitly to allow)",
                    code="url_not_allowed",
                )
        return host

    async def fetch(self, url: str, deadline: float) -> bytes:
        """GET an allowed URL (no redirects), at most `max_bytes`, all of it within `url_timeout_s` and before the
        request's `deadline` (time.monotonic()). Awaiting holds no thread, so slow servers cannot starve others."""
        import httpx

        limit = min(self.timeout_s, deadline - time.monotonic())
        _split(url)  # a malformed URL is 400 before anything else
        try:
            async with asyncio.timeout(max(limit, 0.0)):
                await asyncio.to_thread(self.check, url)
                async with self._client().stream("GET", url, timeout=max(limit, 0.001)) as response:
                    if response.is_redirect:
                        raise ServeError(400, "image URL redirects; redirects are not followed", code="bad_image_url")
                    if response.status_code != 200:
                        raise ServeError(400, f"image URL answered HTTP {response.status_code}", code="bad_image_url")
                    chunks, size = [], 0
                    async for chunk in response.aiter_bytes():
                        size += len(chunk)
                        if size > self.max_bytes:
                            raise ServeError(
                                413, f"image URL body over {self.max_bytes:,} bytes", code="image_too_large"
                            )
                        chunks.append(chunk)
        except (TimeoutError, httpx.TimeoutException):
            if limit < self.timeout_s:  # the request's own deadline came first
                raise ServeError(
                    504, "the request timed out while fetching its image URL", "server_error", "timeout"
                ) from None
            raise ServeError(
                400, f"image URL did not arrive within {self.timeout_s:g} s", code="bad_image_url"
            ) from None
        except (httpx.HTTPError, httpx.InvalidURL) as err:
            raise ServeError(
                400, f"image URL could not be fetched: {type(err).__name__}", code="bad_image_url"
            ) from None
        return b"".join(chunks)


def _split(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of an http(s) URL; 400 for anything else or anything unparsable (whitespace and control
    characters included: urllib would silently drop tabs and newlines)."""
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        raise ServeError(400, "image URL contains whitespace or control characters", code="bad_image_url")
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as err:
        raise ServeError(400, f"image URL cannot be parsed ({clipped(str(err))})", code="bad_image_url") from None
    if parts.scheme not in ("http", "https") or not host:
        raise ServeError(400, "image_url must be a data:image/... URL or an http(s) URL", code="bad_image_url")
    return parts.scheme, host.lower(), port


def parse_json(raw: bytes, what: str = "the request body") -> object:
    """JSON bytes -> the value; ServeError 400 for anything json.loads refuses, however it refuses it (bad syntax,
    nesting past the recursion limit, an integer over Python's 4300-digit limit, bytes that are not UTF-8, NaN and
    Infinity, which are not JSON numbers)."""
    try:
        return json.loads(raw, parse_constant=_not_a_number)
    except RecursionError:
        raise ServeError(400, f"{what} is nested too deeply", code="bad_json") from None
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError, and so is the digit limit
        raise ServeError(400, f"{what} is not valid JSON ({str(err)[:200]})", code="bad_json") from None


def _not_a_number(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _address(text: str) -> ipaddress._BaseAddress | None:
    try:
        return ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return None


def _network(text: str) -> ipaddress._BaseNetwork | None:
    try:
        return ipaddress.ip_network(text.strip("[]"), strict=False)
    except ValueError:
        return None
