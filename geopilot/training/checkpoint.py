"""Atomic, resumable checkpoints on top of accelerate's `save_state`/`load_state`.

Layout under `<output_dir>/checkpoints/`:
    step-00000012/      accelerate state (model, optimizer, scheduler, RNG of every process; DeepSpeed shards)
                        + trainer_state.json (data position, data counts, seed, and a manifest of file sizes)
    latest              the name of the newest complete checkpoint
    best                the name of the best evaluated one (checkpoint.keep_best), kept beside the last `keep_last`
A checkpoint is written into `.tmp-step-N/`, fsynced, and renamed to `step-N/` only once every process has
finished; `latest` is replaced after that. A crash at any moment leaves either the previous checkpoint or the new
one, never a half of one: temp dirs are never candidates, and a dir whose files do not match its manifest
(truncated, copied half-way) is rejected with a warning and an older complete one is used.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from geopilot.errors import GeoPilotInputError
from geopilot.fileio import atomic_write, fsync_path

STATE_FILE = "trainer_state.json"
LATEST_FILE = "latest"
BEST_FILE = "best"
PREFIX = "step-"

log = logging.getLogger("geopilot.train")


class CheckpointError(GeoPilotInputError):
    """Checkpoints exist but none is complete, or the complete one belongs to a different run."""


def _manifest(directory: Path) -> dict[str, int]:
    return {
        str(p.relative_to(directory)): p.stat().st_size
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != STATE_FILE
    }


class CheckpointStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    @staticmethod
    def name(step: int) -> str:
        return f"{PREFIX}{step:08d}"

    def save(
        self,
        accelerator,
        state: dict,
        keep_last: int,
        before_commit: Callable[[], None] | None = None,
        best: str | None = None,
    ) -> Path:
        """Collective: every process calls it. `before_commit` (tests) runs on the main process mid-write; `best`
        names the checkpoint that pruning keeps (written to `best` once this one is committed)."""
        step = state["step"]
        staging, final = self.root / f".tmp-{self.name(step)}", self.root / self.name(step)
        if accelerator.is_main_process:
            for stale in self.root.glob(f".tmp-{PREFIX}*"):  # left by a crash during an earlier save
                shutil.rmtree(stale, ignore_errors=True)
            staging.mkdir(parents=True)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(staging))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            if before_commit is not None:
                before_commit()
            manifest = _manifest(staging)
            for relative in manifest:
                fsync_path(staging / relative)
            atomic_write(staging / STATE_FILE, json.dumps({**state, "manifest": manifest}, indent=1))
            fsync_path(staging)
            if final.exists():  # re-saving a step after a resume: the new one replaces it whole
                shutil.rmtree(final)
            os.replace(staging, final)
            fsync_path(self.root)
            atomic_write(self.root / LATEST_FILE, final.name + "\n")
            if best is not None:
                atomic_write(self.root / BEST_FILE, best + "\n")
            self._prune(keep_last, best)
        accelerator.wait_for_everyone()
        return final

    def _prune(self, keep_last: int, best: str | None = None) -> None:
        complete = sorted(p for p in self.root.glob(f"{PREFIX}*") if p.is_dir())
        for old in complete[:-keep_last]:
            if old.name == best:
                continue
            shutil.rmtree(old, ignore_errors=True)

    def verify(self, directory: Path) -> tuple[dict | None, str]:
        """(state, "") for a complete checkpoint, else (None, why not)."""
        state_path = directory / STATE_FILE
        if not state_path.is_file():
            return None, f"no {STATE_FILE} (never finished)"
        try:
            state = json.loads(state_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            return None, f"{STATE_FILE} is not valid JSON"
        for relative, size in state.get("manifest", {}).items():
            path = directory / relative
            if not path.is_file():
                return None, f"{relative} is missing"
            if path.stat().st_size != size:
                return None, f"{relative} has {path.stat().st_size} bytes, expected {size} (truncated)"
        return state, ""

    def best(self) -> Path | None:
        """The checkpoint `best` names, when there is one."""
        path = self.root / BEST_FILE
        return self.root / path.read_text(encoding="utf-8").strip() if path.is_file() else None

    def find_resumable(self) -> tuple[Path, dict] | None:
        """The newest complete checkpoint, preferring the one `latest` names; None when there is none at all."""
        candidates = sorted((p for p in self.root.glob(f"{PREFIX}*") if p.is_dir()), reverse=True)
        latest = self.root / LATEST_FILE
        if latest.is_file():
            named = self.root / latest.read_text(encoding="utf-8").strip()
            candidates = [named] + [c for c in candidates if c != named]
        rejected = []
        for directory in candidates:
            state, why = self.verify(directory)
            if state is not None:
                for name, reason in rejected:
                    log.warning(
                        "checkpoint %s is incomplete (%s); resuming from %s instead", name, reason, directory.name
                    )
                return directory, state
            rejected.append((directory.name, why))
        if rejected:
            details = "; ".join(f"{name}: {why}" for name, why in rejected)
            raise CheckpointError(
                f"no complete checkpoint in {self.root} ({details}); delete the incomplete ones to resume from "
                "the start, or use a new output_dir"
            )
        return None
