"""`geopilot eval rsvqa-hr` (geopilot.eval.task_cli)."""

from geopilot.eval.task_cli import COMMAND

add_arguments = COMMAND["rsvqa-hr"].add_arguments
run = COMMAND["rsvqa-hr"].run
