"""`geopilot serve` on a GeoTIFF: the request's `geopilot.bands` pick the bands, and the reply's `geopilot` field
carries the tool calls' GeoJSON (RFC 7946, WGS 84) as one FeatureCollection."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("fastapi")
rasterio = pytest.importorskip("rasterio")
from helpers.geo_fixtures import BrightSpotDetector, distinct_bands, write_scene, write_tif  # noqa: E402

from geopilot.agent.results import ChatResult, ToolCallRecord  # noqa: E402
from geopilot.serving.api import ChatCompletionRequest, _extension  # noqa: E402
from geopilot.serving.chat_request import chat_request  # noqa: E402
from geopilot.serving.security import ServeError  # noqa: E402
from geopilot.tools.adapters import DetectorAdapter, DetectorOptions  # noqa: E402
from geopilot.tools.geo import rfc7946_problems  # noqa: E402
from geopilot.tools.task_tools import TASKS_BY_NAME, DetectObjectsParams, TaskTool  # noqa: E402

QUESTION = [("user", "How many ships?", True)]


def test_api_bands_pick_the_bands_of_geotiff_bytes(tmp_path):
    data = (distinct_bands(4) // 20).astype(np.uint8)
    tif = write_tif(tmp_path / "ms.tif", data).read_bytes()
    request = chat_request(QUESTION, tif, 10**8, bands=[4, 3, 2])
    assert request["image"].bands.bands == (4, 3, 2) and request["image"].georef.crs == "EPSG:32633"
    with pytest.raises(ServeError, match="band 7 is out of range") as refused:
        chat_request(QUESTION, tif, 10**8, bands=[7, 3, 2])
    assert refused.value.status == 400


def test_a_thirteen_band_geotiff_is_served_as_its_rgb_bands(tmp_path):
    """Pillow reads no TIFF of more than 4 bands: the header check leaves TIFFs to rasterio, so a Sentinel-2-style
    file is not refused as "not an image"."""
    names = ["B01", "B02", "B03", "B04", "B05", "B06", "B07", "B08", "B8A", "B09", "B10", "B11", "B12"]
    tif = write_tif(tmp_path / "s2.tif", distinct_bands(13), descriptions=names).read_bytes()
    request = chat_request(QUESTION, tif, 10**8)
    assert request["image"].bands.bands == (4, 3, 2)


def test_the_geopilot_field_carries_the_geojson(tmp_path):
    image = chat_request(QUESTION, write_scene(tmp_path / "scene.tif").read_bytes(), 10**8)["image"]
    options = DetectorOptions(tile_size=256, tile_overlap=64, score_threshold=0.0)
    tool = TaskTool(TASKS_BY_NAME["detect_objects"], DetectorAdapter(BrightSpotDetector(), options), "t", 10**9)
    output = tool.run(image, DetectObjectsParams(categories=["ship"]))
    call = ToolCallRecord(round=1, tool="detect_objects", params={"categories": ["ship"]}, output=output)
    result = ChatResult(answer="One ship.", outcome="tools", tool_calls=[call, call.model_copy(update={"round": 2})])
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}])
    extension = asyncio.run(_extension(result, None, body))
    collection = extension["geojson"]
    assert len(collection["features"]) == 2 and rfc7946_problems(collection) == []
    plain = ChatResult(answer="A field.", outcome="direct")
    assert "geojson" not in asyncio.run(_extension(plain, None, body))
