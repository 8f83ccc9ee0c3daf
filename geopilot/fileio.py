"""Durable small-file writes and JSON lines: the one atomic-write helper (checkpoints, generation shards, reports,
caches), the one append to a JSONL log (`append_jsonl`), the one JSONL reader (`iter_jsonl`: strict for user input,
lenient for a log we wrote), and the one settings fingerprint.

`atomic_write` writes a sibling temp file (hidden, named with the process id so concurrent writers never share
one), fsyncs it, renames it over the target (atomic on POSIX) and fsyncs the folder, so after a crash a reader
sees the old file or the new one, never a torn mix.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

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


def fingerprint(settings) -> str:
    """The identity of a set of settings: sha256 of their canonical JSON, 16 hex digits (every run folder's)."""
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def append_jsonl(path: str | Path, records: Iterable[dict]) -> None:
    """Append records to a JSONL log, one line each, durably (flush + fsync). A last line torn by a kill is closed
    first, so it stays one unreadable line (passed over by `iter_jsonl(..., "skip")`) and never swallows the next
    record."""
    lines = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    if not lines:
        return
    with Path(path).open("ab") as handle:
        if handle.tell() > 0:
            with Path(path).open("rb") as existing:
                existing.seek(-1, os.SEEK_END)
                if existing.read(1) != b"\n":
                    lines = "\n" + lines
        handle.write(lines.encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())


def iter_jsonl(path: str | Path, on_error: Literal["raise", "skip"] = "raise") -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-empty line, read line by line. `raise` (input a user gave): a line that
    is not a JSON object, or a file that is missing or not UTF-8, is a one-line GeoPilotInputError
    `FILE line N: not JSON (...)`. `skip` (a log we append to): such lines are passed over (their work is done
    again) and a missing file is empty."""
    path = Path(path)
    if not path.is_file():
        if on_error == "skip":
            return
        raise GeoPilotInputError(f"{path}: no such file")
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            if not raw.strip():
                continue
            try:
                record = parse_json_object(raw.decode("utf-8-sig" if number == 1 else "utf-8"), f"{path} line {number}")
            except UnicodeDecodeError:
                if on_error == "skip":
                    continue
                raise GeoPilotInputError(f"{path} line {number}: not UTF-8 text (expected JSON lines)") from None
            except GeoPilotInputError:
                if on_error == "skip":
                    continue
                raise
            yield number, record
