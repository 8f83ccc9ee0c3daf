"""benchmarks/geo_memory.py in its fast mode: the scenes it writes, the measurement (in this process) and the report.
The real run (20,000 vs 2,000 px, one process per size) is documented in docs/benchmarks.md."""

from __future__ import annotations

import geo_memory
import pytest

pytest.importorskip("rasterio")
pytest.importorskip("scipy")


@pytest.mark.slow  # ~12 s: a tiny LLaVA is built and chats
def test_measure_finds_every_planted_object_through_the_tiled_tool(tmp_path):
    path = tmp_path / "scene.tif"
    geo_memory.write_scene(path, 1100)  # 2 x 2 tiles of 1,024 px with 256 px overlap, 1 planted square in all four
    row = geo_memory.measure(path)
    assert row["objects_found"] == row["objects_planted"] == 1
    assert row["picture"] == [1100, 1100] and row["bands"] == [3, 2, 1]  # B04/B03/B02 by name
    assert row["peak_rss_mb"] >= row["baseline_rss_mb"] > 0


def test_report_ratios_and_verdict(monkeypatch, capsys):
    rows = {600: {"peak_rss_mb": 1000.0, "added_peak_mb": 50.0}, 3000: {"peak_rss_mb": 1100.0, "added_peak_mb": 140.0}}

    def fake_child(path):
        size = 600 if "small" in path.name else 3000
        planted = len(geo_memory.planted(size))
        return {"size": size, **rows[size], "objects_found": planted, "objects_planted": planted}

    monkeypatch.setattr(geo_memory, "run_child", fake_child)
    monkeypatch.setattr(geo_memory, "write_scene", lambda path, size: path.write_bytes(b""))
    assert geo_memory.main(["--large", "3000", "--small", "600", "--json"]) == 0
    import json

    report = json.loads(capsys.readouterr().out)
    assert report["pixels_ratio"] == 25.0 and report["peak_rss_ratio"] == 1.1 and report["added_peak_ratio"] == 2.8
    assert report["met"] is True
    rows[3000]["added_peak_mb"] = 400.0
    geo_memory.main(["--large", "3000", "--small", "600", "--json"])
    assert json.loads(capsys.readouterr().out)["met"] is False
