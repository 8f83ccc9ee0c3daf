"""`geopilot eval lmms-tasks`: print the folder of GeoPilot's lmms-eval task YAMLs, for lmms-eval's --include_path.

    python -m lmms_eval --model geopilot --model_args pretrained=DIR --tasks geopilot_planning \
        --include_path "$(geopilot eval lmms-tasks)"
"""

from __future__ import annotations

import argparse
from importlib.resources import files
from pathlib import Path


def tasks_folder() -> Path:
    """The shipped task folder (geopilot/eval/lmms_tasks: the YAMLs, their utils.py and placeholder.jsonl)."""
    return Path(str(files("geopilot.eval") / "lmms_tasks"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    print(tasks_folder())
    return 0
