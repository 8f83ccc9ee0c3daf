"""`geopilot eval tools-e2e` (geopilot.eval.task_cli)."""

from geopilot.eval.task_cli import COMMAND

add_arguments = COMMAND["tools-e2e"].add_arguments
run = COMMAND["tools-e2e"].run
