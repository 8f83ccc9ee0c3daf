"""One module per `geopilot eval` benchmark subcommand (the table in `eval/cli.py` names modules); each binds
`add_arguments` / `run` from `geopilot.eval.task_cli.COMMAND`."""
