"""`geopilot weights check` under hostile weights folders (issue 37): a checkpoint that is a symlink leaving the
folder (to /etc/passwd), a directory, a FIFO, a sparse file claiming gigabytes, a safetensors header nested 100k
deep: each reported as what it is (never "present"), exit 2, one line on stderr, no traceback, bounded time and
memory (a fresh process, measured), and nothing read whole or hung on."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers.hostile import run_cli

CHECKPOINT = "model.pth"  # DenoDet's need: exactly one *.pth or *.safetensors in <weights>/denodet/


def deep_safetensors(path: Path) -> None:
    header = ('{"a":' * 100_000 + "1" + "}" * 100_000).encode()
    path.with_suffix(".safetensors").write_bytes(len(header).to_bytes(8, "little") + header)


def sparse_safetensors(path: Path) -> None:
    with path.with_suffix(".safetensors").open("wb") as handle:
        handle.write((10**8).to_bytes(8, "little"))  # a 100 MB header claimed; a hole where it should be
        handle.truncate(8 * 2**30)


CASES = {
    "symlink out": (lambda path: os.symlink("/etc/passwd", path), "outside", "links to /etc/passwd"),
    "directory": (Path.mkdir, "not a file", "is a directory"),
    "fifo": (os.mkfifo, "not a file", "is a FIFO"),
    "deep header": (deep_safetensors, "not a safetensors file", "no readable header"),
    "sparse": (sparse_safetensors, "not a safetensors file", "no readable header"),
}


@pytest.mark.parametrize(
    "case", ["symlink out", "directory", "fifo", "deep header", pytest.param("sparse", marks=pytest.mark.slow)]
)
def test_a_checkpoint_that_is_not_a_weights_file_is_said_to_be_what_it_is(tmp_path, case):
    make, status, detail = CASES[case]
    (tmp_path / "weights" / "denodet").mkdir(parents=True)
    make(tmp_path / "weights" / "denodet" / CHECKPOINT)
    run = run_cli(["weights", "check", "--json"], tmp_path, env={"GEOPILOT_WEIGHTS_DIR": str(tmp_path / "weights")})
    run.refused()  # other backends are missing too: one line names the first failure
    (entry,) = [e for e in json.loads(run.stdout) if e["backend"] == "denodet"]
    assert entry["status"] == status and detail in entry["detail"], entry


def test_a_symlink_inside_the_folder_is_still_present(tmp_path):
    folder = tmp_path / "weights" / "denodet"
    folder.mkdir(parents=True)
    (folder / "real.bin").write_bytes(b"PK")  # not a zip end record, but a legacy pickle has no framing to check
    os.symlink(folder / "real.bin", folder / CHECKPOINT)
    run = run_cli(["weights", "check", "--json"], tmp_path, env={"GEOPILOT_WEIGHTS_DIR": str(tmp_path / "weights")})
    (entry,) = [e for e in json.loads(run.stdout) if e["backend"] == "denodet"]
    assert entry["status"] == "present", entry
