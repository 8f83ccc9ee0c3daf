"""`geopilot generate check` under hostile input (issue 37): label files that are sparse 2 GB files, FIFOs or
directories, and configs that are FIFOs, devices or nested too deep: exit 2, one line on stderr, no traceback,
bounded time and memory (a fresh process, measured). A label file is never read past its kind's limit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from helpers.hostile import not_a_small_file, run_cli
from PIL import Image

from geopilot.data_gen.readers.common import DATASET_FILE_MAX_BYTES, LABEL_FILE_MAX_BYTES

GOOD_LINE = "10 10 40 10 40 40 10 40 small-vehicle 0\n"


def dota_root(root: Path, label) -> Path:
    """A DOTA v1.0 train split of one 100 x 100 image whose label file is made by `label(path)`."""
    (root / "train/images").mkdir(parents=True)
    Image.new("RGB", (100, 100)).save(root / "train/images/P0000.png")
    labels = root / "train/labelTxt-v1.0/labelTxt"
    labels.mkdir(parents=True)
    label(labels / "P0000.txt")
    return root


def config_file(tmp_path: Path, root: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"sources": [{"reader": "dota", "root": str(root), "options": {"version": "1.0"}}]}))
    return path


def sparse(size: int):
    def make(path: Path) -> None:
        with path.open("wb") as handle:
            handle.write(GOOD_LINE.encode())
            handle.truncate(size)  # the rest is a hole: nothing on disk

    return make


def check(tmp_path, config):
    return run_cli(["generate", "check", "--config", config], tmp_path)


@pytest.mark.parametrize(
    ("label", "message"),
    [
        (sparse(2 * 2**30), f"over the limit of {LABEL_FILE_MAX_BYTES:,} bytes"),  # 2 GB claimed, KBs on disk
        (os.mkfifo, "is a FIFO"),  # read, it would hang
        pytest.param(Path.mkdir, "is a directory", marks=pytest.mark.slow),
    ],
)
def test_label_files_that_cannot_be_read_whole_fail_the_source(tmp_path, label, message):
    run = check(tmp_path, config_file(tmp_path, dota_root(tmp_path / "DOTA", label)))
    line = run.refused()
    assert message in line and message in run.stdout  # the source fails, naming the skipped file and why


def test_a_large_label_file_under_the_limit_is_still_read(tmp_path):
    root = dota_root(tmp_path / "DOTA", lambda path: path.write_text(GOOD_LINE * 20_000))  # ~800 KB, 20k objects
    run = check(tmp_path, config_file(tmp_path, root))
    assert run.code == 0 and "20,000 objects" in run.stdout, run.stderr


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("fifo", "is a FIFO"),
        ("dev_zero", "character device"),
        pytest.param("sparse", "over the limit of", marks=pytest.mark.slow),
        ("deep", "nested too deep"),
        pytest.param("binary", "not UTF-8", marks=pytest.mark.slow),
        pytest.param("missing", "not found", marks=pytest.mark.slow),
    ],
)
def test_configs_that_are_not_small_yaml_files(tmp_path, config, message):
    path = not_a_small_file(tmp_path / "config.yaml", config)
    if config == "deep":
        path.write_text("a: " + "[" * 50_000 + "]" * 50_000)
    elif config == "binary":
        path.write_bytes(b"\xff\xfe\x00\x01sources: []")
    assert message in check(tmp_path, path).refused()


def test_a_sparse_annotation_file_the_whole_source_hangs_on_is_refused_from_its_size(tmp_path):
    annotations = tmp_path / "SARDet" / "Annotations" / "train.json"
    annotations.parent.mkdir(parents=True)
    with annotations.open("wb") as handle:
        handle.truncate(2 * 2**30)  # a 2 GB COCO JSON claimed, nothing on disk
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"sources": [{"reader": "sardet", "root": str(tmp_path / "SARDet")}]}))
    line = check(tmp_path, path).refused()
    assert f"over the limit of {DATASET_FILE_MAX_BYTES:,} bytes" in line
