"""The MCP server, driven by the official `mcp` client: in-process, and over stdio with `geopilot mcp` as a subprocess."""

from __future__ import annotations

import base64
import io
import json
import os
import sys

import anyio
import numpy as np
import pytest
from helpers.mcp_http import mcp_http_server
from helpers.weights import FIXTURES, REPO, spa_gan_checkpoint, weights_candidate
from mcp import Client, StdioServerParameters
from PIL import Image

from geopilot.image_access import ImageAccessPolicy
from geopilot.records import AnnotationRecord, ObjectAnnotation
from geopilot.tool_output import ToolOutput
from geopilot.tools.mcp_server import build_server
from geopilot.tools.registry import build_registry

TIMEOUT_S = 120


def _record() -> AnnotationRecord:
    return AnnotationRecord(
        source="TEST", image="x.png", width=16, height=16, objects=[ObjectAnnotation("ship", (0.25, 0.25, 0.5, 0.75))]
    )


def _png_base64(size=(16, 16)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, (0, 90, 160)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _run(coroutine_fn):
    async def bounded():
        with anyio.fail_after(TIMEOUT_S):
            return await coroutine_fn()

    return anyio.run(bounded)


def _text(result) -> str:
    return result.content[0].text


def test_detect_changes_takes_both_images_in_order(tmp_path):
    label = np.zeros((16, 16), dtype=np.uint8)
    label[4:8, 2:10] = 255
    Image.fromarray(label).save(tmp_path / "change.png")
    Image.new("RGB", (16, 16), (200, 10, 10)).save(tmp_path / "after.png")
    record = AnnotationRecord("LEVIR-CD", "x.png", 16, 16, after_image="after.png", change_mask="change.png")
    server = build_server(build_registry(annotations=record, annotations_root=tmp_path), max_pixels=10_000)

    async def session():
        async with Client(server) as client:
            both = await client.call_tool("detect_changes", {"images": [_png_base64(), _png_base64()]})
            one = await client.call_tool("detect_changes", {"images": [_png_base64()]})
            bare = await client.call_tool("detect_changes", {"image": _png_base64()})
            return both, one, bare

    both, one, bare = _run(session)
    assert not both.is_error, _text(both)
    output = ToolOutput.model_validate_json(_text(both))
    assert output.data == {"changed_fraction": 0.125, "changed_objects": 1} and output.detections[0].label == "building"
    assert one.is_error and _text(one).endswith("this chat has 1: image 2 is missing")
    assert bare.is_error and "image: unexpected parameter" in _text(bare)


def test_in_process_list_call_and_errors(tmp_path):
    registry = build_registry(annotations=_record())
    server = build_server(registry, max_pixels=10_000, access=ImageAccessPolicy.from_roots([tmp_path]))
    png = tmp_path / "x.png"
    Image.new("RGB", (16, 16)).save(png)

    async def session():
        async with Client(server) as client:
            listed = (await client.list_tools()).tools
            ok_path = await client.call_tool("detect_objects", {"image": str(png), "categories": ["ships"]})
            ok_b64 = await client.call_tool("detect_all", {"image": "data:image/png;base64," + _png_base64()})
            errors = {
                "empty": await client.call_tool("detect_objects", {"image": str(png), "categories": []}),
                "extra": await client.call_tool("ground", {"image": str(png), "expression": "a", "radius": 3}),
                "missing": await client.call_tool("ground", {"image": str(png)}),
                "unknown": await client.call_tool("count_ships", {"image": str(png)}),
                "no_image": await client.call_tool("detect_all", {}),
                "url": await client.call_tool("detect_all", {"image": "https://example.com/a.png"}),
                "garbage": await client.call_tool("detect_all", {"image": "not a file, not base64!"}),
                "too_large": await client.call_tool("detect_all", {"image": _png_base64((101, 100))}),
            }
            return listed, ok_path, ok_b64, errors

    listed, ok_path, ok_b64, errors = _run(session)
    assert [t.name for t in listed] == registry.names()
    by_name = {t.name: t for t in listed}
    for schema in registry.schemas():
        mcp_schema = by_name[schema["name"]].input_schema
        name = "images" if schema["name"] == "detect_changes" else "image"  # a two-image tool: both, in order
        assert mcp_schema["required"][0] == name
        without_image = lambda properties: {k: v for k, v in properties.items() if k not in ("image", "images")}  # noqa: E731
        assert without_image(mcp_schema["properties"]) == without_image(schema["input_schema"].get("properties", {}))
        image_schema = mcp_schema["properties"][name]
        if name == "images":
            assert (image_schema["minItems"], image_schema["maxItems"]) == (2, 2)
            image_schema = image_schema["items"]
        assert "result:N" in image_schema["description"]  # a chat's reference, not MCP's
        assert by_name[schema["name"]].description == schema["description"]
    for ok in (ok_path, ok_b64):
        assert not ok.is_error
        output = ToolOutput.model_validate_json(_text(ok))
        assert output.provenance == "annotations" and output.detections[0].box == (0.25, 0.25, 0.5, 0.75)
        assert ok.structured_content == json.loads(_text(ok))
    expected = {
        "empty": "categories: List should have at least 1 item",
        "extra": "radius: unexpected parameter",
        "missing": "expression: Field required",
        "unknown": "unknown tool 'count_ships'",
        "no_image": "image: required",
        "url": "image: URLs are not fetched",
        "garbage": "image: not accepted: send base64 image data",
        "too_large": "exceeds the limit of 10,000",
    }
    for key, message in expected.items():
        assert errors[key].is_error, key
        assert message in _text(errors[key]), (key, _text(errors[key]))


def test_stdio_subprocess_lists_tools_runs_spa_gan_and_reports_errors():
    spa_gan_checkpoint()  # skips without the real weights
    env = {**os.environ, "GEOPILOT_WEIGHTS_DIR": str(weights_candidate())}
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "geopilot.cli", "mcp", "--transport", "stdio", "device=cpu", f"image_roots=[{FIXTURES}]"],
        env=env,
        cwd=str(REPO),
    )
    image = FIXTURES / "spagan_rice1_input_64.png"

    async def session():
        async with Client(params) as client:
            listed = (await client.list_tools()).tools
            restored = await client.call_tool("remove_clouds", {"image": str(image)})
            bad = await client.call_tool("segment_semantic", {"image": str(image), "classes": []})
            return listed, restored, bad

    listed, restored, bad = _run(session)
    assert len(listed) == 11 and all(t.input_schema["type"] == "object" for t in listed)
    assert not restored.is_error, _text(restored)
    (artifact,) = ToolOutput.model_validate_json(_text(restored)).artifacts
    expected = np.asarray(Image.open(FIXTURES / "spagan_rice1_expected_64.png"), dtype=np.int16)
    assert np.abs(np.asarray(Image.open(artifact.path), dtype=np.int16) - expected).max() <= 1
    assert bad.is_error and "classes: List should have at least 1 item" in _text(bad)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_mcp_help(transport, capsys):
    from geopilot.cli import main

    assert main(["mcp", "--help"]) == 0
    assert transport in capsys.readouterr().out


@pytest.mark.slow
def test_http_transport_serves_the_same_tools(tmp_path):
    with mcp_http_server(timeout_s=TIMEOUT_S) as url:

        async def session():
            async with Client(url) as client:
                listed = (await client.list_tools()).tools
                bad = await client.call_tool("ground", {"image": _png_base64(), "expression": "  "})
                return listed, bad

        listed, bad = _run(session)
    assert len(listed) == 11
    assert bad.is_error and "expression: String should have at least 1 character" in _text(bad)
