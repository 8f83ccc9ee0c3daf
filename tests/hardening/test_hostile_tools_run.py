"""`geopilot tools run` under hostile input (issue 37): exit 2, one line on stderr, no traceback, bounded time and
memory (a fresh process, measured); images are refused from their header before anything is decoded, and nothing
is written over the input. Each case starts a process (~2 s here): variations of a covered case are marked slow."""

from __future__ import annotations

import struct
import zlib

import pytest
from helpers.hostile import not_a_small_file, run_cli
from PIL import Image


def png_header(path, width, height):
    """A valid PNG whose header claims width x height and whose one IDAT holds almost nothing (a bomb)."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    )
    return path


def tools_run(tmp_path, *args):
    return run_cli(["tools", "run", *args, "device=cpu"], tmp_path)


@pytest.fixture
def picture(tmp_path):
    path = tmp_path / "scene.png"
    Image.new("RGB", (64, 48), (40, 90, 30)).save(path)
    return path


def test_a_6324_by_1_png_is_refused_from_its_header(tmp_path):
    strip = tmp_path / "strip.png"
    Image.new("L", (6324, 1)).save(strip, optimize=True)
    assert strip.stat().st_size < 200
    line = tools_run(tmp_path, "remove_clouds", "--image", strip).refused()
    assert "6324x1 is over 20:1" in line


@pytest.mark.parametrize(
    ("width", "height", "message"),
    [
        (12_000, 9_000, "exceeds the limit of 100,000,000"),  # over the tools' max_pixels
        pytest.param(100_000, 100_000, "decompression bomb", marks=pytest.mark.slow),  # over Pillow's own limit
        pytest.param(9_000, 3, "over 20:1", marks=pytest.mark.slow),
        pytest.param(0, 5, "", marks=pytest.mark.slow),  # Pillow refuses a 0-pixel header itself
    ],
)
def test_png_headers_claiming_huge_sizes_are_refused_before_decoding(tmp_path, width, height, message):
    line = tools_run(tmp_path, "remove_clouds", "--image", png_header(tmp_path / "bomb.png", width, height)).refused()
    assert message in line


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", pytest.param("folder", marks=pytest.mark.slow), "missing"])
def test_images_that_are_not_regular_files(tmp_path, kind):
    given = not_a_small_file(tmp_path / "scene.png", kind)
    line = tools_run(tmp_path, "remove_clouds", "--image", given).refused()
    expected = {"fifo": "is a FIFO", "dev_zero": "character device", "folder": "directory", "missing": "not found"}
    assert expected[kind] in line and (kind != "missing" or "scene.png" in line)


def test_out_that_is_an_existing_file_is_refused(tmp_path, picture):
    (tmp_path / "taken").write_text("the user's file")
    line = tools_run(tmp_path, "remove_clouds", "--image", picture, "--out", tmp_path / "taken").refused()
    assert "exists and is not a folder" in line and (tmp_path / "taken").read_text() == "the user's file"


def test_out_never_writes_over_the_image(tmp_path):
    (tmp_path / "out").mkdir()
    image = tmp_path / "out" / "output.json"
    Image.new("RGB", (32, 32)).save(image, "PNG")  # a PNG named like what --out writes
    before = image.read_bytes()
    line = tools_run(tmp_path, "remove_clouds", "--image", image, "--out", tmp_path / "out").refused()
    assert "over the --image" in line and image.read_bytes() == before


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ("[" * 30_000 + "]" * 30_000, "nested too deep"),  # an argument is at most 128 KiB
        pytest.param('{"a":' * 10_000 + "1" + "}" * 10_000, "nested too deep", marks=pytest.mark.slow),
        pytest.param("[1, 2]", "expected a JSON object", marks=pytest.mark.slow),
    ],
)
def test_bad_params_are_one_line(tmp_path, picture, params, message):
    assert message in tools_run(tmp_path, "detect_objects", "--image", picture, "--params", params).refused()


def test_a_long_tool_name_or_key_is_echoed_at_most_200_characters(tmp_path, picture):
    line = tools_run(tmp_path, "x" * 100_000, "--image", picture).refused()
    assert "unknown tool" in line and len(line) < 1000
    params = '{"categories": ["ship"], "' + "k" * 100_000 + '": 1}'
    line = tools_run(tmp_path, "detect_objects", "--image", picture, "--params", params).refused()
    assert "unexpected" in line.lower() or "unknown" in line.lower()
    assert len(line) < 1000
