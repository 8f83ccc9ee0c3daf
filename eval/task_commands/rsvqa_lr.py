"""`geopilot eval rsvqa-lr` (geopilot.eval.task_cli)."""

from geopilot.eval.task_cli import COMMAND

add_arguments = COMMAND["rsvqa-lr"].add_arguments
run = COMMAND["rsvqa-lr"].run
