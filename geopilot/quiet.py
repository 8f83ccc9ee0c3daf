"""A quiet console: the libraries' own progress bars and routine lines off, so what a user reads is the project's
one progress bar per phase and its results. `--verbose` (any `geopilot` command, `train.py`) keeps everything.

Called by the entry points before they import the libraries: the progress-bar switches are environment variables
the libraries read when imported (subprocesses inherit them), the rest are logging levels and one filter.
"""

from __future__ import annotations

import logging
import os

PROGRESS_BAR_SWITCHES = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' "Loading weights" / "Writing model shards" bars
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",  # datasets' "Saving the dataset" bars
}
ROUTINE_LOGGERS = ("accelerate",)  # six INFO lines per saved checkpoint ("Saving current state to ...")
# DeepSpeed warns on every import on a machine without a GPU; running on the CPU is this project's normal case
EXPECTED_WARNINGS = {"DeepSpeed": "Setting accelerator to CPU"}


def quiet_libraries(verbose: bool = False) -> None:
    if verbose:
        return
    for name, value in PROGRESS_BAR_SWITCHES.items():
        os.environ.setdefault(name, value)
    for name in ROUTINE_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name, text in EXPECTED_WARNINGS.items():
        logging.getLogger(name).addFilter(lambda record, text=text: text not in record.getMessage())
