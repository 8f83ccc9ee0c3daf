"""The durable record of a generation run: what makes `geopilot generate` resumable and idempotent by sample id.

Every finished job (kept or dropped) is one JSON line appended to `journal/shard-NNNNN.jsonl`; its worker
moves on only once the line is fsync'ed (group commit: one fsync covers every line written while the last ran). On start the journals are read back into the done-set; a torn last line (a kill
mid-write) is cut off, so its job simply runs again. A complete line that does not parse (a corrupt line inside
the file) is skipped and counted (`corrupt_lines`), never a reason to drop the lines after it; its job runs again.
The final shards are rebuilt from the journals in job
order, so their bytes do not depend on the order jobs finished in.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path


class Journal:
    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._handles: dict[int, object] = {}
        self._dirty: set[int] = set()  # file descriptors written since their last fsync
        self._waiters: list[asyncio.Future] = []
        self._syncer: asyncio.Task | None = None
        self.torn_lines = 0  # cut off while recovering (each was a job killed mid-write)
        self.corrupt_lines = 0  # complete lines that do not parse as an entry: skipped (their jobs run again)

    def path(self, shard: int) -> Path:
        return self.directory / f"shard-{shard:05d}.jsonl"

    def recover(self) -> dict[str, dict]:
        """Read every journal; cut a torn tail; return `summary(entry)` by sample id (the first one wins).
        Summaries, not samples, stay in memory: a half-million-sample run would not fit otherwise."""
        entries: dict[str, dict] = {}
        for path in sorted(self.directory.glob("shard-*.jsonl")):
            data = path.read_bytes()
            good_end = 0
            for line in data.splitlines(keepends=True):
                if not line.endswith(b"\n"):
                    break
                good_end += len(line)
                entry = parse_entry(line)
                if entry is None:
                    self.corrupt_lines += 1
                elif entry["id"] not in entries:
                    entries[entry["id"]] = summary(entry)
            if good_end < len(data):
                self.torn_lines += 1
                with path.open("r+b") as handle:
                    handle.truncate(good_end)
                    handle.flush()
                    os.fsync(handle.fileno())
        return entries

    def read_shard(self, shard: int) -> dict[str, dict]:
        """The full entries of one shard's journal by sample id (the first one wins); call after `recover`."""
        entries: dict[str, dict] = {}
        if self.path(shard).is_file():
            with self.path(shard).open("rb") as handle:
                for line in handle:
                    if (entry := parse_entry(line)) is not None:  # corrupt lines were counted by `recover`
                        entries.setdefault(entry["id"], entry)
        return entries

    def write(self, shard: int, entry: dict) -> None:
        """Append one line and hand it to the OS (it survives a killed process; `commit` makes it survive a crash)."""
        handle = self._handles.get(shard)
        if handle is None:
            handle = self._handles[shard] = self.path(shard).open("a", encoding="utf-8")
        handle.write(json.dumps(entry, ensure_ascii=False) + "\n")
        handle.flush()
        self._dirty.add(handle.fileno())

    async def commit(self, shard: int, entry: dict) -> None:
        """Write one line and return once it is on disk. fsyncs are grouped: while one runs in a thread, the lines
        written meanwhile wait for the next, so the event loop never blocks on the disk (an fsync is ~6-16 ms here)."""
        self.write(shard, entry)
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        if self._syncer is None or self._syncer.done():
            self._syncer = asyncio.create_task(self._sync_waiting())
        await waiter

    async def _sync_waiting(self) -> None:
        while self._waiters:
            waiters, self._waiters = self._waiters, []
            fds, self._dirty = self._dirty, set()
            await asyncio.to_thread(_fsync_all, fds)
            for waiter in waiters:
                waiter.set_result(None)

    def close(self) -> None:
        _fsync_all(self._dirty)
        self._dirty = set()
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()


def _fsync_all(fds: set[int]) -> None:
    for fd in fds:
        os.fsync(fd)


def parse_entry(line: bytes) -> dict | None:
    """One journal line -> its entry, or None when it is not one (bad UTF-8 or JSON, no id, missing fields)."""
    try:
        entry = json.loads(line)
        summary(entry)  # the fields every reader of the journal uses
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return entry if isinstance(entry["id"], str) else None


def summary(entry: dict) -> dict:
    """What the report needs of one journal entry: status, provenance meta, and where the sample belongs."""
    sample = entry.get("sample") or {}
    tools = sorted({a["tool"] for m in sample.get("messages", []) if m["role"] == "assistant" for a in m["actions"]})
    return {
        "id": entry["id"],
        "status": entry["status"],
        "meta": entry["meta"],
        "source": sample.get("source"),
        "ability": sample.get("ability"),
        "modality": sample.get("modality"),
        "tools": tools,
    }
