"""`geopilot eval sar-vqa` (geopilot.eval.task_cli)."""

from geopilot.eval.task_cli import COMMAND

add_arguments = COMMAND["sar-vqa"].add_arguments
run = COMMAND["sar-vqa"].run
