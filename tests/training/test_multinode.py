"""Several nodes on one machine (issue 26 item 3, slow): two torchrun node ranks (1 process each) against a loopback
rendezvous over gloo. One node is SIGKILLed (worker and agent) after the step-3 checkpoint, the other fails on the
lost peer, the same two commands are started again and resume; the parameters end identical to a 1-node x 2-process
run of the same global batch. A node started with another config is refused at rendezvous, naming the difference."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file
from test_distributed import free_port
from train_helpers import ROOT, TINY

from geopilot.data_gen.synthetic.samples import write_demo_dataset

pytestmark = pytest.mark.slow

STEPS = ["optim.max_steps=5", "optim.epochs=3", "checkpoint.save_steps=3"]
HELPER = str(Path(__file__).with_name("train_helpers.py"))


def train_args(data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--config",
        "configs/tiny/stage1.yaml",
        f"output_dir={out}",
        f"data.files=[{data}]",
        f"data.cache_dir={out.parent / 'cache'}",
        *TINY,
        "optim.global_batch_size=4",  # 2 per device x 2 processes, no accumulation, on either layout
        *STEPS,
        *extra,
    ]


def env(**extra: str) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **extra}


def node(rank: int, port: int, script: list[str], **extra_env: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1"]
    command += ["--node_rank", str(rank), "--master_addr", "127.0.0.1", "--master_port", str(port), *script]
    return subprocess.Popen(
        command, cwd=ROOT, env=env(**extra_env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def two_nodes(scripts: tuple[list[str], list[str]], **extra_env: str) -> list[tuple[int, str]]:
    port = free_port()
    nodes = [node(rank, port, script, **extra_env) for rank, script in enumerate(scripts)]
    try:
        return [(p.wait(timeout=600), p.stdout.read()) for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_two_nodes_survive_a_lost_node_and_match_one_node(tmp_path):
    data = write_demo_dataset(tmp_path / "data", optical=8, sar=2, seed=1)
    one_node = tmp_path / "one_node"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    command += ["--master_addr", "127.0.0.1", "--master_port", str(free_port()), "train.py"]
    done = subprocess.run(
        [*command, *train_args(data, one_node)], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]

    two = tmp_path / "two_nodes"
    args = train_args(data, two)
    killed = two_nodes(([HELPER, "4", "step", *args], [HELPER, "4", "step", *args]), KILL_NODE_OF_RANK="1")
    assert all(code != 0 for code, _ in killed), killed
    assert (two / "checkpoints/latest").read_text().strip() == "step-00000003" and not (two / "export").exists()

    resumed = two_nodes((["train.py", *args], ["train.py", *args]))
    assert all(code == 0 for code, _ in resumed), resumed[0][1][-3000:] + resumed[1][1][-3000:]
    assert "resumed from" in resumed[0][1] and "at step 3 of 5" in resumed[0][1]
    reference, got = load_file(one_node / "export/model.safetensors"), load_file(two / "export/model.safetensors")
    assert reference.keys() == got.keys()
    worst = max((reference[k].double() - got[k].double()).abs().max().item() for k in reference)
    assert worst == 0.0, f"max parameter difference {worst}"
    for rank in (0, 1):
        log = f"logs/samples.rank{rank}.jsonl"
        assert (one_node / log).read_text() == (two / log).read_text()


def test_a_node_with_another_config_is_refused_at_rendezvous(tmp_path):
    data = write_demo_dataset(tmp_path / "data", optical=8, sar=2, seed=1)
    out = tmp_path / "run"
    results = two_nodes((["train.py", *train_args(data, out)], ["train.py", *train_args(data, out, "optim.lr=5e-4")]))
    assert all(code != 0 for code, _ in results)
    text = results[0][1] + results[1][1]
    assert "runs another job than rank 0" in text and "optim.lr: 0.001 vs 0.0005" in text
    assert not (out / "checkpoints").exists()
