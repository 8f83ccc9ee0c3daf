"""GeoChat box decoding: as GeoChat's own `bbox_and_angle_to_polygon` (geochat_demo.py), off-grid values kept, only
empty boxes dropped, the polygon clipped to the image only where a record draws it, every repair counted.

The GeoChat-Instruct rows are written in the released format (`GeoChat_Instruct.json`, LLaVA conversations).
"""

from __future__ import annotations

import json
import math
import random

import pytest
import yaml
from PIL import Image

from geopilot.cli import main as cli_main
from geopilot.data_gen.readers.geochat import BOX, box_repairs, decode_box, read_geochat
from geopilot.polygons import convex_polygon, signed_area


def geochat_corners(x1: int, y1: int, x2: int, y2: int, degrees: int, width: int, height: int):
    """GeoChat's decoding restated: centre and size of the scaled rectangle (size by abs), the four corners at
    (-w/2, -h/2), (w/2, -h/2), (w/2, h/2), (-w/2, h/2) turned by [[cos, -sin], [sin, cos]] about the centre."""
    x1, x2, y1, y2 = x1 * width / 100, x2 * width / 100, y1 * height / 100, y2 * height / 100
    cx, cy, w, h = (x1 + x2) / 2, (y1 + y2) / 2, abs(x2 - x1), abs(y2 - y1)
    c, s = math.cos(math.radians(degrees)), math.sin(math.radians(degrees))
    half = ((-w / 2, -h / 2), (w / 2, -h / 2), (w / 2, h / 2), (-w / 2, h / 2))
    return [(cx + c * dx - s * dy, cy + s * dx + c * dy) for dx, dy in half]


def test_decoding_equals_geochats_on_random_boxes_off_the_grid_and_swapped():
    rng = random.Random(0)
    off_grid = swapped = 0
    for _ in range(2000):
        values = [rng.randint(-20, 120) for _ in range(4)]
        degrees = rng.randint(-90, 90)
        match = BOX.search("{" + "".join(f"<{v}>" for v in values) + f"|<{degrees}>}}")
        width, height = rng.choice([(600, 600), (800, 800), (1024, 1024), (200, 100)])
        corners = decode_box(match, width, height)
        if values[0] == values[2] or values[1] == values[3]:
            assert corners is None  # empty: the only box dropped
            continue
        assert corners == [pytest.approx(p, abs=1e-9) for p in geochat_corners(*values, degrees, width, height)]
        off_grid += "box_off_grid" in box_repairs(match)
        swapped += "box_corners_swapped" in box_repairs(match)
    assert off_grid > 1000 and swapped > 500  # both repairs were exercised


def _root(tmp_path, answer: str):
    images = tmp_path / "GeoChat" / "images"
    images.mkdir(parents=True)
    Image.new("RGB", (600, 600)).save(images / "train_5007_0017.png")
    rows = [
        {
            "id": "train_5007_0017",
            "image": "train_5007_0017.png",
            "conversations": [
                {"from": "human", "value": "<image>\n[refer] Give me the location of <p>airplanes</p>"},
                {"from": "gpt", "value": answer},
            ],
        }
    ]
    (tmp_path / "GeoChat" / "GeoChat_Instruct.json").write_text(json.dumps(rows))
    return tmp_path / "GeoChat"


def test_a_box_far_off_the_grid_is_kept_counted_and_clipped_where_drawn(tmp_path):
    """`{<80><90><150><130>|<30>}` on a 600 px image: centre (690, 660), outside the image, but the turned box
    overlaps its lower-right corner: the record keeps that part, and the report counts the repairs."""
    (record,), report = read_geochat(
        _root(tmp_path, "{<80><90><150><130>|<30>}{<150><150><190><190>|<0>}{<5><5><5><9>}")
    )
    (plane,) = record.objects
    assert plane.label == "airplane" and record.referring[0].object_indices == (0,)
    whole = decode_box(BOX.search("{<80><90><150><130>|<30>}"), 600, 600)
    assert (sum(x for x, _ in whole) / 4, sum(y for _, y in whole) / 4) == pytest.approx((690.0, 660.0))
    assert all(0 <= v <= 1 for point in plane.polygon for v in point)  # clipped to the image where it is drawn
    drawn = signed_area(convex_polygon([(x * 600, y * 600) for x, y in plane.polygon]))
    assert 0 < drawn < signed_area(convex_polygon(whole))
    assert plane.box[2] == plane.box[3] == 1.0  # it reaches the image's right and bottom edges
    assert report.repaired == {"box_off_grid": 1, "polygon_clipped_to_image": 1}  # kept after repair
    assert report.skipped == {"bad_geometry": 2}  # the box wholly outside the image, and the empty one
    assert any("lies outside the image" in m for m in report.examples["bad_geometry"])
    assert any("{<80><90><150><130>|<30>}" in m for m in report.examples["box_off_grid"])


def test_data_check_shows_the_repairs(tmp_path, capsys):
    root = _root(tmp_path, "<p>planes</p> {<51><-1><53><3>|<74>}<delim>{<60><60><70><70>|<0>}")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"sources": [{"reader": "geochat_instruct", "root": str(root)}]}))
    assert cli_main(["generate", "check", "--config", str(config), "--json"]) == 0
    (source,) = json.loads(capsys.readouterr().out)["sources"]
    assert source["repaired"] == {"box_off_grid": 1, "polygon_clipped_to_image": 1} and source["objects"] == 2
    assert cli_main(["generate", "check", "--config", str(config)]) == 0
    assert "repaired and kept: box_off_grid 1, polygon_clipped_to_image 1" in capsys.readouterr().out
