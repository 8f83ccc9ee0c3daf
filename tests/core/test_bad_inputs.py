"""Bad input ends in one clear line (GeoPilotInputError in the API, exit 2 on the CLI)."""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import stat
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from geopilot.cli import main
from geopilot.errors import ConfigError, GeoPilotInputError, ImageInputError, SampleError, WeightsError
from geopilot.image import load_image

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\n%%EndComments\nshowpage\n%%EOF\n"


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


# -- images (items 2, 6, 8) -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (np.zeros((0, 0, 3), np.uint8), "empty"),
        (np.zeros((0, 7), np.uint8), "empty"),
        (np.zeros((0,), np.uint8), "expected an (H, W) or (H, W, C) array"),
        (np.array([["a", "b"]]), "array of numbers"),
        (np.array([[object()]]), "array of numbers"),
        (Image.new("RGB", (0, 0)), "empty"),
        (object(), "got object"),
        (12, "got int"),
    ],
)
def test_empty_and_non_image_inputs_are_one_line_errors(source, message):
    with pytest.raises(ImageInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_image(source)


def test_a_directory_says_so(tmp_path):
    with pytest.raises(ImageInputError, match="is a directory, not an image file"):
        load_image(tmp_path)


def test_eps_and_other_decoders_are_unreachable(tmp_path):
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, format="BMP")  # a format Pillow reads, GeoPilot does not
    (tmp_path / "scene.png").write_bytes(EPS)  # EPS under an image name
    for source in (EPS, buffer.getvalue(), tmp_path / "scene.png"):
        with pytest.raises(ImageInputError, match="not an image file in a format GeoPilot reads"):
            load_image(source)
    for fmt in ("PNG", "JPEG", "TIFF", "WEBP"):
        buffer = io.BytesIO()
        Image.new("RGB", (5, 3), (1, 2, 3)).save(buffer, format=fmt)
        assert load_image(buffer.getvalue()).image.size == (5, 3)


@pytest.fixture(scope="module")
def pilot(tiny):
    from geopilot.agent import GeoPilot
    from geopilot.tool_protocol import ToolRegistry

    return GeoPilot(*tiny, ToolRegistry([]))


@pytest.mark.parametrize("image", [np.zeros((0, 0, 3), np.uint8), np.zeros((0,)), object(), Image.new("RGB", (0, 0))])
def test_chat_refuses_empty_and_non_images(pilot, image):
    with pytest.raises(GeoPilotInputError):
        pilot.chat(image, "What is in the image?")


def test_bad_timeouts_are_input_errors(pilot, capsys):
    from geopilot.agent import GeoPilot

    for bad in ({"tool_timeout_s": -1}, {"tool_timeout_s": 0}, {"chat_timeout_s": float("nan")}, {"max_tool_calls": 0}):
        with pytest.raises(GeoPilotInputError):
            GeoPilot(pilot.model, pilot.processor, pilot._tools, **bad)
    image = str(EXAMPLES / "images" / "airport.png")
    assert main(["chat", "--model", "/nonexistent", "--image", image, "--tool-timeout", "-1", "hi"]) == 2
    assert "--tool-timeout must be a number of seconds > 0" in one_line_error(capsys)


# -- devices and model files (item 6) -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("tpu9", "unknown device 'tpu9'"),
        pytest.param(
            "cuda",
            "CUDA is not available",
            marks=pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this host has CUDA"),
        ),
    ],
)
def test_chat_with_an_unusable_device_exits_2(tiny_model_dir, device, message, capsys):
    image = str(EXAMPLES / "images" / "airport.png")
    assert main(["chat", "--model", str(tiny_model_dir), "--image", image, "--device", device, "hi"]) == 2
    assert message in one_line_error(capsys)


def test_truncated_safetensors_is_one_line(tiny_model_dir, tmp_path, capsys):
    broken = tmp_path / "model"
    shutil.copytree(tiny_model_dir, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    image = str(EXAMPLES / "images" / "airport.png")
    assert main(["chat", "--model", str(broken), "--image", image, "--device", "cpu", "hi"]) == 2
    assert "the model weights cannot be read" in one_line_error(capsys)


def test_read_state_dict_fuzz_raises_only_weights_error(tmp_path):
    """Random bytes, alone and behind the magic numbers torch.load looks at: only WeightsError escapes."""
    import torch

    from geopilot.tools.weights import read_state_dict

    rng = random.Random(11)
    saved = io.BytesIO()
    torch.save({"w": torch.zeros(3)}, saved)
    real = saved.getvalue()
    prefixes = [b"", b"PK\x03\x04", b"\x80\x02", b"\x80\x04\x95", b"hello world\n", real[:64], real[: len(real) // 2]]
    cases = [b"", b"\n", real[:-10]]
    cases += [rng.choice(prefixes) + rng.randbytes(rng.randint(0, 600)) for _ in range(150)]
    for index, data in enumerate(cases):
        for suffix in (".pth", ".safetensors"):
            path = tmp_path / f"case{index}{suffix}"
            path.write_bytes(data)
            with pytest.raises(WeightsError) as err:
                read_state_dict(path)
            assert "\n" not in str(err.value)


# -- training data and configs (item 6) -----------------------------------------------------------------------------


def test_invalid_utf8_is_one_bad_line(tmp_path):
    from geopilot.sample import LoadReport, load_samples

    good = (EXAMPLES / "samples.jsonl").read_bytes().splitlines(keepends=True)[0]
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"id": "caf\xe9"}\n' + good + b"\xff\xfe\x00\n")
    report = LoadReport()
    samples = list(load_samples(path, on_error="skip", report=report))
    assert len(samples) == 1 and report.skipped == 2
    assert report.errors == [
        "line 1: not valid UTF-8 (byte 12 of the line)",
        "line 3: not valid UTF-8 (byte 1 of the line)",
    ]
    with pytest.raises(SampleError, match="line 1: not valid UTF-8"):
        list(load_samples(path, on_error="raise"))


@pytest.mark.parametrize(
    "content", [b"", b"\n \n\t\n", b"{not json\n\xff\n[1, 2]\n"], ids=["empty", "blank", "all-bad"]
)
def test_training_without_samples_is_the_no_samples_error(tmp_path, tiny_tokenizer, content):
    from geopilot.training.config import DataConfig
    from geopilot.training.data import TrainingDataError, build_training_data

    path = tmp_path / "data.jsonl"
    path.write_bytes(content)
    cfg = DataConfig(files=[str(path)], max_skip_fraction=1.0)
    with pytest.raises(TrainingDataError, match="no training samples"):
        build_training_data(cfg, 1, tiny_tokenizer, 4, tmp_path / "cache")


@pytest.mark.parametrize("section", ["optimizer", "scheduler"])
def test_deepspeed_optimizer_or_scheduler_is_refused_at_config_load(tmp_path, section):
    from geopilot.training.config import load_train_config

    ds = json.loads((ROOT / "configs/deepspeed/zero2.json").read_text())
    ds[section] = {"type": "AdamW" if section == "optimizer" else "WarmupLR", "params": {}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds))
    with pytest.raises(ConfigError, match=f"remove the '{section}' section"):
        load_train_config(ROOT / "configs/tiny/stage1.yaml", [f"engine.deepspeed={path}", "output_dir=x"])


def test_single_process_deepspeed_is_refused_with_the_torchrun_command(tmp_path, monkeypatch, capsys):
    sys.path.insert(0, str(ROOT))
    import train

    monkeypatch.delenv("RANK", raising=False)
    data = tmp_path / "data.jsonl"
    shutil.copy(EXAMPLES / "samples.jsonl", data)
    argv = [
        "--config",
        str(ROOT / "configs/tiny/stage1.yaml"),
        f"output_dir={tmp_path / 'out'}",
        f"data.files=[{data}]",
    ]
    assert train.main([*argv, f"engine.deepspeed={ROOT / 'configs/deepspeed/zero2.json'}"]) == 2
    assert "torchrun --nproc_per_node 1 train.py" in one_line_error(capsys)
    assert not (tmp_path / "out").exists()


# -- item 8: inspect, journal, export permissions -------------------------------------------------------------------


def test_inspect_empty_file_exits_2(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    assert main(["inspect", "--data", str(empty)]) == 2
    assert "no samples" in one_line_error(capsys)


def test_inspect_names_the_line_once_and_reports_duplicate_ids(tmp_path, capsys):
    sample = json.loads((EXAMPLES / "samples.jsonl").read_text().splitlines()[0])
    sample["image"] = str(EXAMPLES / sample["image"])
    first = json.dumps(sample)
    data = tmp_path / "data.jsonl"
    data.write_bytes(f"{first}\n{{broken\n{first}\n".encode() + b"\xff\n")
    assert main(["inspect", "--data", str(data)]) == 2
    out = capsys.readouterr().out
    assert "line 2: line 2" not in out and out.count("line 2:") == 1
    sample_id = json.loads(first)["id"]
    assert f"sample {sample_id!r}, line 3: duplicate id (first on line 1)" in out
    assert "line 4: not valid UTF-8" in out
    assert main(["inspect", "--data", str(data), "--json"]) == 2
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[-1]["summary"] == {"samples": 4, "ok": 1, "errors": 3, "zero_trained": 0}


def test_a_corrupt_journal_line_is_skipped_and_counted(tmp_path):
    from geopilot.data_gen.journal import Journal

    def entry(i: int) -> dict:
        return {"id": f"s{i}", "status": "kept", "meta": {}, "sample": {"messages": []}}

    journal = Journal(tmp_path)
    lines = [json.dumps(entry(0)), "{corrupt", json.dumps(entry(1)), '"not an entry"', json.dumps(entry(2))]
    journal.path(0).write_bytes(("\n".join(lines) + "\n").encode() + b'{"id": "s3", "sta')  # + a torn tail
    recovered = journal.recover()
    assert sorted(recovered) == ["s0", "s1", "s2"]  # nothing after the corrupt line is lost
    assert (journal.corrupt_lines, journal.torn_lines) == (2, 1)
    assert sorted(journal.read_shard(0)) == ["s0", "s1", "s2"]


def test_model_directories_are_0755(tiny_model_dir):
    assert stat.S_IMODE(os.stat(tiny_model_dir).st_mode) == 0o755
