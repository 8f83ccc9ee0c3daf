"""geopilot/fileio.py: the one JSONL append and reader, and the one fingerprint."""

from __future__ import annotations

import pytest

from geopilot.errors import GeoPilotInputError
from geopilot.fileio import append_jsonl, fingerprint, iter_jsonl


def test_append_after_a_torn_line_loses_no_record(tmp_path):
    log = tmp_path / "log.jsonl"
    append_jsonl(log, [{"n": 0}])
    with log.open("a") as handle:
        handle.write('{"n": 1, "tor')  # a kill mid-write
    append_jsonl(log, [{"n": 2}, {"n": 3}])
    assert [record["n"] for _, record in iter_jsonl(log, "skip")] == [0, 2, 3]


def test_strict_reading_names_the_file_and_line(tmp_path):
    data = tmp_path / "cases.jsonl"
    data.write_bytes(b'\xef\xbb\xbf{"a": 1}\n\n[1, 2]\n')
    with pytest.raises(GeoPilotInputError, match=r"cases.jsonl line 3: expected a JSON object"):
        list(iter_jsonl(data))
    data.write_bytes(b'{"a": 1}\n\xff\xfe\n')
    with pytest.raises(GeoPilotInputError, match=r"line 2: not UTF-8 text"):
        list(iter_jsonl(data))
    assert [n for n, _ in iter_jsonl(data, "skip")] == [1]
    with pytest.raises(GeoPilotInputError, match="no such file"):
        list(iter_jsonl(tmp_path / "missing.jsonl"))
    assert list(iter_jsonl(tmp_path / "missing.jsonl", "skip")) == []


def test_the_fingerprint_ignores_key_order_and_has_one_length():
    assert fingerprint({"a": 1, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2}) and len(fingerprint({})) == 16


def test_a_failed_atomic_write_keeps_the_old_file_and_no_temp_file(tmp_path, monkeypatch):
    from geopilot import fileio

    target = tmp_path / "state.json"
    fileio.atomic_write(target, "old")
    monkeypatch.setattr(fileio.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        fileio.atomic_write(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temp file left behind
