"""Durable small-file writes: the one atomic-write helper (checkpoints, generation shards, reports, caches), and
the two ways JSON objects are read back: strictly from user input (`parse_json_object`), leniently from a log we wrote
(`read_json_log`).

`atomic_write` writes a sibling temp file (hidden, named with the process id so concurrent writers never share
one), fsyncs it, renames it over the target (atomic on POSIX) and fsyncs the folder, so after a crash a reader
sees the old file or the new one, never a torn mix.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from geopilot.errors import GeoPilotInputError


def fsync_path(path: str | Path) -> None:
    """fsync a file or a folder (a folder's fsync makes a rename inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | Path, text: str) -> None:
    path = Path(path)
    staging = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with staging.open("w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)  # only still there when writing or renaming failed
    fsync_path(path.parent)


def parse_json_object(text: str, where: str) -> dict:
    """One JSON object given by the user (a JSONL line, a `--params` value), or a one-line `GeoPilotInputError`
    that starts with `where`: `cases.jsonl line 3: not JSON (Expecting value)`."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise GeoPilotInputError(f"{where}: not JSON ({err.msg})") from None
    if not isinstance(value, dict):
        raise GeoPilotInputError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def read_json_log(path: str | Path) -> Iterator[dict]:
    """The JSON objects of an append-only JSONL log, oldest first. A line that does not parse (torn by a kill
    mid-write) or is not an object is passed over: the work it stood for is simply done again."""
    path = Path(path)
    if not path.is_file():
        return
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            yield record
