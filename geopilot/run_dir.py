"""One folder, one run: the guard every resumable command (demo, eval, generate) puts on its output folder.

A run folder holds a small JSON record `{"fingerprint": ..., "settings": {...}}` written when the run starts. A later
start with the same settings resumes it; one with other settings is refused naming the settings that differ; a
non-empty folder without a record is refused. A folder written before the record existed is read by the site's
`legacy` function, which returns the settings that run was started with (then it is resumed or refused like any
other, and the record is written) or raises one line saying why it cannot tell: never silently restarted.

The match is on the settings themselves (`fileio.fingerprint` of the stored settings), so a record whose stored
fingerprint was made by an older formula (the demo's `demo.json`) is understood, and rewritten on resume.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from geopilot.errors import GeoPilotInputError
from geopilot.fileio import atomic_write, fingerprint

_SHOWN = 40  # characters of a differing value shown in a refusal


def changed_settings(old: dict, new: dict) -> list[str]:
    """`key: old -> new` for every setting that differs, nested keys dotted (`backend.model`), sorted by key."""
    old, new = _flat(old), _flat(new)
    return [
        f"{key}: {_short(old, key)} -> {_short(new, key)}" for key in sorted(old | new) if old.get(key) != new.get(key)
    ]


def _flat(settings: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in settings.items():
        if isinstance(value, dict) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _short(settings: dict, key: str) -> str:
    if key not in settings:
        return "(not set)"
    value = settings[key]
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


@dataclass
class RunDir:
    path: Path
    settings: dict  # JSON-able; what decides the run's results
    record: str = "run.json"  # the file in `path` holding {fingerprint, settings, **extra}
    what: str = "run"  # named in refusals: "demo run", "benchmark run"
    extra: dict = field(default_factory=dict)  # more keys written into the record (never compared)
    own_files: frozenset[str] = frozenset()  # names the command itself puts there before the record (a lock)
    # an older-format folder (and its record without settings, if any) -> the settings it was started with; None: not a run
    legacy: Callable[[Path, dict | None], dict | None] | None = None
    error: type[GeoPilotInputError] = GeoPilotInputError

    def __post_init__(self) -> None:
        self.path = Path(self.path)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.settings)

    @property
    def record_path(self) -> Path:
        return self.path / self.record

    def check(self) -> bool:
        """True when the folder holds this run already (resume it); False when it is missing or empty (start it).
        Raises `error` when it must not be used; writes nothing."""
        return self._found() is not None

    def claim(self) -> bool:
        """`check`, then create the folder and write the record (when missing or in an older format)."""
        found = self._found()
        if found is None or found.get("fingerprint") != self.fingerprint:
            self.write()
        return found is not None

    def write(self) -> None:
        """Write the record as this run's (a command that builds a finished folder itself, e.g. a merge)."""
        self.path.mkdir(parents=True, exist_ok=True)
        record = {"fingerprint": self.fingerprint, "settings": self.settings, **self.extra}
        atomic_write(self.record_path, json.dumps(record, indent=1, ensure_ascii=False) + "\n")

    def _found(self) -> dict | None:
        """The record this folder holds (None: nothing there yet), once its settings are known to match."""
        where = str(self.path)
        if self.path.exists() and not self.path.is_dir():
            raise self.error(f"--out {where!r} exists and is not a folder")
        record = self._read_record()
        if record is not None and "settings" in record:
            started = record["settings"]
        else:
            started = self.legacy(self.path, record) if self.legacy is not None else None
            if started is None:
                if record is None and not self._holds_nothing():
                    raise self.error(
                        f"--out {where!r} is not empty and holds no {self.what}; choose a new or empty folder"
                    )
                if record is None:
                    return None
                raise self.error(
                    f"{str(self.record_path)!r} is not a {self.what} record (no settings); use a new --out"
                )
            record = {**(record or {}), "settings": started}
        if fingerprint(started) != self.fingerprint:
            changed = ", ".join(changed_settings(started, self.settings)) or "the settings' types"
            raise self.error(
                f"{where!r} holds a {self.what} started with other settings ({changed}); use a new --out folder, "
                "or rerun with the same settings to resume it"
            )
        return record

    def _read_record(self) -> dict | None:
        if not self.record_path.is_file():
            return None
        try:
            record = json.loads(self.record_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise self.error(
                f"{str(self.record_path)!r} cannot be read ({type(err).__name__}); use a new --out folder"
            ) from None
        if not isinstance(record, dict) or not isinstance(record.get("settings", {}), dict):
            raise self.error(f"{str(self.record_path)!r} is not a {self.what} record; use a new --out folder")
        return record

    def _holds_nothing(self) -> bool:
        if not self.path.is_dir():
            return True
        return all(entry.name in self.own_files for entry in self.path.iterdir())
