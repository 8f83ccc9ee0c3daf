"""Geo memory: peak memory of `GeoPilot.chat` + one tiled tool on a 20,000 x 20,000 uint16 GeoTIFF vs a 2,000 x 2,000
one. A GeoTIFF is never decoded whole (geopilot/raster.py), so the large scene should cost about what the small one
does, not 100x.

    python benchmarks/geo_memory.py                         # the real run: 20,000 vs 2,000 px (~3 GB of scratch)
    python benchmarks/geo_memory.py --large 1500 --small 300 --json   # the fast mode the test uses

Each scene is a 4-band uint16 GeoTIFF (descriptions B02, B03, B04, B08; UTM 33N, 10 m; tiled 512, deflate, no
overviews: the worst case for the decimated picture) with bright 24 px squares every 1,000 px on a dark, textured
ground. Each size runs in a fresh Python process: build a tiny random LLaVA, warm it up on a small in-memory image
(the baseline), then `chat` on the GeoTIFF with a scripted plan (the model's forward passes are real, its argmax is
forced: benchmarks/chat_latency.py) that calls `detect_objects`, bound to the real tiling adapter over a simple
bright-spot detector (scipy.ndimage.label per full-resolution 1,024 px tile). Reported per size: the process's peak
RSS (getrusage), the peak above the warm baseline (what the image path adds), the picture size, tiles, objects
found vs planted; then large / small ratios of both. Target: the added peak of the large scene <= 3x the small one's.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from output import emit  # benchmarks/output.py (this folder is on sys.path when run as a script)

TARGET_RATIO = 3.0
SPACING, SIDE, BRIGHT = 1000, 24, 20000  # planted objects: one SIDE px square every SPACING px, value BRIGHT
GROUND, MIN_AREA = 1000, 100  # ground: GROUND + texture in [0, 400)
BAND_NAMES = ("B02", "B03", "B04", "B08")
TILE, OVERLAP = 1024, 256


def planted(size: int) -> list[tuple[int, int]]:
    """Top-left corners of the planted squares."""
    starts = range(SPACING // 2, size - SIDE, SPACING)
    return [(x, y) for y in starts for x in starts]


def write_scene(path: Path, size: int) -> None:
    """A size x size 4-band uint16 GeoTIFF, written strip by strip (never whole in memory)."""
    import rasterio
    from rasterio.transform import from_origin
    from rasterio.windows import Window

    profile = {
        "driver": "GTiff",
        "width": size,
        "height": size,
        "count": len(BAND_NAMES),
        "dtype": "uint16",
        "tiled": True,
        "blockxsize": 512,
        "blockysize": 512,
        "compress": "deflate",
        "BIGTIFF": "IF_SAFER",
    }
    objects = planted(size)
    rng = np.random.default_rng(0)
    texture = rng.integers(0, 400, (512, 512), dtype=np.uint16)  # repeated ground texture: compresses well
    with rasterio.open(
        path, "w", crs="EPSG:32633", transform=from_origin(500_000, 4_200_000, 10, 10), **profile
    ) as dst:
        dst.descriptions = BAND_NAMES
        for row in range(0, size, 512):
            rows = min(512, size - row)
            strip = np.tile(texture[:rows], (1, size // 512 + 1))[:, :size] + GROUND
            for x, y in objects:  # a dark 2 px ring keeps the square apart from saturated ground pixels
                _paint(strip, row, (x - 2, y - 2, x + SIDE + 2, y + SIDE + 2), GROUND)
                _paint(strip, row, (x, y, x + SIDE, y + SIDE), BRIGHT)
            dst.write(np.stack([strip] * len(BAND_NAMES)), window=Window(0, row, size, rows))


def _paint(strip: np.ndarray, row: int, box: tuple[int, int, int, int], value: int) -> None:
    """Fill the part of `box` (x0, y0, x1, y1 in scene pixels) that lies in the strip starting at scene row `row`."""
    x0, y0, x1, y1 = box
    top, bottom = max(y0, row), min(y1, row + strip.shape[0])
    if top < bottom:
        strip[top - row : bottom - row, max(x0, 0) : x1] = value


class BrightSpots:
    """Objects = 4-connected regions of saturated pixels (255 after the stretch) of at least MIN_AREA px: the 2% of
    ground pixels the percentile stretch also saturates are isolated and too small."""

    def detect(self, image, categories):
        from scipy import ndimage

        from geopilot.tool_output import Detection
        from geopilot.tools.canonical import pixel_box

        labels, _ = ndimage.label(np.asarray(image)[:, :, 0] == 255)
        found = []
        for index, (rows, cols) in enumerate(ndimage.find_objects(labels), start=1):
            if (labels[rows, cols] == index).sum() < MIN_AREA:
                continue
            pixels = (float(cols.start), float(rows.start), float(cols.stop), float(rows.stop))
            found.append(
                Detection(label=categories[0], box=pixel_box(pixels, *image.size), score=0.9, pixel_box=pixels)
            )
        return found


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def measure(path: Path) -> dict:
    """In this (fresh) process: baseline after a warm-up chat, then chat + detect_objects on the GeoTIFF."""
    from chat_latency import ScriptedKVSession  # benchmarks/ is on sys.path when this runs as a script

    from geopilot.agent import GeoPilot
    from geopilot.model import ModelConfig, TinyModelConfig, build_model
    from geopilot.sample import Action, AssistantMessage
    from geopilot.tool_protocol import ToolRegistry
    from geopilot.tools.adapters import DetectorAdapter, DetectorOptions
    from geopilot.tools.task_tools import TASKS_BY_NAME, TaskTool
    from geopilot.wire import assistant_json

    model, processor = build_model(ModelConfig(tiny=TinyModelConfig()))
    plan = AssistantMessage(
        reasoning="Count them.", actions=[Action(tool="detect_objects", params={"categories": ["ship"]})]
    )
    texts = [assistant_json(plan), assistant_json(AssistantMessage(reasoning="Counted.", value="Ships."))]
    adapter = DetectorAdapter(
        BrightSpots(),
        DetectorOptions(tile_size=TILE, tile_overlap=OVERLAP, score_threshold=0.0, max_detections=100_000),
    )
    registry = ToolRegistry(
        [TaskTool(TASKS_BY_NAME["detect_objects"], adapter, "bright_spots", 10**12)], timeout_s=3600
    )

    def chat(image):
        def factory(prompts, pixels, options):
            return ScriptedKVSession(model, processor.tokenizer, prompts, pixels, options, list(texts))

        pilot = GeoPilot(model, processor, registry, session_factory=factory, chat_timeout_s=None, tool_timeout_s=3600)
        return pilot.chat(image, "How many ships?", bands=None)

    chat(np.full((256, 256, 3), 30, np.uint8))  # warm-up: every library, the model and its buffers are in
    baseline = peak_rss_mb()
    start = time.perf_counter()
    result = chat(str(path))
    seconds, peak = time.perf_counter() - start, peak_rss_mb()
    (call,) = result.tool_calls
    if call.output is None:
        raise RuntimeError(f"the tool failed: {call.error}")
    from geopilot.image import load_image

    loaded = load_image(path)
    size = loaded.source_size[0]
    return {
        "size": size,
        "peak_rss_mb": round(peak, 1),
        "baseline_rss_mb": round(baseline, 1),
        "added_peak_mb": round(peak - baseline, 1),
        "picture": list(loaded.image.size),
        "bands": result.bands,
        "objects_found": len(call.output.detections),
        "objects_planted": len(planted(size)),
        "seconds": round(seconds, 1),
    }


def run_child(path: Path) -> dict:
    command = [sys.executable, __file__, "--measure", str(path)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"measuring {path.name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_text(rows: dict, report: dict) -> None:
    for name, row in rows.items():
        print(
            f"{name:<6} {row['size']:>6} px: peak RSS {row['peak_rss_mb']:.0f} MB (+{row['added_peak_mb']:.0f} MB over the "
            f"warm baseline), picture {row['picture'][0]}x{row['picture'][1]}, bands {row['bands']}, "
            f"{row['objects_found']}/{row['objects_planted']} objects, {row['seconds']} s"
        )
    print(
        f"{report['pixels_ratio']:g}x the pixels: peak RSS ratio {report['peak_rss_ratio']}, added peak ratio "
        f"{report['added_peak_ratio']} (target <= {TARGET_RATIO:g}): {'met' if report['met'] else 'NOT met'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--large", type=int, default=20_000, help="side of the large scene, px")
    parser.add_argument("--small", type=int, default=2_000, help="side of the small scene, px")
    parser.add_argument("--workdir", default=None, help="where to write the scenes (default: a temporary folder)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(Path(args.measure))))
        return 0
    with tempfile.TemporaryDirectory(dir=args.workdir) as folder:
        rows = {}
        for name, size in (("small", args.small), ("large", args.large)):
            path = Path(folder) / f"{name}.tif"
            start = time.perf_counter()
            write_scene(path, size)
            rows[name] = {**run_child(path), "write_seconds": round(time.perf_counter() - start, 1)}
            path.unlink()
    small, large = rows["small"], rows["large"]
    report = {
        "small": small,
        "large": large,
        "pixels_ratio": round((large["size"] / small["size"]) ** 2, 1),
        "peak_rss_ratio": round(large["peak_rss_mb"] / small["peak_rss_mb"], 2),
        "added_peak_ratio": round(large["added_peak_mb"] / max(small["added_peak_mb"], 1.0), 2),
        "target_added_peak_ratio": TARGET_RATIO,
    }
    report["met"] = report["added_peak_ratio"] <= TARGET_RATIO and all(
        r["objects_found"] == r["objects_planted"] for r in (small, large)
    )
    return emit(report, args.json, lambda: print_text(rows, report))


if __name__ == "__main__":
    sys.exit(main())
