"""`geopilot eval sar-caption` (geopilot.eval.task_cli)."""

from geopilot.eval.task_cli import COMMAND

add_arguments = COMMAND["sar-caption"].add_arguments
run = COMMAND["sar-caption"].run
