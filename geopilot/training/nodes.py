"""Checks that make one job out of several nodes: the same config and code everywhere, the same checkpoint seen.

torchrun's rendezvous only matches node counts; a node started from another checkout or with another override would
train silently on a different recipe. Right after the process group exists every process shares what it runs and
all of them refuse, naming the difference, before any data or weights are read. Checkpoints are written once
(rank 0 commits) and read by every node, so `output_dir` must be on a filesystem every node shares: a node that
does not see rank 0's checkpoint is refused the same way (docs/training.md, "Several nodes").
"""

from __future__ import annotations

import hashlib
import socket
from importlib import resources
from pathlib import Path

from geopilot.errors import ConfigError
from geopilot.training.config import TrainConfig


def code_version() -> str:
    """sha256 over the package's Python sources: equal on every node that runs the same code, git or not."""
    digest = hashlib.sha256()
    root = Path(str(resources.files("geopilot")))
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _flat(value: object, prefix: str = "") -> dict[str, object]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{prefix}{key}.").items()}
    return {prefix[:-1]: value}


def job_identity(cfg: TrainConfig) -> dict:
    return {"host": socket.gethostname(), "code": code_version(), "config": _flat(cfg.model_dump(mode="json"))}


def differences(reference: dict, other: dict) -> list[str]:
    found = []
    if reference["code"] != other["code"]:
        found.append(f"code version {reference['code']} vs {other['code']}")
    old, new = reference["config"], other["config"]
    found += [
        f"{k}: {old.get(k)!r} vs {new.get(k)!r}" for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)
    ]
    return found


def check_same_job(accelerator, cfg: TrainConfig) -> None:
    """Collective. Every process compares its config and code with rank 0's; any difference stops them all."""
    if accelerator.num_processes == 1:
        return
    from accelerate.utils import gather_object

    identities = gather_object([job_identity(cfg)])
    for rank, identity in enumerate(identities[1:], start=1):
        found = differences(identities[0], identity)
        if found:
            raise ConfigError(
                f"rank {rank} on {identity['host']} runs another job than rank 0 on {identities[0]['host']}: "
                f"{'; '.join(found[:5])}{' ...' if len(found) > 5 else ''}; start every node with the same "
                "checkout and command"
            )


def check_same_checkpoint(accelerator, resume) -> None:
    """Collective. Every process must resume from the same checkpoint (a shared output_dir)."""
    if accelerator.num_processes == 1:
        return
    from accelerate.utils import gather_object

    from geopilot.training.checkpoint import CheckpointError

    seen = gather_object([None if resume is None else resume[0].name])
    if len(set(seen)) > 1:
        views = ", ".join(f"rank {r}: {name or 'none'}" for r, name in enumerate(seen))
        raise CheckpointError(
            f"the processes see different checkpoints in output_dir ({views}): output_dir must be on a "
            "filesystem every node shares (docs/training.md)"
        )
