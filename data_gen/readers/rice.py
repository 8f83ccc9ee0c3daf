"""RICE cloud-removal reader: cloudy / cloud-free pairs of RICE1 (Google Earth) and RICE2 (Landsat-8).

Layouts, per subset folder (`RICE1/`, `RICE2/`; the root may also be one subset folder):
- the official release (BUPTLdy/RICE_DATASET): `cloud/<n>.png` + `label/<n>.png` (RICE2 also has `mask/`);
- SpA-GAN's (Penn000/SpA-GAN_for_cloud_removal `data/RICE_DATASET/`): `cloudy_image/<n>.png` + `ground_truth/<n>.png`,
  with `train_list.txt` / `test_list.txt` (one file name per line, e.g. `476.png`, CRLF line ends).
Pairs match by file name; the second image is the cloud-free reference.

Split ("train", "test", or "all" for every pair), first rule that applies:
1. a `test_list.txt` in the subset folder: a pair is "test" when its file name is listed, else "train";
2. RICE1 without one: SpA-GAN's published RICE1 split (`SPAGAN_RICE1_TEST`, the 100 test names of its
   `test_list.txt`; its `train_list.txt` holds the other 400), because the released SpA-GAN RICE1 checkpoint was
   trained on that train list, so its test pairs are the only fair ones to evaluate it on;
3. otherwise (RICE2 has no published list): "test" when the first byte of sha1("<subset>/<stem>") is below 52
   (~20%), else "train" (`rice_split`).
Run: `read_rice(Path("RICE_DATASET"), split="test")`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from geopilot.data_gen.readers.common import (
    IMAGE_SUFFIXES,
    MISSING_LABEL,
    SIZE_MISMATCH,
    DatasetRootError,
    ReadResult,
    checked_image,
    finish,
    image_size,
    read_index_file,
    require_dir,
)
from geopilot.records import AnnotationRecord, ReadReport

SUBSETS = ("RICE1", "RICE2")
SPLITS = ("train", "test", "all")
PAIR_FOLDERS = (("cloud", "label"), ("cloudy_image", "ground_truth"))  # official, SpA-GAN
TEST_LIST = "test_list.txt"
TEST_BYTE_BELOW = 52  # 52/256 ~ 20% test
# SpA-GAN's RICE1 test list (data/RICE_DATASET/RICE1/test_list.txt, MIT licence, Penn000 2019), as numbers.
SPAGAN_RICE1_TEST = frozenset(
    {
        0,
        6,
        7,
        8,
        9,
        14,
        20,
        21,
        36,
        38,
        43,
        46,
        47,
        48,
        51,
        59,
        64,
        67,
        68,
        70,
        72,
        86,
        89,
        104,
        116,
        126,
        127,
        131,
        135,
        140,
        141,
        143,
        144,
        148,
        162,
        163,
        166,
        186,
        192,
        199,
        208,
        213,
        217,
        218,
        228,
        232,
        237,
        238,
        240,
        243,
        245,
        248,
        250,
        251,
        261,
        263,
        276,
        282,
        285,
        292,
        299,
        301,
        304,
        315,
        318,
        321,
        323,
        325,
        330,
        332,
        333,
        338,
        343,
        349,
        350,
        352,
        356,
        367,
        376,
        380,
        383,
        387,
        393,
        406,
        413,
        422,
        423,
        425,
        434,
        446,
        448,
        467,
        469,
        471,
        479,
        480,
        486,
        488,
        490,
        498,
    }
)


def rice_split(subset: str, stem: str) -> str:
    """The hash split for subsets without a published list."""
    return "test" if hashlib.sha1(f"{subset}/{stem}".encode()).digest()[0] < TEST_BYTE_BELOW else "train"


def _numeric_first(path: Path) -> tuple[int, str]:
    return (int(path.stem), path.stem) if path.stem.isdigit() else (1 << 62, path.stem)


def _splitter(subset: str, folder: Path):
    """file name -> split, by the rules in the module docstring."""
    listed = folder / TEST_LIST
    if listed.is_file():
        test = set(read_index_file(listed, "RICE").split())
        return lambda name: "test" if name in test else "train"
    if subset.upper() == "RICE1":
        return lambda name: (
            "test" if Path(name).stem.isdigit() and int(Path(name).stem) in SPAGAN_RICE1_TEST else "train"
        )
    return lambda name: rice_split(subset, Path(name).stem)


def _pair_folders(folder: Path) -> tuple[Path, Path] | None:
    return next(((folder / a, folder / b) for a, b in PAIR_FOLDERS if (folder / a).is_dir()), None)


def read_rice(root: Path, split: str = "train") -> ReadResult:
    if split not in SPLITS:
        raise DatasetRootError(f"RICE: split must be one of {list(SPLITS)}")
    root = require_dir(root, "RICE", "expected RICE1/ and/or RICE2/ with cloud/+label/ or cloudy_image/+ground_truth/")
    subsets = [(name, root / name) for name in SUBSETS if _pair_folders(root / name) is not None]
    if not subsets and _pair_folders(root) is not None:
        subsets = [(root.name, root)]
    if not subsets:
        raise DatasetRootError(f"RICE: no RICE1/ or RICE2/ with cloud/ or cloudy_image/, and none in {root} itself")
    report = ReadReport()
    records: list[AnnotationRecord] = []
    for subset, folder in subsets:
        cloud_dir, clear_dir = _pair_folders(folder)
        split_of = _splitter(subset, folder)
        clouds = [p for p in cloud_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES]
        for cloud in sorted(clouds, key=_numeric_first):
            record_split = split_of(cloud.name)
            if split != "all" and record_split != split:
                continue
            image = checked_image(cloud, report, f"{subset} {cloud.name}")
            if image is None:
                continue
            cloud_path, width, height = image
            clear = clear_dir / cloud.name
            if not clear.is_file():
                report.skip(MISSING_LABEL, f"{subset} {cloud.name}: no cloud-free pair {clear}")
                continue
            if image_size(clear) != (width, height):
                report.skip(SIZE_MISMATCH, f"{subset} {cloud.name}: pair size {image_size(clear)} vs {width}x{height}")
                continue
            record = AnnotationRecord(
                "RICE", str(cloud_path), width, height, "optical", record_split, f"{subset}/{cloud.stem}"
            )
            record.cloud_free_image = str(clear.resolve())
            records.append(record)
    return finish(records, report)
