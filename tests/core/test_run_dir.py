"""geopilot/run_dir.py: one folder holds one run, identified by its settings."""

from __future__ import annotations

import json

import pytest

from geopilot.errors import ConfigError, GeoPilotInputError
from geopilot.fileio import fingerprint
from geopilot.run_dir import RunDir, changed_settings

SETTINGS = {"seed": 0, "backend": {"model": "m", "url": "u"}, "sources": ["a"]}


def test_a_new_or_empty_folder_starts_and_the_same_settings_resume(tmp_path):
    assert RunDir(tmp_path / "new", SETTINGS).claim() is False
    record = json.loads((tmp_path / "new" / "run.json").read_text())
    assert record == {"fingerprint": fingerprint(SETTINGS), "settings": SETTINGS}
    assert RunDir(tmp_path / "new", json.loads(json.dumps(SETTINGS))).check() is True
    (tmp_path / "empty").mkdir()
    assert RunDir(tmp_path / "empty", SETTINGS).check() is False


def test_other_settings_are_refused_naming_each_nested_key(tmp_path):
    RunDir(tmp_path, SETTINGS, what="test run").claim()
    other = {**SETTINGS, "seed": 1, "backend": {"model": "n", "url": "u"}, "extra": True}
    with pytest.raises(GeoPilotInputError, match=r"test run started with other settings \(backend.model: m -> n, "):
        RunDir(tmp_path, other, what="test run").check()
    assert changed_settings(SETTINGS, other) == ["backend.model: m -> n", "extra: (not set) -> true", "seed: 0 -> 1"]


def test_a_non_empty_folder_without_a_record_and_a_damaged_record_are_refused(tmp_path):
    (tmp_path / ".lock").write_text("")
    assert RunDir(tmp_path, SETTINGS, own_files=frozenset({".lock"})).check() is False  # the command's own file
    with pytest.raises(GeoPilotInputError, match="not empty and holds no run"):
        RunDir(tmp_path, SETTINGS).check()
    (tmp_path / "run.json").write_text('{"fingerprint": "ab')
    with pytest.raises(ConfigError, match="run.json' cannot be read"):
        RunDir(tmp_path, SETTINGS, error=ConfigError).check()
    (tmp_path / "run.json").write_text('{"fingerprint": "ab"}')
    with pytest.raises(GeoPilotInputError, match="not a run record"):
        RunDir(tmp_path, SETTINGS).check()
    (tmp_path / "afile").write_text("")
    with pytest.raises(GeoPilotInputError, match="exists and is not a folder"):
        RunDir(tmp_path / "afile", SETTINGS).check()


def test_a_stale_fingerprint_formula_is_understood_from_the_stored_settings(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"fingerprint": "made-by-an-old-formula", "settings": SETTINGS}))
    assert RunDir(tmp_path, SETTINGS).claim() is True
    assert json.loads((tmp_path / "run.json").read_text())["fingerprint"] == fingerprint(SETTINGS)


def test_an_older_format_folder_goes_through_the_legacy_reader(tmp_path):
    (tmp_path / "log.jsonl").write_text("{}\n")
    seen = []

    def legacy(folder, record):
        seen.append((folder, record))
        return SETTINGS

    assert RunDir(tmp_path, SETTINGS, legacy=legacy).claim() is True
    assert seen == [(tmp_path, None)] and (tmp_path / "run.json").is_file()  # resumed, and recorded from now on
    (tmp_path / "run.json").unlink()
    with pytest.raises(GeoPilotInputError, match=r"other settings \(seed: 0 -> 2\)"):
        RunDir(tmp_path, {**SETTINGS, "seed": 2}, legacy=legacy).check()
    with pytest.raises(GeoPilotInputError, match="not empty and holds no run"):
        RunDir(tmp_path, SETTINGS, legacy=lambda folder, record: None).check()
