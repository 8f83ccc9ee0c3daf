"""`geopilot eval captions` (geopilot.eval.task_cli)."""

from geopilot.eval.task_cli import COMMAND

add_arguments = COMMAND["captions"].add_arguments
run = COMMAND["captions"].run
