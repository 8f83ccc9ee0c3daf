"""The optical-replay ablation on the tiny configs: one stage-1 export, stage 2 for each paper alpha, SAR + optical
VQA for each, Table-14-style markdown and a plot (slow: five training runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.bench_fixtures import write_rsvqa, write_sarlang

from geopilot.cli import main

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_ablate_alpha_tiny_writes_table_and_plot(tmp_path, capsys):
    data = tmp_path / "data"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "geopilot.data_gen.synthetic.samples",
            "--out",
            str(data),
            "--optical",
            "8",
            "--sar",
            "8",
        ],
        check=True,
    )
    common = [
        f"data.files=[{data / 'train.jsonl'}]",
        "optim.max_steps=1",
        "optim.global_batch_size=4",
        "optim.per_device_batch_size=4",
        "logging.tensorboard=false",
        "logging.progress_bar=false",
    ]
    stage1 = tmp_path / "s1"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            "--config",
            str(REPO / "configs/tiny/stage1.yaml"),
            f"output_dir={stage1}",
            *common,
        ],
        check=True,
    )
    config = {
        "stage1": str(stage1 / "export"),
        "stage2_config": str(REPO / "configs/tiny/stage2.yaml"),
        "sar_vqa": str(write_sarlang(tmp_path / "sar")),
        "optical_vqa": str(write_rsvqa(tmp_path / "hr", "hr")),
        "out": str(tmp_path / "ablate"),
        "overrides": common,
        "batch_size": 4,
        "max_new_tokens": 6,
        "device": "cpu",
    }
    path = tmp_path / "ablate.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["ablate-alpha", "--config", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["alpha"] for r in rows] == [0.0, 0.1, 0.2, 0.3, 0.5]
    for row in rows:
        assert set(row) == {"alpha", "OI", "IC", "OC", "OP", "SAR Avg", "HRBEN Avg"}
        assert 0.0 <= row["SAR Avg"] <= 1.0 and 0.0 <= row["HRBEN Avg"] <= 1.0
        assert (tmp_path / "ablate" / f"alpha_{row['alpha']:g}" / "train" / "export" / "config.json").is_file()
    table = (tmp_path / "ablate" / "ablate_alpha.md").read_text()
    assert "| Multi-Stage | α | OI | IC | OC | OP | SAR Avg | HRBEN Avg |" in table
    assert table.count("| ✓ |") == 5
    assert (tmp_path / "ablate" / "ablate_alpha.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("broken", ["sar_vqa", "optical_vqa", "stage2_config"])
def test_ablate_alpha_checks_its_data_before_training_the_first_alpha(tmp_path, capsys, broken):
    stage1 = tmp_path / "s1" / "export"
    stage1.mkdir(parents=True)
    (stage1 / "config.json").write_text("{}")
    config = {
        "stage1": str(stage1),
        "stage2_config": str(REPO / "configs/tiny/stage2.yaml"),
        "sar_vqa": str(write_sarlang(tmp_path / "sar")),
        "optical_vqa": str(write_rsvqa(tmp_path / "hr", "hr")),
        "out": str(tmp_path / "ablate"),
    }
    config[broken] = str(tmp_path / "missing")
    path = tmp_path / "ablate.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["ablate-alpha", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{broken}: " in err
    assert not (tmp_path / "ablate").exists()  # nothing trained, nothing written
