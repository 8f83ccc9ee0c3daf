"""`geopilot train --config <yaml> [key=value ...]`: one stage of the two-stage curriculum (docs/design.md §6).

The command line of the recipe (geopilot/training/recipe.py); `train.py` at the top of the checkout and
`python -m geopilot.commands.train` (what torchrun launches) are the same command:

    geopilot train --config configs/tiny/stage1.yaml [key=value ...]
    torchrun --nproc_per_node 8 -m geopilot.commands.train --config configs/stage2.yaml

Exit codes: 0 done, 2 bad input (config, data, checkpoint; one line on stderr), 1 anything else. This is the layer
that wires evaluation into training: with `eval.planning_cases` set it hands the recipe geopilot.eval's planning
probe. `main(argv, on_step)` passes `on_step` to `train` (the resume tests kill the process from it).
"""

from __future__ import annotations

import argparse
import sys

from geopilot.config import add_override_arguments, parse_command_line
from geopilot.errors import GeoPilotInputError, echo, one_line
from geopilot.training.config import TrainConfig, load_train_config
from geopilot.training.recipe import StepCallback
from geopilot.training.recipe import train as train_stage


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", required=True, help="training YAML (configs/stage1.yaml, configs/tiny/stage1.yaml, ...)"
    )
    add_override_arguments(parser, "optim.max_steps=10 data.replay_alpha=0.5")


def parse_args(argv: list[str] | None, prog: str = "train.py") -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description="Train one stage of GeoPilot.")
    add_arguments(parser)
    parser.add_argument("--verbose", action="store_true", help="keep the libraries' progress bars and routine lines")
    return parse_command_line(parser, argv)


def train(cfg: TrainConfig, on_step: StepCallback | None = None) -> int:
    """The recipe with the planning probe wired in (evaluation is imported only when the config asks for it)."""
    probe = None
    if cfg.eval.planning_cases:
        from geopilot.eval.planning_probe import PlanningProbe

        probe = PlanningProbe
    return train_stage(cfg, on_step, probe)


def run(args: argparse.Namespace, on_step: StepCallback | None = None) -> int:
    try:
        return train(load_train_config(args.config, args.overrides), on_step)
    except PermissionError as err:  # a tracking folder or shared cache another user owns: say which, not a traceback
        where = f" {echo(str(err.filename))}" if err.filename else ""
        raise GeoPilotInputError(
            f"no permission to use{where} ({err.strerror or err}); choose an output_dir and data.cache_dir this "
            "user can write"
        ) from None


def main(argv: list[str] | None = None, on_step: StepCallback | None = None) -> int:
    from geopilot.quiet import quiet_libraries

    args = parse_args(argv)
    quiet_libraries(args.verbose)
    try:
        return run(args, on_step)
    except GeoPilotInputError as err:
        print(f"train.py: error: {one_line(err)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
