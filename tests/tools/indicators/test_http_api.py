"""The indicator HTTP API as a server other machines may reach: the shared API-key rule, charts served by name and
kept bounded, no temp folder per start, NaN/Infinity refused."""

from __future__ import annotations

import tempfile

import pytest
from fastapi.testclient import TestClient

from geopilot.cli import main
from geopilot.errors import GeoPilotInputError

CHART = {"layer": "land_cover", "areas": ["Braçal", "Évora Nova"], "level": "municipality", "metric": "forest"}


def test_a_non_loopback_bind_needs_a_key_as_serve_and_mcp_do(region, monkeypatch, capsys):
    monkeypatch.delenv("GEOPILOT_API_KEY", raising=False)
    assert main(["indicators", "serve", "--catalog", str(region / "catalog.yaml"), "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refusing to serve indicators on 0.0.0.0" in err and "without an API key" in err


def test_with_a_key_every_route_but_health_needs_it(registry):
    from geopilot.tools.indicators.http_api import create_app

    client = TestClient(create_app(registry, api_key="s3cret"))
    assert client.get("/health").status_code == 200
    assert client.get("/tools").status_code == 401
    assert client.post("/tools/list_layers", json={}).status_code == 401
    assert client.get("/tools", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_a_chart_comes_back_as_a_name_the_server_serves(registry):
    from geopilot.tools.indicators.http_api import create_app

    client = TestClient(create_app(registry))
    reply = client.post("/tools/generate_chart", json=CHART)
    assert reply.status_code == 200, reply.text
    name = reply.json()["output"]["artifacts"][0]["path"]
    assert "/" not in name and name.startswith("chart-") and name.endswith(".png")
    served = client.get(f"/artifacts/{name}")
    assert served.status_code == 200 and served.content[:8] == b"\x89PNG\r\n\x1a\n"
    for other in ["chart-000000000000.png", "..%2F..%2Fetc%2Fpasswd", "catalog.yaml"]:
        assert client.get(f"/artifacts/{other}").status_code == 404


def test_charts_are_pruned_to_the_newest(region, tmp_path, monkeypatch):
    from geopilot.sample import Action
    from geopilot.tools.indicators import tools
    from geopilot.tools.indicators.tools import build_indicator_registry

    monkeypatch.setattr(tools, "MAX_CHARTS", 2)
    (tmp_path / "notes.txt").write_text("not ours")
    registry = build_indicator_registry(region / "catalog.yaml", tmp_path)
    paths = [
        registry.call(Action(tool="generate_chart", params=CHART), image=None).output.artifacts[0].path
        for _ in range(4)
    ]
    assert sorted(p.name for p in tmp_path.glob("chart-*.png")) == sorted(p.rsplit("/", 1)[1] for p in paths[-2:])
    assert (tmp_path / "notes.txt").read_text() == "not ours"


def test_no_folder_is_made_until_a_chart_is(region, tmp_path, monkeypatch):
    from geopilot.tools.indicators.tools import build_indicator_registry

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for _ in range(3):
        build_indicator_registry(region / "catalog.yaml")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("folder", ["", " ", "AFILE"])
def test_an_artifacts_dir_that_is_no_folder_is_refused(region, tmp_path, folder):
    from geopilot.tools.indicators.tools import build_indicator_registry

    if folder == "AFILE":
        folder = str(tmp_path / "afile")
        (tmp_path / "afile").write_text("")
    with pytest.raises(GeoPilotInputError, match="is not a folder"):
        build_indicator_registry(region / "catalog.yaml", folder)


@pytest.mark.parametrize("threshold", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_thresholds_are_422(registry, threshold):
    from geopilot.tools.indicators.http_api import create_app

    params = '"layer": "land_cover", "level": "municipality", "metric": "forest", "op": "above"'
    body = f'{{{params}, "threshold": {threshold}}}'
    reply = TestClient(create_app(registry)).post(
        "/tools/threshold_count", content=body, headers={"content-type": "application/json"}
    )
    assert reply.status_code == 422, reply.text
