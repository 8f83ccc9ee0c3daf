"""`geopilot eval referring` (geopilot.eval.task_cli)."""

from geopilot.eval.task_cli import COMMAND

add_arguments = COMMAND["referring"].add_arguments
run = COMMAND["referring"].run
