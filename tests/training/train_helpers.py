"""argv builders for in-process `train.main` runs on the tiny configs, and a run that SIGKILLs itself.

python tests/training/train_helpers.py STEP EVENT <train.py args>   # train.main(args, on_step=kill_at(STEP, EVENT))
With KILL_NODE_OF_RANK=r in the environment only global rank r dies, taking its torchrun agent with it (a node lost).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Small, fast runs: batch 4 = 2 per device x 2 accumulation, short max_length, checkpoints every 2 steps.
TINY = [
    "optim.per_device_batch_size=2",
    "optim.global_batch_size=4",
    "optim.lr=1e-3",
    "logging.progress_bar=false",
    "checkpoint.save_steps=2",
    "logging.logging_steps=1",
]


def stage1_args(data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--config",
        str(ROOT / "configs/tiny/stage1.yaml"),
        f"output_dir={out}",
        f"data.files=[{data}]",
        f"data.cache_dir={out.parent / 'cache'}",
        *TINY,
        *extra,
    ]


def stage2_args(data: Path, out: Path, stage1_export: Path, *extra: str) -> list[str]:
    return [
        "--config",
        str(ROOT / "configs/tiny/stage2.yaml"),
        f"output_dir={out}",
        f"data.files=[{data}]",
        f"model.llava_path={stage1_export}",
        f"data.cache_dir={out.parent / 'cache'}",
        *TINY,
        *extra,
    ]


def kill_at(step: int, event: str):
    """A train.py step callback that SIGKILLs the process at (step, event), as a pre-emption would."""

    victim = os.environ.get("KILL_NODE_OF_RANK")

    def on_step(at: int, what: str) -> None:
        if (at, what) != (step, event):
            return
        if victim is None:
            os.kill(os.getpid(), signal.SIGKILL)
        elif os.environ.get("RANK") == victim:
            os.kill(os.getppid(), signal.SIGKILL)  # the node's torchrun agent first, then this worker
            os.kill(os.getpid(), signal.SIGKILL)

    return on_step


def run_killed(step: int, event: str, args: list[str]) -> subprocess.CompletedProcess:
    """train.main(args) in a fresh process whose step callback SIGKILLs it at (step, event)."""
    env = {**os.environ, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        [sys.executable, __file__, str(step), event, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    import train

    sys.exit(train.main(sys.argv[3:], on_step=kill_at(int(sys.argv[1]), sys.argv[2])))
