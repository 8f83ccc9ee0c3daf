"""The Gradio demo at /demo, scripted with gradio_client: `/ask` (image + question -> answer, drawn image, trace), a
follow-up without an image, the key (header, `?key=` -> cookie, refused without) and bad uploads as one line."""

from __future__ import annotations

import html
import re

import httpx
import numpy as np
import pytest
from helpers.serving import KEY, png_bytes
from PIL import Image

AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def demo_url(server):
    url, _ = server(delay_s=0.05)
    return url + "/demo/"


@pytest.fixture
def connect():
    """connect(url) -> a gradio_client Client with the key header, closed at the end (so the server stops at once)."""
    from gradio_client import Client

    clients = []

    def make(url: str):
        clients.append(Client(url, headers=AUTH, verbose=False))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


def test_ask_draws_the_tool_results_and_a_follow_up_continues(demo_url, connect, tmp_path):
    from gradio_client import handle_file

    scene = tmp_path / "scene.png"
    scene.write_bytes(png_bytes(320, 240, seed=3))
    client = connect(demo_url)
    answer, drawn, trace = client.predict(handle_file(str(scene)), "TOOL: how many planes are there?", api_name="/ask")
    assert answer == "There are 2 planes."
    shown = np.asarray(Image.open(drawn).convert("RGB"))
    original = np.asarray(Image.open(scene).convert("RGB"))
    assert shown.shape == original.shape and (shown != original).any(axis=2).mean() > 0.005  # boxes drawn
    calls = [step for step in trace if "tool" in step]
    assert [c["tool"] for c in calls] == ["detect_objects"] and calls[0]["provenance"] == "model"
    assert {"parameters", "seconds", "round"} <= set(calls[0])
    follow_up, _, follow_trace = client.predict(None, "and what else is there?", api_name="/ask")
    # the scripted model answers the history's question only when the history is in the prompt
    assert follow_up == "There are 2 planes." and not [step for step in follow_trace if "tool" in step]
    assert {"plan": "Counting needs the detector."} not in follow_trace  # only this turn's reasoning


def test_an_after_image_makes_the_question_about_the_pair(demo_url, connect, tmp_path):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    paths = {name: tmp_path / f"{name}.png" for name in ("before", "after", "small")}
    for seed, (name, path) in enumerate(paths.items()):
        path.write_bytes(png_bytes(*((64, 64) if name == "small" else (320, 240)), seed=seed))
    client = connect(demo_url)
    answer, drawn, _ = client.predict(
        handle_file(str(paths["before"])), "TOOL: how many planes?", handle_file(str(paths["after"])), api_name="/ask"
    )
    assert answer == "There are 2 planes." and Image.open(drawn).size == (320, 240)  # drawn on the before image
    with pytest.raises(AppError, match="image 2 is 64x64 px but image 1 is 320x240") as caught:
        client.predict(
            handle_file(str(paths["before"])), "what changed?", handle_file(str(paths["small"])), api_name="/ask"
        )
    assert "\n" not in str(caught.value.message)


def test_a_first_question_without_an_image_and_a_corrupt_upload_are_one_line_errors(demo_url, connect, tmp_path):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    client = connect(demo_url)
    with pytest.raises(AppError, match="Upload an image"):
        client.predict(None, "what is this?", api_name="/ask")
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    with pytest.raises(AppError, match="image") as caught:
        client.predict(handle_file(str(broken)), "what is this?", api_name="/ask")
    assert "\n" not in str(caught.value.message)


def test_an_image_over_the_pixel_limit_is_refused_like_the_api(server, connect, tmp_path):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    url, _ = server(max_image_pixels=50_000)
    big = tmp_path / "big.png"
    big.write_bytes(png_bytes(400, 300))
    client = connect(url + "/demo/")
    with pytest.raises(AppError, match="pixels"):
        client.predict(handle_file(str(big)), "what is this?", api_name="/ask")


def test_demo_needs_the_key_and_a_key_link_becomes_a_cookie(demo_url):
    for headers in ({}, {"authorization": "Bearer wrong"}):
        assert httpx.get(demo_url, headers=headers, timeout=10).status_code == 401
        assert httpx.get(demo_url + "gradio_api/info", headers=headers, timeout=10).status_code == 401
    form = httpx.get(demo_url, headers={"accept": "text/html"}, timeout=10)
    assert form.status_code == 401 and '<form method="get"' in form.text and 'name="key"' in form.text
    assert httpx.get(demo_url + "?key=wrong", headers={"accept": "text/html"}, timeout=10).status_code == 401
    with httpx.Client(timeout=10) as browser:
        link = browser.get(demo_url + "?key=" + KEY)
        assert link.status_code == 303 and "key=" not in link.headers["location"]
        assert "HttpOnly" in link.headers["set-cookie"] and "SameSite=Strict" in link.headers["set-cookie"]
        page = browser.get(demo_url)  # the cookie alone now
        assert page.status_code == 200 and "gradio" in page.text.lower()
    assert httpx.get(demo_url.replace("/demo/", "/v1/models"), cookies={"geopilot_key": KEY}).status_code == 401


def test_a_georeferenced_image_gets_a_map_and_one_without_crs_says_why(tmp_path):
    pytest.importorskip("rasterio")
    from helpers.geo_fixtures import write_scene

    from geopilot.serving.web import image_facts, map_html, no_map_reason

    report, notes = image_facts(str(write_scene(tmp_path / "utm.tif")))
    assert no_map_reason(report, notes) is None
    west, south, east, north = report["bounds_wgs84"]
    ship = {
        "type": "Feature",
        "properties": {"label": "ship"},
        "geometry": {"type": "Point", "coordinates": [15, 37.9]},
    }
    page = map_html(report["bounds_wgs84"], {"type": "FeatureCollection", "features": [ship]})
    assert f"{south}" in page and f"{east}" in page and "ship" in page  # the footprint and the results
    inner = html.unescape(page)
    assert (
        not re.findall(r"<(?:script|link|img)[^>]*(?:src|href)=[\"']?https?:", inner) and "{s}.tile" not in inner
    )  # no CDN, no tiles
    assert "Leaflet" in page  # the package's own copy, inlined
    bare, bare_notes = image_facts(str(write_scene(tmp_path / "bare.tif", crs=None)))
    assert "no CRS" in no_map_reason(bare, bare_notes)
