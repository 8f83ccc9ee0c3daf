"""`python -m lmms_eval --model geopilot --tasks geopilot_planning --include_path "$(geopilot eval lmms-tasks)"` on the
tiny model: TSA/PA/NTA/OPA in the results file, equal to `geopilot eval planning` on the same cases; a folder that is
not a GeoPilot export and an unset data variable refused. lmms-eval lives in its own environment (it pins wandb 0.25):
GEOPILOT_LMMS_PYTHON names its python (.ci/run builds it), else this python if it has lmms_eval."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from geopilot.cli import main
from geopilot.eval.lmms_tasks_cli import tasks_folder
from geopilot.eval.planning_set import PLANNING_FILE

pytestmark = pytest.mark.slow
METRICS = ("TSA", "PA", "NTA", "OPA")


def lmms_python() -> str:
    python = os.environ.get("GEOPILOT_LMMS_PYTHON")
    if python:
        return python
    if importlib.util.find_spec("lmms_eval") is None:
        pytest.skip("lmms-eval is not installed here and GEOPILOT_LMMS_PYTHON is unset (pip install -e '.[lmms]')")
    return sys.executable


def lmms_eval(out: Path, model_args: str, task: str, limit: int, env: dict) -> subprocess.CompletedProcess:
    command = [lmms_python(), "-m", "lmms_eval", "--model", "geopilot", "--model_args", model_args]
    command += ["--tasks", task, "--include_path", str(tasks_folder()), "--limit", str(limit)]
    command += ["--gen_kwargs", "max_new_tokens=32", "--output_path", str(out)]  # a plan's grammar needs >= 19
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **env}
    return subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)


def results_of(out: Path) -> dict:
    """`OUT/<model>/<timestamp>_results.json`'s results (lmms-eval exits 0 even when the evaluation failed)."""
    files = sorted(out.rglob("*_results.json"))
    return json.loads(files[-1].read_text())["results"] if files else {}


def mixed_cases(path: Path, per_category: int = 1) -> Path:
    """The first case of each planning category (tool and no-tool cases), images resolved from the shipped set."""
    seen, lines = set(), []
    for line in PLANNING_FILE.read_text().splitlines():
        case = json.loads(line)
        if case["category"] not in seen:
            seen.add(case["category"])
            case["image"] = str(PLANNING_FILE.parent / case["image"]) if case["image"] else None
            lines.append(json.dumps(case))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_lmms_eval_runs_geopilot_planning_on_the_tiny_model_equal_to_geopilot_eval(tiny_model_dir, tmp_path):
    cases = mixed_cases(tmp_path / "cases.jsonl")
    n = len(cases.read_text().splitlines())
    args = f"pretrained={tiny_model_dir},device=cpu"
    done = lmms_eval(tmp_path / "lmms", args, "geopilot_planning", n, {"GEOPILOT_PLANNING_DATA": str(cases)})
    results = results_of(tmp_path / "lmms").get("geopilot_planning")
    assert results is not None, done.stderr[-3000:]
    argv = ["eval", "planning", "--agent", "geopilot", "--model", str(tiny_model_dir), "--cases", str(cases)]
    argv += ["--seeds", "42", "--max-new-tokens", "32", "--device", "cpu", "--out", str(tmp_path / "geopilot")]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "geopilot" / "summary.json").read_text())
    assert {m: results[f"{m},none"] for m in METRICS} == {m: summary[m] for m in METRICS}
    assert results["TSA,none"] is not None and results["NTA,none"] is not None


def test_lmms_eval_refuses_a_folder_that_is_not_a_geopilot_export_and_an_unset_data_variable(tiny_model_dir, tmp_path):
    done = lmms_eval(tmp_path / "a", f"pretrained={tmp_path}", "geopilot_planning", 1, {})
    assert f"pretrained={tmp_path}: not a GeoPilot export" in done.stdout + done.stderr
    assert not results_of(tmp_path / "a")
    env = {"GEOPILOT_RSVQA_LR_DATA": ""}
    done = lmms_eval(tmp_path / "b", f"pretrained={tiny_model_dir},device=cpu", "geopilot_rsvqa_lr", 1, env)
    assert "geopilot_rsvqa_lr: set GEOPILOT_RSVQA_LR_DATA to the benchmark's local folder" in done.stdout + done.stderr
    assert not results_of(tmp_path / "b")
