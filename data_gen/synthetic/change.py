"""Bi-temporal synthetic scenes for change detection and change captioning, in LEVIR-CD's and LEVIR-CC's layouts.

A pair is one patch of ground seen twice: image A (before) with a few buildings, image B (after, in another light)
where some buildings were demolished (bare ground where they stood) and new ones were built; the label is 255 on
the pixels of every demolished and every new building and 0 elsewhere. Buildings keep a gap of a few pixels, so
each changed building is one 8-connected region of the label. Every fifth pair has no change (as LEVIR-CD has
pairs without any), and its label is all 0.
  LEVIR-CD/train/{A,B,label}/synth_<i>.png                 the pairs with their 0/255 labels
  LEVIR-CC/LevirCCcaptions.json + images/train/{A,B}/train_<i>.png   the same pairs, five change captions each
Deterministic per seed, like the rest of `geopilot synth`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from geopilot.data_gen.synthetic.scenes import LANDCOVER_COLOURS, SIZE, png_bytes

GAP = 4  # pixels between buildings: distinct buildings never touch, even diagonally
UNCHANGED_EVERY = 5  # pair i with i % 5 == 4 has no change
Rect = tuple[int, int, int, int]  # x1, y1, x2, y2 inclusive, pixels


@dataclass(frozen=True)
class ChangePair:
    before: np.ndarray  # (SIZE, SIZE, 3) uint8
    after: np.ndarray
    label: np.ndarray  # (SIZE, SIZE) uint8, 0 / 255
    built: tuple[Rect, ...]
    demolished: tuple[Rect, ...]


def _free(rect: Rect, taken: list[Rect]) -> bool:
    x1, y1, x2, y2 = rect
    return all(x2 + GAP < a or b + GAP < x1 or y2 + GAP < c or d + GAP < y1 for a, c, b, d in taken)


def _buildings(rng: np.random.Generator, count: int, taken: list[Rect]) -> list[Rect]:
    placed = []
    for _ in range(count * 20):
        if len(placed) == count:
            break
        w, h = int(rng.integers(12, 28)), int(rng.integers(12, 28))
        x, y = int(rng.integers(4, SIZE - w - 4)), int(rng.integers(4, SIZE - h - 4))
        rect = (x, y, x + w, y + h)
        if _free(rect, taken):
            taken.append(rect)
            placed.append(rect)
    return placed


def _paint(ground: np.ndarray, buildings: list[Rect], roofs: list[tuple[int, int, int]]) -> np.ndarray:
    image = Image.fromarray(ground)
    draw = ImageDraw.Draw(image)
    for rect, roof in zip(buildings, roofs, strict=True):
        draw.rectangle(rect, fill=roof, outline=(30, 30, 30))
    return np.asarray(image)


def change_pair(rng: np.random.Generator, changed: bool = True) -> ChangePair:
    """One pair: ground texture, 3..6 buildings before; after, 0..2 of them demolished and 1..3 new ones."""
    yy = np.linspace(0, 1, SIZE)[:, None, None]
    tint = np.array(LANDCOVER_COLOURS[2], dtype=np.float64) * (1 - yy) + np.array(LANDCOVER_COLOURS[1]) * yy
    ground = np.clip(tint + rng.normal(0, 6, size=(SIZE, SIZE, 3)), 0, 255).astype(np.uint8)
    taken: list[Rect] = []
    old = _buildings(rng, int(rng.integers(3, 7)), taken)
    roofs = [tuple(int(v) for v in rng.integers(120, 230, size=3)) for _ in old]
    demolished = []
    if changed:
        gone = min(int(rng.integers(0, 3)), len(old))  # a crowded patch may hold fewer buildings than asked
        demolished = [old[i] for i in sorted(rng.choice(len(old), gone, replace=False))]
    built = _buildings(rng, int(rng.integers(1, 4)), taken) if changed else []
    new_roofs = [tuple(int(v) for v in rng.integers(120, 230, size=3)) for _ in built]
    before = _paint(ground, old, roofs)
    kept = [(r, roof) for r, roof in zip(old, roofs, strict=True) if r not in demolished]
    bare = _paint(ground, demolished, [LANDCOVER_COLOURS[1]] * len(demolished))  # rubble-coloured lots
    after = _paint(bare, [r for r, _ in kept] + built, [roof for _, roof in kept] + new_roofs)
    light = rng.uniform(0.9, 1.1)  # another date, another sun: unchanged pixels differ too, and stay 0
    after = np.clip(after.astype(np.float64) * light + rng.normal(0, 3, size=after.shape), 0, 255).astype(np.uint8)
    label = Image.new("L", (SIZE, SIZE), 0)
    draw = ImageDraw.Draw(label)
    for rect in demolished + built:
        draw.rectangle(rect, fill=255)
    return ChangePair(before, after, np.asarray(label), tuple(built), tuple(demolished))


def _where(rect: Rect) -> str:
    cx, cy = (rect[0] + rect[2]) / 2 / SIZE, (rect[1] + rect[3]) / 2 / SIZE
    row = "top" if cy < 1 / 3 else "bottom" if cy > 2 / 3 else "middle"
    col = "left" if cx < 1 / 3 else "right" if cx > 2 / 3 else "centre"
    if row == "middle":
        return "in the centre" if col == "centre" else f"on the {col}"
    return f"at the {row} {col}"


NUMBERS = ("no", "one", "two", "three", "four", "five", "six")


def captions(pair: ChangePair) -> list[str]:
    """Five change captions of a pair, LEVIR-CC style: lower case, spaces before the final full stop."""
    built, gone = len(pair.built), len(pair.demolished)
    if not built and not gone:
        return [
            " the scene is the same as before .",
            " there is no difference .",
            " nothing has changed .",
            " the two images look the same .",
            " no change has occurred .",
        ]
    houses = f"{NUMBERS[built]} building{'s' if built != 1 else ''}"
    where = _where(pair.built[0]) if built else _where(pair.demolished[0])
    tail = f" and {NUMBERS[gone]} {'has' if gone == 1 else 'have'} been removed" if gone else ""
    if not built:
        removed = f"{NUMBERS[gone]} building{'s' if gone != 1 else ''}"
        return [
            f" {removed} {'has' if gone == 1 else 'have'} been demolished {where} .",
            f" {removed} disappeared {where} .",
            f" the {'building' if gone == 1 else 'buildings'} {where} {'is' if gone == 1 else 'are'} gone .",
            f" {removed} {where} {'was' if gone == 1 else 'were'} torn down .",
            f" some land has been cleared {where} .",
        ]
    return [
        f" {houses} {'has' if built == 1 else 'have'} been built {where}{tail} .",
        f" {houses} appeared {where}{tail} .",
        f" new {'building is' if built == 1 else 'buildings are'} constructed {where} .",
        f" {houses} {'was' if built == 1 else 'were'} added {where}{tail} .",
        f" there {'is' if built == 1 else 'are'} {houses[:-1] if built == 1 else houses} more {where} .",
    ]


def write_levir_cd(root: Path, pairs: list[ChangePair]) -> dict:
    records = {}
    for i, pair in enumerate(pairs):
        name = f"synth_{i}.png"
        for folder, pixels in (("A", pair.before), ("B", pair.after), ("label", pair.label)):
            (root / "train" / folder).mkdir(parents=True, exist_ok=True)
            (root / "train" / folder / name).write_bytes(png_bytes(pixels))
        records[f"train/synth_{i}"] = {
            "built": len(pair.built),
            "demolished": len(pair.demolished),
            "changed_pixels": int((pair.label > 0).sum()),
        }
    return {"reader": "levir_cd", "root": "LEVIR-CD", "split": "train", "records": records}


def write_levir_cc(root: Path, pairs: list[ChangePair]) -> dict:
    images, records = [], {}
    for i, pair in enumerate(pairs):
        name = f"train_{i:06d}.png"
        for folder, pixels in (("A", pair.before), ("B", pair.after)):
            (root / "images" / "train" / folder).mkdir(parents=True, exist_ok=True)
            (root / "images" / "train" / folder / name).write_bytes(png_bytes(pixels))
        texts = captions(pair)
        sentences = [
            {"tokens": text.replace(" .", "").split(), "raw": text, "imgid": i, "sentid": 5 * i + k}
            for k, text in enumerate(texts)
        ]
        images.append(
            {
                "filepath": "train",
                "filename": name,
                "imgid": i,
                "split": "train",
                "sentences": sentences,
                "sentids": [s["sentid"] for s in sentences],
                "changeflag": int(bool(pair.built or pair.demolished)),
            }
        )
        records[f"train/train_{i:06d}"] = {"captions": len(texts)}
    root.mkdir(parents=True, exist_ok=True)
    (root / "LevirCCcaptions.json").write_text(json.dumps({"images": images}), encoding="utf-8")
    return {"reader": "levir_cc", "root": "LEVIR-CC", "split": "train", "records": records}


def change_pairs(seed: int, count: int) -> list[ChangePair]:
    return [
        change_pair(np.random.default_rng([seed, 2, i]), changed=i % UNCHANGED_EVERY != UNCHANGED_EVERY - 1)
        for i in range(count)
    ]
