"""Run a `geopilot` command the way a user does (a fresh process) and measure it: exit code, stdout, stderr, wall
time and the command's own peak RSS, for the hostile-input tests (tests/hardening/)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# A middle process runs the command and reports its child's peak RSS (RUSAGE_CHILDREN counts only the command,
# whatever the test process itself has run before), and the exit status, even a signal's.
_MEASURE = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[2:])\n"
    "peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "open(sys.argv[1], 'w').write(f'{done.returncode} {peak_kb}')\n"
)
WALL_LIMIT_S = 60.0  # generous: the shared test machine is slow; the bugs took minutes or never ended
RSS_LIMIT_MB = 1500.0  # generous: the bugs took 2.7 to 9 GB


@dataclass(frozen=True)
class Run:
    code: int
    stdout: str
    stderr: str
    seconds: float
    peak_mb: float

    def refused(self) -> str:
        """Assert the run is a refusal as the project keeps them: exit 2, one line on stderr, no traceback, in
        bounded time and memory; returns that line."""
        lines = self.stderr.strip().splitlines()
        assert self.code == 2, f"exit {self.code}, stderr: {self.stderr[-2000:]}"
        assert len(lines) == 1, f"{len(lines)} lines on stderr: {self.stderr[-2000:]}"
        assert "Traceback" not in self.stderr and len(lines[0]) < 2500, lines[0][:500]
        assert self.seconds < WALL_LIMIT_S, f"took {self.seconds:.1f} s"
        assert self.peak_mb < RSS_LIMIT_MB, f"peak RSS {self.peak_mb:.0f} MB"
        return lines[0]


def run_cli(
    args: list[str],
    tmp_path: Path,
    env: dict[str, str] | None = None,
    timeout_s: float = 2 * WALL_LIMIT_S,
    module: str = "geopilot.cli",
) -> Run:
    """`geopilot ARGS` (or `python -m MODULE ARGS`: `geopilot.training.recipe` is train.py) in a fresh process, run
    from `tmp_path` with `env` added to the environment, measured."""
    report = tmp_path / f".measure-{time.monotonic_ns()}"
    command = [sys.executable, "-c", _MEASURE, str(report), sys.executable, "-m", module, *map(str, args)]
    started = time.monotonic()
    done = subprocess.run(
        command,
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    seconds = time.monotonic() - started
    code, peak_kb = (int(v) for v in report.read_text().split())
    report.unlink()
    return Run(code, done.stdout, done.stderr, seconds, peak_kb / 1024)


def not_a_small_file(path: Path, kind: str) -> Path:
    """Make `path` a file a command must refuse to read, of one `kind`: "fifo" (a read would block), "sparse" (2 GB
    claimed, nothing on disk), "folder", "dev_zero" (an endless character device) or "missing"; returns the path to
    pass (`/dev/zero` for "dev_zero"). Any other kind leaves `path` to the caller."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "sparse":
        with path.open("wb") as handle:
            handle.truncate(2 * 2**30)
    elif kind == "folder":
        path.mkdir()
    return Path("/dev/zero") if kind == "dev_zero" else path
