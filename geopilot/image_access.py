"""Which images an outside caller (the MCP server, `geopilot serve`) may make GeoPilot read: the image-access policy.

An `image` value from the network is inline image bytes (base64, plain or as a `data:image/...;base64,` URI), or a
path to a file under one of the configured `image_roots` (`configs/tools.yaml`). With no roots (the default) only
inline bytes are accepted. URLs are refused: nothing is ever fetched. A path is accepted only when both its
spelling (made absolute, `..` folded) and its real location (symlinks resolved) lie under a root, and it is a
regular file there; a path outside every root is never looked at. Every refusal of a path reads the same
(`REFUSED`), so the error never tells a caller whether a path exists, is a directory or is unreadable.
The CLI on the user's own files does not go through this (it calls `geopilot.image.load_image`).

    policy = ImageAccessPolicy.from_roots(config.image_roots)
    image = policy.load(arguments["image"], max_pixels=config.max_pixels)   # ImageAccessError / ImageInputError
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geopilot.errors import ConfigError, ImageInputError
from geopilot.image import DEFAULT_MAX_PIXELS, load_image
from geopilot.loaded_image import LoadedImage

ARGUMENT = "image"
MAX_PATH_CHARS = 4096
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
_DATA_URI = re.compile(r"^data:image/[a-zA-Z0-9.+-]+;base64,", re.ASCII)


class ImageAccessError(ImageInputError):
    """An `image` value the policy does not accept (a URL, a path outside the roots, neither path nor base64)."""


@dataclass(frozen=True)
class ImageAccessPolicy:
    roots: tuple[Path, ...] = ()  # real (resolved) folders; empty = inline bytes only

    @classmethod
    def from_roots(cls, roots: Iterable[str | Path]) -> ImageAccessPolicy:
        resolved = []
        for root in roots:
            path = Path(root).expanduser()
            if not path.is_dir():
                raise ConfigError(f"image_roots: {root} is not a directory")
            resolved.append(path.resolve())
        return cls(tuple(resolved))

    @property
    def refused(self) -> str:
        """The one message for every value that is not accepted as a path or as image data."""
        where = "a path to a file under the server's image roots" if self.roots else "no file paths (none configured)"
        return f"{ARGUMENT}: not accepted: send base64 image data; this server accepts {where}"

    def resolve_path(self, value: str) -> Path | None:
        """The real path of an allowed image file, or None (without touching anything outside the roots)."""
        if not self.roots or len(value) > MAX_PATH_CHARS or "\n" in value or "\x00" in value:
            return None
        given = Path(value).expanduser() if value.startswith("~") else Path(value)
        candidates = [given] if given.is_absolute() else [root / given for root in self.roots]
        for candidate in candidates:
            spelled = Path(os.path.normpath(candidate))
            if not self._inside(spelled):
                continue
            real = spelled.resolve()
            if self._inside(real) and real.is_file():
                return real
        return None

    def _inside(self, path: Path) -> bool:
        return any(path == root or path.is_relative_to(root) for root in self.roots)

    def load(self, value: Any, max_pixels: int = DEFAULT_MAX_PIXELS) -> LoadedImage:
        """An outside caller's `image` value -> LoadedImage; one-line ImageAccessError / ImageInputError otherwise."""
        if isinstance(value, (bytes, bytearray)):
            return load_image(bytes(value), max_pixels=max_pixels)
        if not isinstance(value, str) or not value.strip():
            raise ImageAccessError(f"{ARGUMENT}: required: base64 image data (PNG, JPEG, TIFF or WebP)")
        value = value.strip()
        if _URL.match(value):
            raise ImageAccessError(f"{ARGUMENT}: URLs are not fetched; send base64 image data")
        if _DATA_URI.match(value):
            return load_image(_decode(value.split(",", 1)[1], self.refused), max_pixels=max_pixels)
        path = self.resolve_path(value)
        if path is not None:
            return load_image(path, max_pixels=max_pixels)
        return load_image(_decode(value, self.refused), max_pixels=max_pixels)


def _decode(text: str, refused: str) -> bytes:
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ImageAccessError(refused) from None
    if not data:
        raise ImageAccessError(refused)
    return data
