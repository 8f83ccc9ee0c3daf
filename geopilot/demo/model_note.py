"""DIR/model/geopilot_demo.json: what the demo says about the model it published, read back by `geopilot chat`.

A quick-preset model learned nothing; `geopilot chat` says so once and stops its generation at the demo's own
per-turn length instead of decoding hundreds of tokens of noise.
"""

from __future__ import annotations

import json
from pathlib import Path

NOTE_FILE = "geopilot_demo.json"


def write_model_note(model_dir: Path, preset: str, notice: str | None, max_new_tokens: int) -> None:
    note = {"preset": preset, "notice": notice, "max_new_tokens": max_new_tokens}
    (model_dir / NOTE_FILE).write_text(json.dumps(note, indent=1) + "\n", encoding="utf-8")


def read_model_note(model_dir: str | Path) -> dict:
    """The note of a demo model ({} for any other model, or a note that cannot be read)."""
    try:
        note = json.loads((Path(model_dir) / NOTE_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return note if isinstance(note, dict) else {}
