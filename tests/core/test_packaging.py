"""One distribution, four import paths: the wheel maps tools/, data_gen/, eval/ under geopilot.* (slow: it builds a
wheel and a venv)."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
IMPORT_PATHS = ["geopilot", "geopilot.tools", "geopilot.data_gen", "geopilot.eval"]


@pytest.mark.slow
def test_wheel_has_all_four_import_paths_and_imports_in_a_fresh_venv(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(REPO),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("geopilot-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for package in IMPORT_PATHS:
        assert package.replace(".", "/") + "/__init__.py" in names, package
    assert {"geopilot/records.py", "geopilot/data_gen/generate.py"} <= set(names) and not any(
        n.startswith(("tools/", "eval/", "data_gen/")) for n in names
    )
    shipped = {"utils.py", "_default.yaml", "placeholder.jsonl", "geopilot_planning.yaml", "geopilot_captions.yaml"}
    assert {f"geopilot/eval/lmms_tasks/{name}" for name in shipped} <= set(names)  # `geopilot eval lmms-tasks`
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    declared = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[lmms_eval.models]\ngeopilot = geopilot.eval.lmms_model:manifest" in declared

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
    )
    # Only the package's own code, no dependencies: importing the four paths must not need torch/transformers.
    code = "import " + ", ".join(IMPORT_PATHS) + "; import geopilot; print(geopilot.__version__)"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0.1.0"
