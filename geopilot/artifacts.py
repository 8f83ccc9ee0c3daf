"""Artefact files of tool calls (restored images, charts): where they go and how they are written.

- Where: the configured `artifacts_dir`, else a private directory of this process (`tempfile.mkdtemp`, mode 0700),
  created on first use. Never a shared, predictable folder such as `/tmp/geopilot-artifacts`.
- How: the writer fills a file inside a fresh private staging folder (0700, inside the artefact directory), then
  the file is hard-linked to a new unique name (`<stem>-<random>.<suffix>`). A link never follows or replaces
  what is at the target (an existing name, a planted symlink: `FileExistsError`, and another name is drawn), so
  a published artefact is complete, is a new file, and nothing already there is overwritten or written through.
- A cancelled call (`geopilot.cancellation`) publishes nothing: the check comes after writing, before linking.
- How many: `prune_artifacts` keeps the newest N of one kind (`<stem>-<hex><suffix>`) and never touches other files,
  so a long-running server's folder stays bounded.

    path = publish_artifact(artifacts_dir, "remove_clouds", ".png", lambda target: image.save(target))
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from geopilot.cancellation import check_cancelled

_PRIVATE: dict[int, Path] = {}  # pid -> this process's private artefact directory
_LOCK = threading.Lock()
NAME_ATTEMPTS = 16


def private_artifacts_dir() -> Path:
    """This process's own artefact directory (mode 0700), made on first use."""
    with _LOCK:
        pid = os.getpid()
        if pid not in _PRIVATE or not _PRIVATE[pid].is_dir():
            _PRIVATE[pid] = Path(tempfile.mkdtemp(prefix="geopilot-artifacts-"))
        return _PRIVATE[pid]


def artifacts_dir(configured: str | Path | None) -> Path:
    """The configured directory, or this process's private one."""
    return Path(configured) if configured else private_artifacts_dir()


def publish_artifact(directory: str | Path, stem: str, suffix: str, write: Callable[[Path], None]) -> Path:
    """Write a new artefact with `write(path)` and publish it under a fresh name in `directory`; returns its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=directory))  # 0700: nobody else can touch the file
    try:
        staged = staging / f"artifact{suffix}"
        write(staged)
        os.chmod(staged, 0o644)
        check_cancelled()  # a call given up on publishes nothing
        for _ in range(NAME_ATTEMPTS):
            target = directory / f"{stem}-{secrets.token_hex(6)}{suffix}"
            try:
                os.link(staged, target)
            except FileExistsError:  # taken (or planted): draw another name, never write through it
                continue
            return target.resolve()
        raise FileExistsError(f"no free artefact name in {directory} after {NAME_ATTEMPTS} attempts")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def prune_artifacts(directory: str | Path, stem: str, suffix: str, keep: int) -> int:
    """Delete all but the newest `keep` artefacts named `<stem>-<12 hex><suffix>` in `directory`; returns how many
    went. Files of any other name are never touched."""
    pattern = re.compile(rf"{re.escape(stem)}-[0-9a-f]{{12}}{re.escape(suffix)}")
    ours = []
    for path in Path(directory).iterdir():
        if pattern.fullmatch(path.name) and path.is_file() and not path.is_symlink():
            try:
                ours.append((path.stat().st_mtime_ns, path.name, path))
            except FileNotFoundError:  # pruned by another thread meanwhile
                continue
    ours.sort(reverse=True)
    for _, _, path in ours[keep:]:
        path.unlink(missing_ok=True)
    return max(0, len(ours) - keep)
