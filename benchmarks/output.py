"""How every benchmark ends: its report as JSON with `--json` (what gpu_check.py and scripts read), else its text."""

from __future__ import annotations

import json
from collections.abc import Callable


def emit(report: dict, as_json: bool, text: Callable[[], None]) -> int:
    """Print `report` as JSON, or call `text()` to print it for a reader; the exit code, 0."""
    if as_json:
        print(json.dumps(report, indent=1))
    else:
        text()
    return 0
