"""One synthetic region per test session (about 10 s to write): COGs, areas, catalogue and truth.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("rasterio")
pytest.importorskip("shapely")
pytest.importorskip("pyogrio")


@pytest.fixture(scope="session")
def region(tmp_path_factory) -> Path:
    from geopilot.data_gen.synthetic.region import synth_region

    out = tmp_path_factory.mktemp("region")
    synth_region(out)
    return out


@pytest.fixture(scope="session")
def truth(region) -> dict:
    return json.loads((region / "truth.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def registry(region, tmp_path_factory):
    from geopilot.tools.indicators.tools import build_indicator_registry

    return build_indicator_registry(region / "catalog.yaml", tmp_path_factory.mktemp("charts"))
