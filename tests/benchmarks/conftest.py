"""The benchmark scripts run as `python benchmarks/<name>.py`: their folder is on sys.path, as it is for them."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
