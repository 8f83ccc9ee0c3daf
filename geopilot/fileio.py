"""Durable small-file writes, bounded reads and JSON lines: the one atomic-write helper (checkpoints, generation
shards, reports, caches, exported files), the one bounded whole-file read of a file the user names
(`read_bounded`), the one append to a JSONL log (`append_jsonl`), the one JSONL reader (`iter_jsonl`: strict for
user input, lenient for a log we wrote), and the one settings fingerprint.

`staged` hands out a sibling temp path (hidden, named with the process id so concurrent writers never share one);
when the block ends it is fsynced, renamed over the target (atomic on POSIX) and the folder fsynced, so after a
crash or a failed write a reader sees the old file or the new one, never a torn mix or a half file.
`read_bounded` reads regular files only (a FIFO would hang, /dev/zero never ends) and refuses one over the limit
suited to its kind (its size from the header, sparse files included), naming the limit.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from geopilot.errors import ConfigError, GeoPilotInputError, WeightsError, echo


def fsync_path(path: str | Path) -> None:
    """fsync a file or a folder (a folder's fsync makes a rename inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


MiB = 2**20
JSONL_LINE_MAX_BYTES = 64 * MiB  # one JSONL record (a sample with its masks is KBs)


@contextlib.contextmanager
def staged(path: str | Path) -> Iterator[Path]:
    """A temp path beside `path` (same suffix, so writers that choose a format by it still do) that becomes `path`
    when the block ends without an error; nothing is left behind when it fails."""
    path = Path(path)
    staging = path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")
    try:
        yield staging
        fsync_path(staging)
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)  # only still there when writing or renaming failed
    fsync_path(path.parent)


def atomic_write(path: str | Path, text: str) -> None:
    with staged(path) as staging:
        staging.write_text(text, encoding="utf-8")


def overwrites_input(out: str | Path, inputs: Iterable[str | Path]) -> str | None:
    """The input that writing `out` would overwrite (the same path after symlinks, or a hard link to it), or None."""
    out = Path(out)
    for given in inputs:
        path = Path(given)
        if out.resolve() == path.resolve() or (out.exists() and path.exists() and os.path.samefile(out, path)):
            return str(given)
    return None


def file_kind(mode: int) -> str:
    """What a stat mode says a path is, for "is a FIFO, not a regular file" messages."""
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "a regular file" if stat.S_ISREG(mode) else "special")


def regular_file(path: str | Path, what: str) -> os.stat_result:
    """The stat of `path` (symlinks followed) when it is a regular file; else a one-line GeoPilotInputError naming
    `what` was looked for and where."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise GeoPilotInputError(f"{what} not found: {echo(str(path))} does not exist") from None
    except OSError as err:
        raise GeoPilotInputError(f"{what} {echo(str(path))}: cannot be read ({err.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise GeoPilotInputError(f"{what} is {file_kind(info.st_mode)}, not a regular file: {echo(str(path))}")
    return info


def read_bounded(path: str | Path, limit: int, what: str) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; a one-line GeoPilotInputError otherwise."""
    size = regular_file(path, what).st_size
    too_big = f"{what} over the limit of {limit:,} bytes"  # the limit first: callers may cut a long message
    if size > limit:
        raise GeoPilotInputError(f"{too_big} ({size:,} bytes): {echo(str(path))}")
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)  # a file that grew since the stat is still cut at the limit
    except OSError as err:
        raise GeoPilotInputError(f"{what} {echo(str(path))}: cannot be read ({err.strerror})") from None
    if len(data) > limit:
        raise GeoPilotInputError(f"{too_big}: {echo(str(path))}")
    return data


def read_json(path: str | Path, limit: int, what: str):
    """The JSON value of a file the user names (`read_bounded` first), or a one-line GeoPilotInputError: not a
    regular file, over `limit`, not UTF-8, not JSON, nested too deep for the parser."""
    data = read_bounded(path, limit, what)
    try:
        return json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise GeoPilotInputError(f"{what} {echo(str(path))}: cannot be read as JSON (not UTF-8 text)") from None
    except json.JSONDecodeError as err:
        raise GeoPilotInputError(
            f"{what} {echo(str(path))}: cannot be read as JSON (not valid JSON: {err.msg} at line {err.lineno})"
        ) from None
    except RecursionError:
        raise GeoPilotInputError(f"{what} {echo(str(path))}: JSON nested too deep to read") from None


def parse_json_object(text: str, where: str) -> dict:
    """One JSON object given by the user (a JSONL line, a `--params` value), or a one-line `GeoPilotInputError`
    that starts with `where`: `cases.jsonl line 3: not JSON (Expecting value)`."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise GeoPilotInputError(f"{where}: not JSON ({err.msg})") from None
    except RecursionError:
        raise GeoPilotInputError(f"{where}: JSON nested too deep to read") from None
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
    if not path.exists():
        if on_error == "skip":
            return
        raise GeoPilotInputError(f"{path}: no such file")
    regular_file(path, "JSON lines file")  # a FIFO would hang, a directory is not one
    with path.open("rb") as handle:
        for number, raw in enumerate(iter(lambda: handle.readline(JSONL_LINE_MAX_BYTES + 1), b""), 1):
            if len(raw) > JSONL_LINE_MAX_BYTES:
                if on_error == "raise":
                    raise GeoPilotInputError(f"{path} line {number}: over {JSONL_LINE_MAX_BYTES:,} bytes, no record")
                while raw and not raw.endswith(b"\n"):  # pass over the rest of the line, a block at a time
                    raw = handle.readline(JSONL_LINE_MAX_BYTES)
                continue
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


def require_dir(path: str | None, what: str) -> Path:
    """A model config's directory `what`: unset is a ConfigError, absent a WeightsError (one line each)."""
    if not path:
        raise ConfigError(f"model config needs {what}")
    if not Path(path).is_dir():
        raise WeightsError(f"{what} directory not found: {path}")
    return Path(path)
