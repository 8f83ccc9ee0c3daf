"""The prefix cache of client-run tools: a think turn whose calls a client runs leaves its KV cache here, keyed by
the rendered conversation up to and including that plan; the request that brings the results back continues from
it, prefilling only the plan (re-encoded as the template renders it, so a hit answers exactly as a re-prefill)
and the tool turn, instead of re-prefilling image, prompt and plan.

Bounded: at most `max_entries` conversations (the least recently parked goes first), each for `ttl_s` seconds; a
client that never comes back costs its entry until then, and every `park`/`take` drops what has expired. An entry
is taken once (the continued conversation is parked again if it hands off calls again). A key is the SHA-256 of
the image's pixels, the system prompt and the rendered text, so only an identical prefix hits; anything else is
re-prefilled, exactly as without the cache.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from typing import Any

DEFAULT_ENTRIES = 8
DEFAULT_TTL_S = 120.0


def prefix_key(image, system: str | None, rendered: str) -> str:
    """The key of a conversation prefix: the image's pixels, the system prompt and the rendered text."""
    digest = hashlib.sha256()
    pil = image.image
    digest.update(f"{pil.mode}:{pil.size}".encode())
    digest.update(pil.tobytes())
    digest.update(b"\0" + ("\0" if system is None else system).encode() + b"\0")
    digest.update(rendered.encode())
    return digest.hexdigest()


class PrefixCache:
    def __init__(self, max_entries: int = DEFAULT_ENTRIES, ttl_s: float = DEFAULT_TTL_S, clock=time.monotonic):
        if max_entries < 1 or not ttl_s > 0:
            raise ValueError(f"a prefix cache needs max_entries >= 1 and ttl_s > 0, got {max_entries}, {ttl_s}")
        self.max_entries, self.ttl_s, self.clock = max_entries, ttl_s, clock
        self._entries: OrderedDict[str, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = self.parked = self.expired = self.evicted = 0

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._entries)

    def park(self, key: str, session: Any) -> None:
        with self._lock:
            self._expire()
            self._entries.pop(key, None)
            self._entries[key] = (self.clock() + self.ttl_s, session)
            self.parked += 1
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
                self.evicted += 1

    def take(self, key: str) -> Any | None:
        with self._lock:
            self._expire()
            entry = self._entries.pop(key, None)
            if entry is None:
                self.misses += 1
                return None
            self.hits += 1
            return entry[1]

    def _expire(self) -> None:
        now = self.clock()
        for key in [k for k, (until, _) in self._entries.items() if until <= now]:
            del self._entries[key]
            self.expired += 1

    def stats(self) -> dict[str, int]:
        return {
            "entries": len(self),
            "hits": self.hits,
            "misses": self.misses,
            "parked": self.parked,
            "expired": self.expired,
            "evicted": self.evicted,
        }
