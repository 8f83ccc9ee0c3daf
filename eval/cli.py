"""`geopilot eval <command>`: GeoPilotBench's table, dispatched by `geopilot/cli.py` like every level.

The benchmark tasks' commands are generated from `geopilot.eval.benchmark_tasks.TASKS` (one entry there adds a task, with its
summary written once); the other commands are modules with `add_arguments(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

from geopilot.cli import Command
from geopilot.eval.benchmark_tasks import TASKS
from geopilot.eval.task_cli import CAPTIONS, REFERRING_ANSWERS, TOOLS_E2E, task_command

COMMANDS: dict[str, tuple[str, str] | Command] = {
    "planning": ("geopilot.eval.planning_cli", "task planning (TSA/PA/NTA/OPA) of an agent over the planning set"),
    "build-planning": ("geopilot.eval.build_cli", "rebuild the 500-query planning set over a folder of images"),
    "build-chains": (
        "geopilot.eval.build_chains_cli",
        "rebuild the chain suite chains_v1 (cases, images, annotations)",
    ),
    "build-change": (
        "geopilot.eval.build_change_cli",
        "rebuild the change question set change_v1 (two-image cases and their pairs)",
    ),
    "change-masks": (
        "geopilot.eval.change_masks_cli",
        "detect_changes standalone on a LEVIR-CD split: precision/recall/F1/IoU of the changed class",
    ),
    "build-indicators": (
        "geopilot.eval.indicator_suite",
        "the indicator case suite over a `geopilot synth-region` folder",
    ),
    "lmms-tasks": ("geopilot.eval.lmms_tasks_cli", "print the folder of GeoPilot's lmms-eval tasks (--include_path)"),
    "leaderboard": ("geopilot.eval.leaderboard_cli", "compare run folders: Tables 5-7 + paired bootstrap CIs"),
    **{name: task_command(task) for name, task in TASKS.items()},
    "captions": CAPTIONS,
    "referring-answers": REFERRING_ANSWERS,
    "tools-e2e": TOOLS_E2E,
}
