"""Synthetic scenes in memory: optical (land cover, roads, DOTA-class objects, clouds) and SAR (speckled
single-channel amplitude with SARDet-100K-class targets). `data_gen/synthetic/datasets.py` writes them in the real formats.

Everything is drawn from one `numpy.random.Generator`, so a scene is a pure function of its seed.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from PIL import Image, ImageDraw

SIZE = 256
Point = tuple[float, float]

# Optical land cover: OpenEarthMap codes -> RGB colour used to paint them.
LANDCOVER_COLOURS = {
    1: (150, 130, 100),  # bareland
    2: (120, 160, 80),  # rangeland
    3: (140, 140, 140),  # developed space
    4: (90, 90, 90),  # road
    5: (40, 90, 40),  # tree
    6: (40, 70, 140),  # water
    7: (170, 180, 90),  # agriculture land
    8: (200, 80, 60),  # building
}
VORONOI_CODES = (1, 2, 3, 5, 6, 7)  # the background regions; roads (4) and buildings (8) are drawn on top


def png_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG", compress_level=1)  # noisy scenes: zlib's best level is slow
    return buffer.getvalue()


def sar_picture(amplitude: np.ndarray) -> np.ndarray:
    """A SAR scene's amplitude as an 8-bit picture (1-99 percentile stretch), as the evaluation sets ship it."""
    low, high = np.percentile(amplitude, [1, 99])
    return np.clip((amplitude - low) / max(high - low, 1e-9) * 255, 0, 255).astype(np.uint8)


@dataclass(frozen=True)
class Shape:
    """A class's footprint: size ranges in pixels, colour/brightness, outline in the unit box [-0.5, 0.5]^2."""

    length: tuple[int, int]
    width: tuple[int, int]
    colour: tuple[int, int, int]
    outline: tuple[Point, ...]
    look: str = ""  # the colour's name, as a referring expression says it ("the yellow large vehicle")


def _circle(n: int = 16) -> tuple[Point, ...]:
    return tuple((0.5 * math.cos(2 * math.pi * k / n), 0.5 * math.sin(2 * math.pi * k / n)) for k in range(n))


RECT = ((-0.5, -0.5), (0.5, -0.5), (0.5, 0.5), (-0.5, 0.5))
CROSS = (
    (-0.5, -0.06),
    (-0.05, -0.06),
    (-0.05, -0.5),
    (0.08, -0.5),
    (0.08, -0.06),
    (0.5, -0.06),
    (0.5, 0.06),
    (0.08, 0.06),
    (0.08, 0.5),
    (-0.05, 0.5),
    (-0.05, 0.06),
    (-0.5, 0.06),
)
HULL = ((-0.5, -0.3), (0.3, -0.5), (0.5, 0.0), (0.3, 0.5), (-0.5, 0.3))
DIAMOND = ((0.0, -0.5), (0.5, 0.0), (0.0, 0.5), (-0.5, 0.0))

# DOTA v1.0 class names exactly as DOTA writes them (all 15, so every class is asked about and found).
OPTICAL_SHAPES = {
    "plane": Shape((28, 36), (26, 32), (225, 225, 230), CROSS, "white"),
    "ship": Shape((30, 44), (8, 12), (235, 235, 235), HULL, "white"),
    "small-vehicle": Shape((8, 11), (4, 6), (30, 30, 160), RECT, "blue"),
    "large-vehicle": Shape((16, 21), (6, 8), (230, 200, 40), RECT, "yellow"),
    "storage-tank": Shape((16, 24), (16, 24), (245, 245, 240), _circle(), "white"),
    "tennis-court": Shape((24, 28), (12, 14), (60, 140, 90), RECT, "green"),
    "swimming-pool": Shape((16, 24), (10, 14), (60, 190, 230), RECT, "blue"),
    "helicopter": Shape((18, 24), (16, 22), (85, 95, 60), CROSS, "olive"),
    "bridge": Shape((48, 64), (7, 10), (175, 170, 160), RECT, "grey"),
    "harbor": Shape((34, 44), (18, 24), (115, 115, 125), RECT, "grey"),
    "roundabout": Shape((22, 28), (22, 28), (105, 105, 105), _circle(), "grey"),
    "baseball-diamond": Shape((24, 30), (24, 30), (195, 145, 95), DIAMOND, "brown"),
    "basketball-court": Shape((16, 20), (9, 11), (205, 120, 60), RECT, "orange"),
    "ground-track-field": Shape((44, 52), (26, 32), (175, 65, 55), _circle(), "red"),
    "soccer-ball-field": Shape((36, 44), (22, 28), (45, 165, 60), RECT, "green"),
}
# SARDet-100K class names; colour[0] is the backscatter intensity.
SAR_SHAPES = {
    "ship": Shape((24, 40), (6, 10), (230, 0, 0), HULL),
    "aircraft": Shape((24, 32), (22, 30), (210, 0, 0), CROSS),
    "car": Shape((8, 11), (4, 6), (200, 0, 0), RECT),
    "tank": Shape((12, 20), (12, 20), (250, 0, 0), _circle()),
    "bridge": Shape((60, 90), (6, 9), (190, 0, 0), RECT),
    "harbor": Shape((40, 56), (24, 32), (170, 0, 0), RECT),
}


@dataclass
class PlacedObject:
    label: str  # the source's class name ("small-vehicle", "aircraft")
    corners: list[Point]  # the oriented box, 4 pixel corners
    outline: list[Point]  # the drawn footprint (what a mask covers)
    difficult: bool = False

    @property
    def centre(self) -> Point:
        xs, ys = zip(*self.corners, strict=True)
        return sum(xs) / 4, sum(ys) / 4

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        xs, ys = zip(*self.corners, strict=True)
        return min(xs), min(ys), max(xs), max(ys)


@dataclass
class OpticalScene:
    image: np.ndarray  # (H, W, 3) uint8, clear
    cloudy: np.ndarray  # (H, W, 3) uint8, the same scene under clouds
    landcover: np.ndarray  # (H, W) uint8 OpenEarthMap codes
    roads: list[list[Point]]  # pixel polylines; crossings share a vertex
    objects: list[PlacedObject]
    referring: tuple[int, list[str]] | None = None  # (object index, phrases) for a uniquely describable object

    @cached_property
    def image_png(self) -> bytes:
        """The clear image as PNG bytes, encoded once for the several datasets that ship it."""
        return png_bytes(self.image)


@dataclass
class SarScene:
    amplitude: np.ndarray  # (H, W) float amplitude, speckled
    objects: list[PlacedObject] = field(default_factory=list)
    sixteen_bit: bool = False
    sea_fraction: float = 0.0  # share of the scene that is sea (left of the coast)


def _transform(outline, centre: Point, length: float, width: float, angle: float) -> list[Point]:
    cos, sin = math.cos(angle), math.sin(angle)
    cx, cy = centre
    return [(cx + u * length * cos - v * width * sin, cy + u * length * sin + v * width * cos) for u, v in outline]


def _place(rng: np.random.Generator, shapes: dict[str, Shape], count: int, taken: list, allowed=None):
    """Place up to `count` objects without overlapping boxes; `allowed(label, centre)` can veto a spot."""
    placed = []
    names = list(shapes)
    for _ in range(count * 20):
        if len(placed) == count:
            break
        label = names[int(rng.integers(len(names)))]
        shape = shapes[label]
        length, width = float(rng.integers(*shape.length)), float(rng.integers(*shape.width))
        angle = float(rng.uniform(0, math.pi))
        centre = (float(rng.uniform(24, SIZE - 24)), float(rng.uniform(24, SIZE - 24)))
        corners = _transform(RECT, centre, length, width, angle)
        xs, ys = [x for x, _ in corners], [y for _, y in corners]
        box = (min(xs) - 2, min(ys) - 2, max(xs) + 2, max(ys) + 2)
        if box[0] < 1 or box[1] < 1 or box[2] > SIZE - 1 or box[3] > SIZE - 1:
            continue
        if any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in taken):
            continue
        if allowed is not None and not allowed(label, centre):
            continue
        taken.append(box)
        outline = _transform(shape.outline, centre, length, width, angle)
        placed.append(PlacedObject(label, corners, outline, difficult=bool(rng.random() < 0.1)))
    return placed


def _smooth_noise(rng: np.random.Generator, cells: int) -> np.ndarray:
    coarse = Image.fromarray((rng.random((cells, cells)) * 255).astype(np.uint8))
    return np.asarray(coarse.resize((SIZE, SIZE), Image.BICUBIC), dtype=np.float64) / 255.0


def _roads(rng: np.random.Generator) -> list[list[Point]]:
    """A kinked horizontal and vertical road meeting at one crossing, sometimes a spur from the crossing."""
    cross = (float(rng.integers(70, 186)), float(rng.integers(70, 186)))
    horizontal = [(0.0, float(rng.integers(60, 196))), cross, (float(SIZE), float(rng.integers(60, 196)))]
    vertical = [(float(rng.integers(60, 196)), 0.0), cross, (float(rng.integers(60, 196)), float(SIZE))]
    roads = [horizontal, vertical]
    if rng.random() < 0.5:
        roads.append([cross, (float(rng.integers(20, 236)), float(rng.integers(20, 236)))])
    return roads


def _position(centre: Point) -> str:
    x, y = centre
    row = "upper" if y < SIZE / 3 else "lower" if y > 2 * SIZE / 3 else "middle"
    col = "left" if x < SIZE / 3 else "right" if x > 2 * SIZE / 3 else "centre"
    return "centre" if (row, col) == ("middle", "centre") else f"{row} {col}" if row != "middle" else f"middle {col}"


AREA_WORDS = {
    "centre": ["in the centre", "at the centre of the image", "near the middle", "in the middle of the scene"],
    "upper centre": ["near the top", "at the top of the image", "in the upper centre"],
    "lower centre": ["near the bottom", "at the bottom of the image", "in the lower centre"],
    "middle left": ["on the left side", "in the middle left", "towards the left edge"],
    "middle right": ["on the right side", "in the middle right", "towards the right edge"],
}


def _where(position: str, rng: np.random.Generator) -> str:
    """A position ("upper left") said one of several ways ("in the upper left", "in the upper-left corner")."""
    if position in AREA_WORDS:
        options = AREA_WORDS[position]
    else:
        options = [
            f"in the {position}",
            f"at the {position}",
            f"in the {position.replace(' ', '-')} corner",
            f"towards the {position}",
            f"in the {position} part of the image",
        ]
    return options[int(rng.integers(len(options)))]


def _referring(objects: list[PlacedObject], rng: np.random.Generator) -> tuple[int, list[str]] | None:
    """An object that its class, look, size or position names uniquely, with two phrasings (RiSBench-style: class
    noun plus colour, size or position words)."""
    names = [o.label.replace("-", " ") for o in objects]
    positions = [_position(o.centre) for o in objects]
    areas = [(o.bounds[2] - o.bounds[0]) * (o.bounds[3] - o.bounds[1]) for o in objects]
    order = [int(i) for i in rng.permutation(len(objects))]
    for index in order:  # a class seen once: its name (with look or position) is enough
        if names.count(names[index]) == 1:
            name, look = names[index], OPTICAL_SHAPES[objects[index].label].look
            where = _where(positions[index], rng)
            return index, [f"the {look} {name} {where}", f"{name} located at the {positions[index]} of the image"]
    for index in order:  # the largest or smallest of its class
        same = [i for i in range(len(objects)) if names[i] == names[index]]
        sizes = sorted(areas[i] for i in same)
        if areas[index] == sizes[-1] and sizes[-1] > 1.3 * sizes[-2]:
            return index, [f"the largest {names[index]}", f"the biggest {names[index]} {_where(positions[index], rng)}"]
        if areas[index] == sizes[0] and sizes[1] > 1.3 * sizes[0]:
            return index, [
                f"the smallest {names[index]}",
                f"the smallest {names[index]} {_where(positions[index], rng)}",
            ]
    described = list(zip(names, positions, strict=True))
    for index in order:
        if described.count(described[index]) == 1:
            name, position = described[index]
            return index, [f"the {name} {_where(position, rng)}", f"the {position} {name}"]
    return None


def optical_scene(rng: np.random.Generator) -> OpticalScene:
    seeds = rng.uniform(0, SIZE, size=(6, 2))
    codes = np.array(VORONOI_CODES)[rng.permutation(len(VORONOI_CODES))]
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    nearest = np.argmin((xx[None] - seeds[:, 0, None, None]) ** 2 + (yy[None] - seeds[:, 1, None, None]) ** 2, axis=0)
    label = Image.fromarray(codes[nearest].astype(np.uint8))
    draw = ImageDraw.Draw(label)
    roads = _roads(rng)
    for road in roads:
        draw.line(road, fill=4, width=7)
    taken: list = []
    for _ in range(int(rng.integers(2, 5))):  # buildings off the roads: land cover only, not DOTA objects
        x, y = int(rng.integers(10, SIZE - 30)), int(rng.integers(10, SIZE - 30))
        w, h = int(rng.integers(10, 20)), int(rng.integers(10, 20))
        if (np.asarray(label)[y : y + h + 1, x : x + w + 1] == 4).any():
            continue
        draw.rectangle((x, y, x + w, y + h), fill=8)
        taken.append((x - 2, y - 2, x + w + 2, y + h + 2))
    landcover = np.asarray(label, dtype=np.uint8)
    palette = np.zeros((256, 3), dtype=np.float64)
    for code, colour in LANDCOVER_COLOURS.items():
        palette[code] = colour
    texture = rng.normal(0, 8, size=(SIZE, SIZE, 3)) + 20 * (_smooth_noise(rng, 16)[..., None] - 0.5)
    image = Image.fromarray(np.clip(palette[landcover] + texture, 0, 255).astype(np.uint8))

    def allowed(label: str, centre: Point) -> bool:  # ships on water, bridges and harbours anywhere, the rest on land
        on_water = bool(landcover[int(centre[1]), int(centre[0])] == 6)
        return on_water if label == "ship" else True if label in ("bridge", "harbor") else not on_water

    objects = _place(rng, OPTICAL_SHAPES, int(rng.integers(4, 10)), taken, allowed)
    draw = ImageDraw.Draw(image)
    for obj in objects:
        draw.polygon(obj.outline, fill=OPTICAL_SHAPES[obj.label].colour, outline=(20, 20, 20))
    clear = np.asarray(image, dtype=np.uint8)
    cloud = np.clip((_smooth_noise(rng, 6) - 0.45) * 3.0, 0.0, 1.0)[..., None]
    cloudy = np.clip(clear * (1 - cloud) + 240.0 * cloud, 0, 255).astype(np.uint8)
    return OpticalScene(clear, cloudy, landcover, roads, objects, _referring(objects, rng))


def sar_scene(rng: np.random.Generator, sixteen_bit: bool) -> SarScene:
    """Sea on one side of a wavy coast, land on the other; ships at sea, everything else on land."""
    coast = SIZE * rng.uniform(0.3, 0.6) + 12 * np.sin(np.arange(SIZE) / rng.uniform(15, 40))
    xx = np.arange(SIZE)[None, :]
    sea = xx < coast[:, None]
    intensity = np.where(sea, 0.02, 0.12 + 0.1 * _smooth_noise(rng, 12))

    def allowed(label: str, centre: Point) -> bool:
        at_sea = bool(sea[int(centre[1]), int(centre[0])])
        return at_sea if label == "ship" else not at_sea if label in ("aircraft", "car", "tank") else True

    objects = _place(rng, SAR_SHAPES, int(rng.integers(2, 6)), [], allowed)
    canvas = Image.new("L", (SIZE, SIZE), 0)
    draw = ImageDraw.Draw(canvas)
    for obj in objects:
        draw.polygon(obj.outline, fill=SAR_SHAPES[obj.label].colour[0])
    targets = np.asarray(canvas, dtype=np.float64) / 255.0
    intensity = np.maximum(intensity, targets)
    looks = 3.0
    speckle = rng.gamma(looks, 1.0 / looks, size=(SIZE, SIZE))  # multiplicative, mean 1
    return SarScene(np.sqrt(intensity * speckle), objects, sixteen_bit, float(sea.mean()))
