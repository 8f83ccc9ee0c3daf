"""`geopilot` subcommands; each module has `add_arguments(parser)` and `run(args) -> int` (see geopilot/cli.py)."""
