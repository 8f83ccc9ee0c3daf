"""The indicator tools through the one ToolRegistry dispatcher, the CLI, MCP and HTTP."""

from __future__ import annotations

import json

import anyio
import pytest
from mcp import Client

from geopilot.cli import main
from geopilot.sample import Action
from geopilot.tool_output import llm_view

FOREST_SHARE = {"layer": "land_cover", "level": "municipality", "metric": "forest"}  # of municipalities


def call(registry, tool, **params):
    return registry.call(Action(tool=tool, params=params), image=None)


def test_analyse_area_returns_class_shares_and_the_matched_area(registry, truth):
    result = call(registry, "analyse_area", layer="land_cover", area="anora de rios", level="municipality")
    assert result.ok, result.error
    data = result.output.data
    assert (data["name"], data["id"]) == ("Añora de Ríos", "VAL-N-1")
    for name, share in truth["municipality"]["Añora de Ríos"]["land_cover"].items():
        assert data["class_shares"][name] == pytest.approx(share, abs=0.006)
    assert llm_view(result.output) == {"data": data}  # the model reads `data` verbatim


def test_continuous_layer_statistics(registry, truth):
    data = call(
        registry, "analyse_area", layer="erosion_probability", area="Serra do Norte", level="province"
    ).output.data
    expected = truth["province"]["Serra do Norte"]["erosion_probability"]
    assert set(data) >= {"mean", "min", "max", "std", "count"}
    assert data["mean"] == pytest.approx(expected["mean"], abs=1e-4)
    assert data["count"] == expected["count"]
    assert data["outside_raster_pct"] > 0  # stated, not hidden


@pytest.mark.parametrize(
    ("tool", "params", "message"),
    [
        ("analyse_area", {"layer": "land_cover", "area": "Madrid", "level": "municipality"}, "no municipality named"),
        ("analyse_area", {"layer": "hillshade", "area": "Braçal", "level": "municipality"}, "display-only"),
        ("analyse_area", {"layer": "soil", "area": "Braçal", "level": "municipality"}, "unknown layer"),
        ("analyse_area", {"layer": "ndvi", "area": "Braçal", "level": "municipality", "date": "1999"}, "no date"),
        (
            "compare_areas",
            {"layer": "land_cover", "areas": ["Braçal", "Évora Nova"], "level": "municipality", "metric": "desert"},
            "no class 'desert'",
        ),
        ("statistics_over_time", {"layer": "land_cover", "area": "Braçal", "level": "municipality"}, "no dates"),
        ("analyse_area", {"layer": "land_cover", "area": "Anora", "level": "municipality"}, "closest names: Añora"),
        ("lookup_area", {"name": "Valdori"}, "at any level (country, province, municipality); closest names: Valdoria"),
    ],
)
def test_errors_the_agent_can_see(registry, tool, params, message):
    result = call(registry, tool, **params)
    assert not result.ok and result.error_kind == "tool_error"
    assert message in result.error


def test_ranking_threshold_comparison_and_time_series_agree_with_truth(registry, truth):
    municipalities = truth["municipality"]
    ranking = call(
        registry, "rank_areas", layer="erosion_probability", level="municipality", metric="mean", n=3, order="bottom"
    ).output.data["ranking"]
    expected = sorted(municipalities, key=lambda name: municipalities[name]["erosion_probability"]["mean"])[:3]
    assert [row["name"] for row in ranking] == expected
    above = call(
        registry, "threshold_count", layer="land_cover", level="municipality", metric="urban", op="above", threshold=20
    ).output.data
    assert above["count"] == sum(1 for m in municipalities.values() if m["land_cover"]["urban"] > 20)
    compared = call(registry, "compare_areas", areas=["Añora de Ríos", "Vilanova de Órrega"], **FOREST_SHARE)
    gap = (
        municipalities["Añora de Ríos"]["land_cover"]["forest"]
        - municipalities["Vilanova de Órrega"]["land_cover"]["forest"]
    )
    assert 0.1 <= abs(gap) <= 2  # a near-equal pair, by construction
    assert compared.output.data["difference"] == pytest.approx(gap, abs=0.011)
    series = call(registry, "statistics_over_time", layer="ndvi", area="Braçal", level="municipality").output.data
    assert [p["date"] for p in series["series"]] == ["2021", "2022", "2023", "2024"]
    assert series["series"][0]["value"] == pytest.approx(municipalities["Braçal"]["ndvi"]["2021"]["mean"], abs=1e-4)


def test_geometry_tools_and_chart(registry):
    within = call(registry, "select_features", area="Serra do Norte", level="province", target_level="municipality")
    assert [f["name"] for f in within.output.data["features"]] == ["São Tomé da Serra", "Évora Nova", "Lagoa do Açor"]
    contains = call(
        registry, "select_features", area="Braçal", level="municipality", target_level="province", relation="contains"
    ).output.data["features"]
    assert [f["name"] for f in contains] == ["Vale do Sul"]
    grown = call(registry, "buffer_area", area="Braçal", level="municipality", distance_m=1000).output.data
    assert grown["buffered_km2"] > grown["area_km2"]
    points = call(registry, "centroids", level="country").output.data["centroids"]
    assert len(points) == 2 and all(-180 <= p["lon"] <= 180 for p in points)
    chart = call(registry, "generate_chart", areas=["Braçal", "Évora Nova"], **FOREST_SHARE)
    artifact = chart.output.artifacts[0]
    assert artifact.kind == "image"
    with open(artifact.path, "rb") as png:
        assert png.read(8) == b"\x89PNG\r\n\x1a\n"
    assert call(registry, "reject_task", reason="not about indicators").output.data["rejected"] is True


def test_cli_list_and_run(region, capsys):
    catalog = str(region / "catalog.yaml")
    assert main(["tools", "list", "--catalog", catalog, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"analyse_area", "reject_task", "rank_areas"} <= {row["name"] for row in rows}
    params = json.dumps({"layer": "land_cover", "area": "Braçal", "level": "municipality"})
    assert main(["tools", "run", "analyse_area", "--catalog", catalog, "--params", params, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["output"]["data"]["class_shares"]["forest"] > 0
    assert main(["tools", "run", "analyse_area", "--catalog", catalog, "--params", '{"layer": 1}']) == 2
    assert "invalid params" in capsys.readouterr().err


def test_mcp_and_http_return_identical_results(region, registry):
    from fastapi.testclient import TestClient

    from geopilot.tools.indicators.http_api import create_app
    from geopilot.tools.mcp_server import build_server

    params = {"layer": "co2_suitability", "area": "Montaña Alta", "level": "province"}
    http = TestClient(create_app(registry)).post("/tools/analyse_area", json=params)
    assert http.status_code == 200

    async def over_mcp():
        async with Client(build_server(registry, max_pixels=10**6)) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert "image" not in listed["analyse_area"].input_schema["properties"]
            found = await client.call_tool("analyse_area", params)
            missing = await client.call_tool("analyse_area", {**params, "area": "Atlantis"})
            return found, missing

    found, missing = anyio.run(over_mcp)
    assert found.structured_content == http.json()["output"]
    assert missing.is_error and "no province named 'Atlantis'" in missing.content[0].text
    refused = TestClient(create_app(registry)).post("/tools/analyse_area", json={**params, "area": "Atlantis"})
    assert refused.status_code == 400 and "Atlantis" in refused.json()["error"]


def test_data_is_checked_against_the_schema_the_tool_declares():
    from pydantic import BaseModel

    from geopilot.tool_output import ToolOutput
    from geopilot.tool_protocol import ToolRegistry

    class Params(BaseModel):
        pass

    class Shares(BaseModel):
        class_shares: dict[str, float]

    class Tool:
        name, description, modality, params_model, data_model = "shares", "d", None, Params, Shares

        def __init__(self, data):
            self.data = data

        def run(self, image, params):
            return ToolOutput(data=self.data)

    good = ToolRegistry([Tool({"class_shares": {"forest": 40.0}})]).call(Action(tool="shares", params={}), image=None)
    assert good.ok and good.output.data == {"class_shares": {"forest": 40.0}}
    bad = ToolRegistry([Tool({"class_shares": "most of it"})]).call(Action(tool="shares", params={}), image=None)
    assert bad.error_kind == "invalid_output" and bad.output is None
    schema = ToolRegistry([Tool({})]).schemas()[0]
    assert schema["data_schema"]["properties"]["class_shares"]["type"] == "object"


def test_a_bad_catalogue_is_a_clear_config_error(tmp_path):
    from geopilot.errors import ConfigError
    from geopilot.tools.indicators.catalog import load_catalog

    path = tmp_path / "catalog.yaml"
    path.write_text(
        "layers:\n  - {id: lc, path: a.tif, kind: categorical}\nareas:\n  - {level: province, path: p.gpkg}\n"
    )
    with pytest.raises(ConfigError, match="needs `classes`"):
        load_catalog(path)
    path.write_text("layers:\n  - {id: lc, path: a.tif, kind: continuous, colour: red}\nareas: []\n")
    with pytest.raises(ConfigError, match="colour"):
        load_catalog(path)


def test_dated_layer_as_one_multiband_raster(region, tmp_path, truth):
    """A dated layer without a '{date}' path keeps its dates as bands 1..n of one file."""
    import rasterio
    import yaml

    from geopilot.data_gen.synthetic.region import NDVI_DATES
    from geopilot.tools.indicators.tools import build_indicator_registry

    bands = []
    for date in NDVI_DATES:
        with rasterio.open(region / "rasters" / f"ndvi_{date}.tif") as dataset:
            profile, bands = dataset.profile, [*bands, dataset.read(1)]
    profile.update(driver="GTiff", count=len(bands))
    with rasterio.open(tmp_path / "ndvi_stack.tif", "w", **profile) as out:
        for index, array in enumerate(bands, start=1):
            out.write(array, index)
    catalog = yaml.safe_load((region / "catalog.yaml").read_text(encoding="utf-8"))
    catalog["layers"] = [
        {"id": "ndvi", "path": str(tmp_path / "ndvi_stack.tif"), "kind": "continuous", "dates": NDVI_DATES}
    ]
    catalog["areas"] = [{**a, "path": str(region / a["path"])} for a in catalog["areas"]]
    (tmp_path / "catalog.yaml").write_text(yaml.safe_dump(catalog, allow_unicode=True), encoding="utf-8")
    stacked = build_indicator_registry(tmp_path / "catalog.yaml", tmp_path)
    series = call(stacked, "statistics_over_time", layer="ndvi", area="Braçal", level="municipality").output.data
    expected = [truth["municipality"]["Braçal"]["ndvi"][d]["mean"] for d in NDVI_DATES]
    assert [p["value"] for p in series["series"]] == pytest.approx(expected, abs=1e-4)
