"""Train GeoPilot: one stage of the two-stage curriculum (docs/design.md §6), resumable, on 1..N processes.

    python train.py --config configs/tiny/stage1.yaml [key=value ...]
    torchrun --nproc_per_node 8 train.py --config configs/stage2.yaml
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 train.py --config ...

The same command as `geopilot train` (geopilot/commands/train.py; also `python -m geopilot.commands.train`); this
file is the entry point a checkout runs. The recipe is geopilot/training/recipe.py: docs/training.md describes both.
"""

from __future__ import annotations

import sys

from geopilot.commands.train import main, parse_args, train

__all__ = ["main", "parse_args", "train"]

if __name__ == "__main__":
    sys.exit(main())
