"""Kill / resume: a `geopilot generate` subprocess killed mid-run, then rerun with the same command, ends with the
same samples as an uninterrupted run: no duplicates, no gaps, a torn journal line repaired."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from geopilot.data_gen.generate import generate_dataset
from geopilot.data_gen.generate_config import GenerateConfig
from geopilot.data_gen.loopback_server import LoopbackLLM
from geopilot.data_gen.synthetic.datasets import write_synthetic
from geopilot.errors import ConfigError

SOURCES = ["DOTA", "SARDet-100K", "SARLANG-1M", "OpenEarthMap"]


def journal_lines(out: Path) -> int:
    return (
        sum(p.read_bytes().count(b"\n") for p in (out / "journal").glob("shard-*.jsonl"))
        if (out / "journal").is_dir()
        else 0
    )


def sources(root: Path) -> list[dict]:
    readers = {"DOTA": "dota", "SARDet-100K": "sardet", "SARLANG-1M": "sarlang", "OpenEarthMap": "openearthmap"}
    return [{"reader": readers[name], "root": str(root / name)} for name in SOURCES]


def all_shards(out: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(out.glob("shard-*.jsonl")))


def test_killed_subprocess_resumes_to_the_same_samples(tmp_path):
    write_synthetic(tmp_path / "synth", seed=3)
    reference = generate_dataset(
        GenerateConfig(sources=sources(tmp_path / "synth"), shard_size=8), tmp_path / "reference"
    )
    total = reference.report["jobs"]
    out = tmp_path / "killed"
    with LoopbackLLM(latency_s=0.05) as server:
        config = {
            "sources": sources(tmp_path / "synth"),
            "shard_size": 8,
            "backend": {"kind": "openai", "url": server.url, "concurrency": 2, "model": "loopback"},
        }
        (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(config))
        command = [
            sys.executable,
            "-m",
            "geopilot.cli",
            "generate",
            "--config",
            str(tmp_path / "cfg.yaml"),
            "--out",
            str(out),
            "--quiet",
        ]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while journal_lines(out) < 10 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        process.kill()  # SIGKILL: no cleanup, no final shards
        process.wait(30)
        done = journal_lines(out)
        assert 10 <= done < total, f"kill landed at {done}/{total} jobs"
        assert not (out / "manifest.json").exists()
        with next((out / "journal").glob("shard-*.jsonl")).open("ab") as handle:
            handle.write(b'{"id": "dota/P00')  # what a kill in the middle of a write leaves
        rerun = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert "already done" in rerun.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    report = json.loads((out / "report.json").read_text())
    assert manifest["complete"] and manifest["samples"] == reference.manifest["samples"]
    assert report["journal_torn_lines_repaired"] == 1
    ids = [json.loads(line)["id"] for p in sorted(out.glob("shard-*.jsonl")) for line in p.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == reference.manifest["samples"]  # no duplicates, no gaps
    assert journal_lines(out) == total  # every job journalled exactly once
    assert all_shards(out) == all_shards(tmp_path / "reference")  # the loopback answers as the templates do


def test_rerun_of_a_finished_run_changes_nothing_and_a_changed_config_is_refused(tmp_path):
    write_synthetic(tmp_path / "synth", seed=1, optical=2, sar=2)
    config = GenerateConfig(sources=sources(tmp_path / "synth"))
    first = generate_dataset(config, tmp_path / "out")
    before = all_shards(tmp_path / "out")
    again = generate_dataset(
        config.model_copy(update={"backend": config.backend.model_copy(update={"concurrency": 3})}), tmp_path / "out"
    )
    assert again.new == 0 and again.resumed == first.report["jobs"] and all_shards(tmp_path / "out") == before
    with pytest.raises(ConfigError, match=r"other settings \(config.seed: 0 -> 5\)"):
        generate_dataset(config.model_copy(update={"seed": 5}), tmp_path / "out")


def test_a_released_run_json_is_resumed_or_refused_naming_what_differs(tmp_path):
    """run.json as released before run folders had one format: {config_hash, shard, config}, no code version."""
    write_synthetic(tmp_path / "synth", seed=1, optical=2, sar=2)
    config = GenerateConfig(sources=sources(tmp_path / "synth"))
    first = generate_dataset(config, tmp_path / "out")
    released = {"config_hash": "0123456789abcdef", "shard": None, "config": config.model_dump(mode="json")}
    (tmp_path / "out" / "run.json").write_text(json.dumps(released))
    with pytest.raises(ConfigError, match=r"other settings \(config.seed: 0 -> 5\)"):
        generate_dataset(config.model_copy(update={"seed": 5}), tmp_path / "out")
    again = generate_dataset(config, tmp_path / "out")
    assert again.new == 0 and again.resumed == first.report["jobs"]
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["fingerprint"] and record["settings"]["config"]["seed"] == 0  # rewritten in the one format
    (tmp_path / "out" / "run.json").write_text(json.dumps({**released, "config": {"sources": "nope"}}))
    with pytest.raises(ConfigError, match="older release without a readable config"):
        generate_dataset(config, tmp_path / "out")
    (tmp_path / "out" / "run.json").unlink()
    with pytest.raises(ConfigError, match="not empty and holds no generate run"):
        generate_dataset(config, tmp_path / "out")
