"""benchmarks/gpu_check.py: its refusals, its FLOP count, and (slow) the whole dry run, so the script never rots."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gpu_check
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA refusal")
def test_without_cuda_it_says_so_and_exits_2(capsys):
    assert gpu_check.main(["--out", "unused.json"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_unknown_sections_are_refused(capsys):
    assert gpu_check.main(["--dry-run", "--only", "training,warp_drive"]) == 2
    assert "warp_drive" in capsys.readouterr().err


def test_flops_per_token_of_the_7b_shapes():
    from transformers import LlamaConfig, LlavaConfig

    from geopilot.model import vit_l14_336_config

    text = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, vocab_size=32064)
    config = LlavaConfig(vision_config=vit_l14_336_config(), text_config=text)
    flops = gpu_check.flops_per_token(config, trainable_vision=False, seq_len=0)
    # 6 N for Vicuna-7B's 32 layers + lm_head: N = 32 (4 d^2 + 3 d m) + d V = 6.607e9 (the embedding is a lookup)
    assert flops["language_model"] == pytest.approx(6 * 6.607e9, rel=1e-3)


@pytest.mark.slow
def test_the_dry_run_runs_every_section(tmp_path):
    out = tmp_path / "gpu_check.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(out.read_text())
    statuses = {name: record["status"] for name, record in report["sections"].items()}
    assert statuses == dict.fromkeys(gpu_check.SECTIONS, "ok"), (statuses, done.stdout[-2000:])
    sections = report["sections"]
    modes = sections["training"]["modes"]  # a dry run has few samples: grouping must beat random padding, not a number
    assert modes["geopilot_length_grouped"]["useful_fraction"] > modes["llava_random_padded"]["useful_fraction"]
    assert sections["inference"]["prefill_token_ratio"] > 1
    assert set(sections["inference"]["chat_batch"]) == {"1", "2"}
    assert sections["serving"]["serving_ratio"] > 0
    assert set(sections["specialists"]["backends"]) >= {"denodet", "sam_road", "spa_gan"}
    assert "training MFU" in done.stdout
