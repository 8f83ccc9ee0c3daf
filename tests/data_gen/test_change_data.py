"""The change data: LEVIR-CD and LEVIR-CC read in their published layouts (bad pairs skipped and counted),
two-image change traces whose tool output is exactly the labelled change, and `geopilot synth`'s bi-temporal pairs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from geopilot.cli import main as cli_main
from geopilot.data_gen.generate import generate_dataset
from geopilot.data_gen.generate_config import GenerateConfig
from geopilot.data_gen.readers import READERS
from geopilot.sample import IMAGE_PLACEHOLDER, load_samples
from geopilot.tool_output import decode_mask

SIZE = 64


def _png(path: Path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def _photo(seed: int, size: int = SIZE) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, size=(size, size, 3), dtype=np.uint8)


def change_label(size: int = SIZE) -> np.ndarray:
    """Three changed regions under 8-connectivity: two rectangles and two pixels that touch only at a corner."""
    label = np.zeros((size, size), dtype=np.uint8)
    label[5:10, 5:15] = 255  # 50 px
    label[30:40, 40:50] = 255  # 100 px
    label[20, 20] = label[21, 21] = 255  # one region of 2 px (diagonal neighbours)
    return label


def write_levir_cd(root: Path, bad: bool = True) -> None:
    """LEVIR-CD as released: <split>/{A,B,label}/<name>.png, labels 0/255; with `bad`, four pairs that must be
    skipped: a label of another size, a B of another size, no B, no label."""
    _png(root / "train" / "A" / "train_1.png", _photo(1))
    _png(root / "train" / "B" / "train_1.png", _photo(2))
    _png(root / "train" / "label" / "train_1.png", change_label())
    _png(root / "train" / "A" / "train_2.png", _photo(3))  # nothing changed: an all-zero label
    _png(root / "train" / "B" / "train_2.png", _photo(4))
    _png(root / "train" / "label" / "train_2.png", np.zeros((SIZE, SIZE), dtype=np.uint8))
    _png(root / "test" / "A" / "test_1.png", _photo(5))
    _png(root / "test" / "B" / "test_1.png", _photo(6))
    _png(root / "test" / "label" / "test_1.png", change_label())
    if bad:
        _png(root / "train" / "A" / "train_3.png", _photo(7))
        _png(root / "train" / "B" / "train_3.png", _photo(8))
        _png(root / "train" / "label" / "train_3.png", change_label(32))  # label of another size
        _png(root / "train" / "A" / "train_4.png", _photo(9))
        _png(root / "train" / "B" / "train_4.png", _photo(10, 32))  # B of another size
        _png(root / "train" / "label" / "train_4.png", change_label())
        _png(root / "train" / "A" / "train_5.png", _photo(11))  # no B
        _png(root / "train" / "label" / "train_5.png", change_label())
        _png(root / "train" / "A" / "train_6.png", _photo(12))  # no label
        _png(root / "train" / "B" / "train_6.png", _photo(13))


def _sentence(raw: str, imgid: int, sentid: int) -> dict:
    return {"tokens": raw.replace(" .", "").split(), "raw": raw, "imgid": imgid, "sentid": sentid}


def write_levir_cc(root: Path) -> None:
    """LEVIR-CC as released: LevirCCcaptions.json + images/<split>/{A,B}/<filename>."""
    entries = []
    for imgid, (split, name, raws, flag) in enumerate(
        [
            ("train", "train_000001.png", [" the scene is the same as before .", " there is no difference ."], 0),
            ("train", "train_000002.png", [" two houses have been built on the left side .", "  a road appears ."], 1),
            ("train", "train_000003.png", [" some trees are gone ."], 1),  # B missing
            ("train", "train_000004.png", [], 1),  # no caption
            ("test", "test_000001.png", [" many villas are built along the road ."], 1),
        ]
    ):
        entries.append(
            {
                "filepath": split,
                "filename": name,
                "imgid": imgid,
                "split": split,
                "sentences": [_sentence(r, imgid, 5 * imgid + k) for k, r in enumerate(raws)],
                "sentids": [5 * imgid + k for k in range(len(raws))],
                "changeflag": flag,
            }
        )
        _png(root / "images" / split / "A" / name, _photo(imgid, 32))
        if name != "train_000003.png":
            _png(root / "images" / split / "B" / name, _photo(imgid + 50, 32))
    entries[1]["sentences"][1].pop("raw")  # a sentence with tokens only is read from its tokens
    (root / "LevirCCcaptions.json").write_text(json.dumps({"images": entries}))


def test_levir_cd_reads_pairs_and_counts_each_bad_pair(tmp_path):
    write_levir_cd(tmp_path / "LEVIR-CD")
    records, report = READERS["levir_cd"](tmp_path / "LEVIR-CD", split="train")
    assert [r.record_id for r in records] == ["train/train_1", "train/train_2"]
    assert report.skipped == {"size_mismatch": 2, "missing_image": 1, "missing_label": 1}
    assert any("label 32x32" in e for e in report.examples["size_mismatch"])
    assert any("train_5.png B" in e for e in report.examples["missing_image"])
    record = records[0]
    assert (record.width, record.height, record.source) == (SIZE, SIZE, "LEVIR-CD")
    assert record.image.endswith("train/A/train_1.png") and record.after_image.endswith("train/B/train_1.png")
    assert record.change_mask.endswith("train/label/train_1.png")
    test_records, test_report = READERS["levir_cd"](tmp_path / "LEVIR-CD", split="test")
    assert [r.record_id for r in test_records] == ["test/test_1"] and test_report.skipped == {}


def test_levir_cc_reads_captions_and_counts_each_bad_entry(tmp_path):
    write_levir_cc(tmp_path / "LEVIR-CC")
    records, report = READERS["levir_cc"](tmp_path / "LEVIR-CC", split="train")
    assert [r.record_id for r in records] == ["train/train_000001", "train/train_000002"]
    assert report.skipped == {"missing_image": 1, "malformed_line": 1}
    captions = [[t for d in r.dialogues for _, t in d.turns] for r in records]
    assert captions == [
        ["the scene is the same as before.", "there is no difference."],
        ["two houses have been built on the left side.", "a road appears"],
    ]
    assert records[1].after_image.endswith("images/train/B/train_000002.png") and records[1].change_mask is None
    test_records, _ = READERS["levir_cc"](tmp_path / "LEVIR-CC", split="test")
    assert [r.record_id for r in test_records] == ["test/test_000001"]


def _config(tmp_path: Path, sources: list[dict], **extra) -> Path:
    path = tmp_path / "change.yaml"
    path.write_text(yaml.safe_dump({"sources": sources, "backend": {"kind": "template"}, "seed": 0, **extra}))
    return path


def test_generate_check_reports_the_pairs_and_the_skips(tmp_path, capsys):
    write_levir_cd(tmp_path / "LEVIR-CD")
    write_levir_cc(tmp_path / "LEVIR-CC")
    config = _config(
        tmp_path,
        [
            {"reader": "levir_cd", "root": str(tmp_path / "LEVIR-CD")},
            {"reader": "levir_cc", "root": str(tmp_path / "LEVIR-CC")},
        ],
        max_skip_fraction=0.7,
    )
    assert cli_main(["generate", "check", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "2 records, 2 pairs, 2 change labels; images 64x64 .. 64x64 px" in out
    assert "skipped (66.7%, limit 70%): size_mismatch 2, missing_image 1, missing_label 1" in out
    assert "2 records, 2 pairs, 4 change captions; images 32x32 .. 32x32 px" in out
    assert "samples: change_detection 2" in out and "samples: change_captioning 2" in out
    config = _config(tmp_path, [{"reader": "levir_cd", "root": str(tmp_path / "LEVIR-CD")}])
    assert cli_main(["generate", "check", "--config", str(config)]) == 2  # 4 of 6 pairs skipped: over the limit


def test_a_levir_cd_root_becomes_two_image_traces_whose_change_is_the_label(tmp_path):
    from scipy import ndimage

    write_levir_cd(tmp_path / "LEVIR-CD", bad=False)
    config = GenerateConfig.model_validate(
        {
            "sources": [{"reader": "levir_cd", "root": str(tmp_path / "LEVIR-CD")}],
            "samples_per_record": 4,
            "backend": {"kind": "template"},
        }
    )
    out = tmp_path / "out"
    result = generate_dataset(config, out)
    samples = [s for shard in result.manifest["shards"] for s in load_samples(out / shard["path"])]
    assert len(samples) == 8 and {s.ability for s in samples} == {"change_detection"}
    label = change_label() > 0
    for sample in samples:
        before, after = sample.image_paths(out)
        assert sample.image is None and before.name == after.name and before.name in ("train_1.png", "train_2.png")
        assert before.parent.name == "A" and after.parent.name == "B" and before.is_file() and after.is_file()
        user, think, tool, answer = sample.messages
        assert user.content.count(IMAGE_PLACEHOLDER) == 2 and user.content.startswith(f"{IMAGE_PLACEHOLDER}\n")
        assert [a.tool for a in think.actions] == ["detect_changes"] and tool.name == "detect_changes"
        output = tool.content
        assert output.provenance == "annotations"
        expected = label if before.name == "train_1.png" else np.zeros_like(label)
        if expected.any():
            assert np.array_equal(decode_mask(output.segments[0].mask).astype(bool), expected)  # exactly the label
            union = np.zeros_like(expected)
            for detection in output.detections:
                region = decode_mask(detection.mask).astype(bool)
                assert not (union & region).any()
                union |= region
            assert np.array_equal(union, expected)
        else:
            assert output.segments == [] and output.detections == []
        regions = ndimage.label(expected, structure=np.ones((3, 3)))[1]
        assert output.data == {
            "changed_fraction": round(expected.mean(), 6),
            "changed_objects": regions,
        }
        assert len(output.detections) == regions == (3 if expected.any() else 0)
        if expected.any():
            assert [d.pixel_box for d in output.detections] == [(40, 30, 50, 40), (5, 5, 15, 10), (20, 20, 22, 22)]
        mask_artifact = [a for a in output.artifacts if a.kind == "mask"]
        assert mask_artifact and Path(mask_artifact[0].path).name == before.name
        assert answer.value and not answer.actions
        if expected.any():
            assert "3" in answer.value or f"{100 * expected.mean():.2f}%" in answer.value
        else:
            assert answer.value == "Nothing changed between the two images."


def test_levir_cc_becomes_tool_free_two_image_captions(tmp_path):
    write_levir_cc(tmp_path / "LEVIR-CC")
    config = GenerateConfig.model_validate(
        {
            "sources": [{"reader": "levir_cc", "root": str(tmp_path / "LEVIR-CC")}],
            "samples_per_record": 2,
            "backend": {"kind": "template"},
            "max_skip_fraction": 0.6,
        }
    )
    out = tmp_path / "out"
    result = generate_dataset(config, out)
    samples = [s for shard in result.manifest["shards"] for s in load_samples(out / shard["path"])]
    assert {s.ability for s in samples} == {"change_captioning"} and len(samples) == 4
    answers = {(s.id, s.messages[-1].value) for s in samples}
    assert ("levir-cc/train/train_000001/change_captioning/1", "There is no difference.") in answers
    assert all(len(s.images) == 2 and len(s.messages) == 2 and not s.messages[1].actions for s in samples)


def test_synth_writes_levir_pairs_the_readers_read_back(tmp_path):
    from geopilot.data_gen.synthetic.datasets import write_synthetic

    manifest = write_synthetic(tmp_path, seed=5, optical=5, sar=0)
    for name in ("LEVIR-CD", "LEVIR-CC"):
        entry = manifest["datasets"][name]
        records, report = READERS[entry["reader"]](tmp_path / entry["root"], split=entry["split"])
        assert report.skipped == {} and {r.record_id for r in records} == set(entry["records"])
    for record in READERS["levir_cd"](tmp_path / "LEVIR-CD", split="train")[0]:
        placed = manifest["datasets"]["LEVIR-CD"]["records"][record.record_id]
        label = np.asarray(Image.open(record.change_mask)) > 0
        assert int(label.sum()) == placed["changed_pixels"]
        from scipy import ndimage

        assert ndimage.label(label, structure=np.ones((3, 3)))[1] == placed["built"] + placed["demolished"]
    unchanged = manifest["datasets"]["LEVIR-CD"]["records"]["train/synth_4"]
    assert unchanged == {"built": 0, "demolished": 0, "changed_pixels": 0}
    again = tmp_path / "again"
    write_synthetic(again, seed=5, optical=5, sar=0)
    for path in (tmp_path / "LEVIR-CD").rglob("*.png"):
        assert path.read_bytes() == (again / path.relative_to(tmp_path)).read_bytes()
    assert (tmp_path / "LEVIR-CC/LevirCCcaptions.json").read_bytes() == (
        again / "LEVIR-CC/LevirCCcaptions.json"
    ).read_bytes()


@pytest.mark.parametrize("reader", ["levir_cd", "levir_cc"])
def test_an_unusable_root_is_one_line(tmp_path, reader):
    from geopilot.data_gen.readers import DatasetRootError

    with pytest.raises(DatasetRootError, match=r"^LEVIR-C[DC]: .*") as err:
        READERS[reader](tmp_path, split="train")
    assert "\n" not in str(err.value)
    with pytest.raises(DatasetRootError, match="split must be one of"):
        READERS[reader](tmp_path, split="trainval")
