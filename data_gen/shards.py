"""Generation spread over many machines (issue 31 item 5): which jobs a shard holds, what identifies a run, and the
lock that keeps two processes from writing one output folder.

`--shard i/N` keeps the jobs whose stable hash (sha256 of the sample id) is i modulo N, in the run's job order, with
their global job index, so the N shards together are exactly the single-process run and `geopilot generate merge`
can put them back in order. A run's identity (`run.json`, a `geopilot.run_dir.RunDir` record) is what decides its
samples, its shard and the code version; a resume or a merge with a different one is refused with what differs.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from geopilot.data_gen.generate_config import GenerateConfig
from geopilot.errors import ConfigError, GeoPilotInputError, first_line
from geopilot.run_dir import RunDir


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    def holds(self, sample_id: str) -> bool:
        return job_hash(sample_id) % self.count == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def job_hash(sample_id: str) -> int:
    return int.from_bytes(hashlib.sha256(sample_id.encode("utf-8")).digest()[:8], "big")


def parse_shard(text: str) -> Shard:
    """`"2/8"` -> Shard(2, 8); ConfigError (exit 2) for anything else, N < 1 or i outside 0..N-1."""
    index, sep, count = text.partition("/")
    try:
        shard = Shard(int(index), int(count))
    except ValueError:
        raise ConfigError(f"--shard {text!r} is not i/N (e.g. 0/4)") from None
    if not sep or shard.count < 1 or not 0 <= shard.index < shard.count:
        raise ConfigError(f"--shard {text!r}: N must be >= 1 and i in 0..N-1")
    return shard


def code_version() -> str:
    """The package version plus a digest of the code and prompts a sample depends on (data_gen, tools, the core's
    top-level modules and vocabulary): shards made by different code are never merged into one dataset."""
    import geopilot
    import geopilot.data_gen
    import geopilot.tools

    digest = hashlib.sha256()
    roots = [(Path(geopilot.data_gen.__file__).parent, "**/*"), (Path(geopilot.tools.__file__).parent, "**/*")]
    roots.append((Path(geopilot.__file__).parent, "*"))
    for folder, pattern in roots:
        for path in sorted(folder.glob(pattern)):
            if path.is_file() and path.suffix in (".py", ".txt", ".yaml", ".json") and "__pycache__" not in path.parts:
                digest.update(f"{folder.name}/{path.relative_to(folder).as_posix()}\0".encode())
                digest.update(path.read_bytes())
    return f"{geopilot.__version__}+{digest.hexdigest()[:12]}"


def run_dir(out_dir: Path, config: GenerateConfig, shard: Shard | None, code: str | None = None) -> RunDir:
    """The output folder's identity (`run.json`): what decides the samples, the shard and the code version (`code`:
    that of the shards a merge joins; default this code's)."""
    settings = {
        "config": config.content_settings(),
        "shard": str(shard) if shard else None,
        "code_version": code or code_version(),
    }
    return RunDir(
        out_dir,
        settings,
        "run.json",
        "generate run",
        extra={"config": config.model_dump(mode="json")},  # the whole config, run-only keys too: what merge rebuilds
        own_files=frozenset({".lock"}),
        legacy=_released_run,
        error=ConfigError,
    )


def recorded_settings(run: dict) -> dict:
    """The identity a run.json records, also one written before run folders had one format (`{config_hash, shard,
    code_version, config}`; one without a code version matches any)."""
    if "settings" in run:
        return run["settings"]
    try:
        config = GenerateConfig.model_validate(run["config"])
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"a run.json from an older release without a readable config ({first_line(err)})") from None
    return {
        "config": config.content_settings(),
        "shard": run.get("shard"),
        "code_version": run.get("code_version", code_version()),
    }


def _released_run(out_dir: Path, record: dict | None) -> dict | None:
    return None if record is None else recorded_settings(record)


class RunLock:
    """An exclusive, non-blocking flock on `<out>/.lock` for the whole run: a second writer of the same folder is
    refused at once (never interleaved). The kernel drops the lock when its process dies, so a killed run's folder
    is free again. On NFS, flock needs a lock manager (lockd / NFSv4), as Slurm clusters normally have."""

    def __init__(self, out_dir: Path):
        self.path = Path(out_dir) / ".lock"
        self.handle = None

    def __enter__(self) -> RunLock:
        handle = self.path.open("a+", encoding="utf-8")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise GeoPilotInputError(
                f"{self.path.parent} is being written by {holder}; one process per output folder (shard)"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
        handle.flush()
        self.handle = handle
        return self

    def __exit__(self, *exc) -> None:
        if self.handle is not None:
            fcntl.flock(self.handle.fileno(), fcntl.LOCK_UN)
            self.handle.close()
            self.handle = None
