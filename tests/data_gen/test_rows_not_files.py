"""Data files: skip the row, not the file (issue 22 item 7). A bad CSV / JSONL row is skipped and counted by cause and
the rest of the file read; a JSON file nested 100k deep is one line, exit 2; class names that are paths or markup
are counted and never reach a trace."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from PIL import Image

from geopilot.cli import main as cli_main
from geopilot.data_gen.generate import generate_dataset
from geopilot.data_gen.generate_config import GenerateConfig
from geopilot.data_gen.readers.sarlang import read_sarlang

DEEP = "[" * 100_000 + "]" * 100_000


def sarlang_root(root: Path, images: int) -> Path:
    for n in range(images):
        (root / "SARimages").mkdir(parents=True, exist_ok=True)
        Image.new("L", (32, 32)).save(root / f"SARimages/{n:07d}.jpg")
    return root


def vqa_rows(images: int) -> list[str]:
    return [f"{n:07d},How many ships are there?,{n}" for n in range(images)]


def test_a_300_kb_field_skips_its_row_and_the_other_rows_are_read(tmp_path):
    root = sarlang_root(tmp_path, 32)
    rows = vqa_rows(32)
    rows.insert(9, f'0000003,"{"x" * 300_000}",7')  # one 300 KB field: over the csv module's 128 KiB limit
    path = root / "Text/VQA/SARVQA1_train.csv"
    path.parent.mkdir(parents=True)
    path.write_text("image_name,question,answer\n" + "\n".join(rows) + "\n")
    records, report = read_sarlang(root, split="train")
    assert sum(len(r.dialogues) for r in records) == 32  # every good row (today: 8, or the whole file dropped)
    assert report.skipped == {"oversized_field": 1} and "line 11" in report.examples["oversized_field"][0]


def test_trailing_binary_garbage_loses_only_the_garbage_rows(tmp_path):
    root = sarlang_root(tmp_path, 5)
    path = root / "Text/caption/Caption-training.csv"
    path.parent.mkdir(parents=True)
    good = "image,caption\n" + "".join(f"{n:07d}.jpg,A harbour with {n} ships.\n" for n in range(5))
    path.write_bytes(good.encode() + b"\xff\xfe\x00\x81garbage\n\x9c\x00\x00,\xc3\n")
    records, report = read_sarlang(root, split="train")
    assert len(records) == 5 and all(len(r.dialogues) == 1 for r in records)
    assert set(report.skipped) <= {"not_utf8", "malformed_line"} and sum(report.skipped.values()) == 2


def test_a_bad_jsonl_line_skips_that_line_and_a_deep_json_file_only_that_file(tmp_path):
    root = sarlang_root(tmp_path, 3)
    lines = [json.dumps({"image": f"{n:07d}.jpg", "question": "Sea?", "answer": "yes"}) for n in range(3)]
    lines.insert(1, "{not json")
    lines.insert(2, DEEP)
    path = root / "Text/VQA/SARVQA1_train.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines) + "\n")
    (root / "Text/VQA/SARVQA2_train.json").write_text(DEEP)
    records, report = read_sarlang(root, split="train")
    assert len(records) == 3
    assert report.skipped == {"malformed_line": 2, "malformed_file": 1}
    assert any("nested too deep" in m for m in report.examples["malformed_file"] + report.examples["malformed_line"])


def test_a_json_file_nested_100k_deep_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "GeoChat/GeoChat_Instruct.json").parent.mkdir()
    (tmp_path / "GeoChat/GeoChat_Instruct.json").write_text(DEEP)
    (tmp_path / "SARDet/Annotations").mkdir(parents=True)
    (tmp_path / "SARDet/Annotations/train.json").write_text(DEEP)
    for reader, root in (("geochat_instruct", "GeoChat"), ("sardet", "SARDet")):
        config = tmp_path / f"{reader}.yaml"
        config.write_text(yaml.safe_dump({"sources": [{"reader": reader, "root": str(tmp_path / root)}]}))
        assert cli_main(["generate", "--config", str(config), "--out", str(tmp_path / "out"), "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "nested too deep" in err and "Traceback" not in err


def test_class_names_that_are_paths_or_markup_are_counted_and_never_reach_a_trace(tmp_path):
    (tmp_path / "DOTA/train/images").mkdir(parents=True)
    (tmp_path / "DOTA/train/labelTxt").mkdir(parents=True)
    for n in range(4):
        Image.new("RGB", (100, 100)).save(tmp_path / f"DOTA/train/images/P{n:04d}.png")
        (tmp_path / f"DOTA/train/labelTxt/P{n:04d}.txt").write_text(
            "10 10 30 10 30 30 10 30 ../../../etc/passwd 0\n"
            "40 40 60 40 60 60 40 60 <script>alert(1)</script> 0\n"
            "50 10 90 10 90 30 50 30 plane 0\n"
        )
    config = GenerateConfig(
        sources=[{"reader": "dota", "root": str(tmp_path / "DOTA"), "max_skip_fraction": 0.6}],
        abilities=["panoptic_detection", "object_detection"],
    )
    result = generate_dataset(config, tmp_path / "out")
    assert result.report["reader_skips_by_cause"]["dota"] == {"unsafe_class_name": 8}
    shards = b"".join(p.read_bytes() for p in (tmp_path / "out").glob("shard-*.jsonl"))
    assert result.report["kept"] == 8 and b"airplane" in shards
    assert b"passwd" not in shards and b"script" not in shards
