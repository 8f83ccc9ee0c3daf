"""Many machines (issue 31 item 5): 3 shards of a 60-job template-backend run, one killed halfway and resumed,
merged, equal the single-process run byte for byte; merging what is not one run's shards is refused."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from geopilot.cli import main as cli_main
from geopilot.data_gen.generate import generate_dataset
from geopilot.data_gen.generate_config import GenerateConfig
from geopilot.data_gen.merge import MergeError, merge_shards
from geopilot.data_gen.shards import RunLock, Shard, parse_shard
from geopilot.data_gen.synthetic.datasets import write_synthetic
from geopilot.errors import ConfigError, GeoPilotInputError

JOURNAL_COUNTERS = ("journal_torn_lines_repaired", "journal_corrupt_lines_skipped")


@pytest.fixture(scope="module")
def run_config(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("synth")
    write_synthetic(root, seed=2)
    config = {
        "sources": [{"reader": "dota", "root": str(root / "DOTA")}],
        "abilities": ["panoptic_detection", "object_detection"],
        "samples_per_record": 5,
        "shard_size": 16,  # several output files, each mixing jobs of every shard
        "backend": {"kind": "template", "concurrency": 2},
    }
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, config


def files(folder: Path) -> dict[str, bytes]:
    names = [p for p in folder.glob("shard-*.jsonl")] + list((folder / "provenance").glob("shard-*.jsonl"))
    names += [folder / "manifest.json", folder / "plan.json"]
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(names)}


def killed_halfway(config_path: Path, out: Path, shard: str) -> int:
    """Run one shard in a subprocess that SIGKILLs itself once half of its jobs are journalled; its journal lines."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from geopilot.config import load_config
        from geopilot.data_gen.generate import generate_dataset
        from geopilot.data_gen.generate_config import GenerateConfig
        from geopilot.data_gen.shards import parse_shard
        from geopilot.data_gen.templates import TemplateClient
        TemplateClient.concurrency = 1  # one job in flight: the kill lands with half the journal written
        def progress(done, total):
            if done >= total // 2:
                os.kill(os.getpid(), signal.SIGKILL)
        generate_dataset(load_config(GenerateConfig, {str(config_path)!r}), {str(out)!r}, progress=progress,
                         shard=parse_shard({shard!r}))
        """
    )
    process = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert process.returncode == -9, process.stderr.decode()[-2000:]
    return sum(p.read_bytes().count(b"\n") for p in (out / "journal").glob("shard-*.jsonl"))


def test_three_shards_one_killed_and_resumed_merge_to_the_single_process_run(run_config, tmp_path, capsys):
    config_path, config = run_config
    single = generate_dataset(GenerateConfig.model_validate(config), tmp_path / "single")
    assert single.report["jobs"] == 60 and single.manifest["complete"]
    shards = [tmp_path / f"part-{i}" for i in range(3)]
    for i in (0, 2):
        assert (
            cli_main(
                ["generate", "--config", str(config_path), "--out", str(shards[i]), "--shard", f"{i}/3", "--quiet"]
            )
            == 0
        )
    done = killed_halfway(config_path, shards[1], "1/3")
    assert 0 < done and not (shards[1] / "manifest.json").exists()
    capsys.readouterr()
    assert (
        cli_main(["generate", "--config", str(config_path), "--out", str(shards[1]), "--shard", "1/3", "--quiet"]) == 0
    )
    assert f"{done} already done" in capsys.readouterr().out  # the shard resumed on its own
    sizes = [json.loads((s / "manifest.json").read_text())["jobs"] for s in shards]
    assert sum(sizes) == 60 and all(8 <= n <= 32 for n in sizes)  # a hash split, roughly even
    assert done < sizes[1]  # it was killed halfway
    assert cli_main(["generate", "merge", *map(str, shards), "--out", str(tmp_path / "merged")]) == 0
    assert "merged from 3 shards" in capsys.readouterr().out
    merged = tmp_path / "merged"
    assert len(files(merged)) == 10 and files(merged) == files(tmp_path / "single")  # 4 + 4 + manifest + plan
    report = json.loads((merged / "report.json").read_text())
    expected = json.loads((tmp_path / "single/report.json").read_text())
    assert {k: v for k, v in report.items() if k not in JOURNAL_COUNTERS} == {
        k: v for k, v in expected.items() if k not in JOURNAL_COUNTERS
    }
    ids = [json.loads(line)["id"] for p in sorted(merged.glob("shard-*.jsonl")) for line in p.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == single.manifest["samples"]
    again = generate_dataset(GenerateConfig.model_validate(config), merged)  # a complete run: nothing left to do
    assert again.new == 0 and files(merged) == files(tmp_path / "single")


def test_shards_of_different_seeds_missing_or_unfinished_are_refused_with_what_differs(run_config, tmp_path):
    _, config = run_config
    base = GenerateConfig.model_validate(config)
    generate_dataset(base, tmp_path / "a0", shard=Shard(0, 2))
    generate_dataset(base.model_copy(update={"seed": 7}), tmp_path / "b1", shard=Shard(1, 2))
    with pytest.raises(MergeError, match=r"different configs \(seed: 0 vs 7\)"):
        merge_shards([tmp_path / "a0", tmp_path / "b1"], tmp_path / "m1")
    with pytest.raises(MergeError, match=r"shards of 2: missing \[1\]"):
        merge_shards([tmp_path / "a0"], tmp_path / "m2")
    with pytest.raises(MergeError, match=r"given twice \[0\]"):
        merge_shards([tmp_path / "a0", tmp_path / "a0"], tmp_path / "m3")
    generate_dataset(base, tmp_path / "c1", shard=Shard(1, 2))
    manifest = json.loads((tmp_path / "c1/manifest.json").read_text())
    (tmp_path / "c1/manifest.json").write_text(json.dumps({**manifest, "complete": False, "pending": 3}))
    with pytest.raises(MergeError, match="not finished: 3 jobs pending"):
        merge_shards([tmp_path / "a0", tmp_path / "c1"], tmp_path / "m4")
    run = json.loads((tmp_path / "c1/run.json").read_text())
    run["settings"]["code_version"] = "0.0.9+abcdef"
    (tmp_path / "c1/run.json").write_text(json.dumps(run))
    with pytest.raises(MergeError, match=r"different code versions \(.* vs 0.0.9\+abcdef\)"):
        merge_shards([tmp_path / "a0", tmp_path / "c1"], tmp_path / "m5")
    with pytest.raises(ConfigError, match="code_version: 0.0.9"):  # nor is that shard resumed by other code
        generate_dataset(base, tmp_path / "c1", shard=Shard(1, 2))
    with pytest.raises(ConfigError, match="shard: 0/2 -> 1/2"):
        generate_dataset(base, tmp_path / "a0", shard=Shard(1, 2))


@pytest.mark.parametrize("text", ["3/3", "-1/3", "0/0", "1", "a/b", "1/2/3"])
def test_a_shard_outside_0_to_n_minus_1_is_exit_2(run_config, tmp_path, text, capsys):
    config_path, _ = run_config
    assert cli_main(["generate", "--config", str(config_path), "--out", str(tmp_path / "o"), f"--shard={text}"]) == 2
    assert "--shard" in capsys.readouterr().err and not (tmp_path / "o").exists()
    assert parse_shard("2/3") == Shard(2, 3)


def test_two_writers_of_one_shard_are_refused(run_config, tmp_path):
    _, config = run_config
    out = tmp_path / "part"
    out.mkdir()
    with RunLock(out), pytest.raises(GeoPilotInputError, match=r"is being written by .*\"pid\""):
        generate_dataset(GenerateConfig.model_validate(config), out, shard=Shard(0, 2))
    assert not (out / "journal").exists()  # refused before a line was written
    generate_dataset(GenerateConfig.model_validate(config), out, shard=Shard(0, 2))  # free again once released
