"""eval/runner.py: the results folder is one run (run.json); a folder from before run.json is resumed when its rows
carry this config's hash, refused in one line otherwise; other settings are refused naming them."""

from __future__ import annotations

import hashlib
import json

import pytest

from geopilot.errors import GeoPilotInputError
from geopilot.eval.cases import load_cases
from geopilot.eval.planning_set import PLANNING_FILE
from geopilot.eval.results_log import RESULTS
from geopilot.eval.runner import RUN_RECORD, run_benchmark
from geopilot.eval.scorer import AgentRun


class CountingAgent:
    """Answers every case with one sentence and counts the cases it was asked."""

    prompt_hash = "p" * 64

    def __init__(self, temperature: float = 0.0):
        self.config = {"agent": "counting", "temperature": temperature}
        self.asked = 0

    def run(self, case, image, seed) -> AgentRun:
        self.asked += 1
        return AgentRun(dialect="text", answer="No tool was needed.")


@pytest.fixture(scope="module")
def case_set(tmp_path_factory):
    planning = load_cases(PLANNING_FILE)
    path = tmp_path_factory.mktemp("cases") / "cases.jsonl"
    picked = [c.model_copy(update={"image": str(planning.image_path(c))}) for c in planning.cases[:3]]
    path.write_text("".join(c.model_dump_json() + "\n" for c in picked))
    return load_cases(path)


def run(agent, case_set, out):
    return run_benchmark(agent, case_set, [0], out, "annotations", "counting")


def as_released(out) -> None:
    """Turn a folder into one written before run.json: no record, rows carrying the full sha256 of the config."""
    config = json.loads((out / "summary.json").read_text())["config"]
    released = hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    rows = [json.loads(line) for line in (out / RESULTS).read_text().splitlines()]
    (out / RESULTS).write_text("".join(json.dumps({**row, "config_hash": released}) + "\n" for row in rows))
    (out / RUN_RECORD).unlink()


def test_same_settings_resume_and_other_settings_are_refused_by_name(case_set, tmp_path):
    first = CountingAgent()
    summary = run(first, case_set, tmp_path / "out")
    record = json.loads((tmp_path / "out" / RUN_RECORD).read_text())
    assert record["fingerprint"] == summary["config_hash"] and len(summary["config_hash"]) == 16
    again = CountingAgent()
    run(again, case_set, tmp_path / "out")
    assert (first.asked, again.asked) == (3, 0)
    with pytest.raises(GeoPilotInputError, match=r"other settings \(temperature: 0.0 -> 0.7\)"):
        run(CountingAgent(temperature=0.7), case_set, tmp_path / "out")


def test_a_released_folder_is_resumed_when_its_rows_carry_this_config(case_set, tmp_path):
    run(CountingAgent(), case_set, tmp_path / "out")
    as_released(tmp_path / "out")
    again = CountingAgent()
    run(again, case_set, tmp_path / "out")
    assert again.asked == 0 and (tmp_path / "out" / RUN_RECORD).is_file()  # understood, and now recorded


def test_a_released_folder_of_other_settings_is_refused_naming_them_or_saying_why(case_set, tmp_path):
    run(CountingAgent(), case_set, tmp_path / "out")
    as_released(tmp_path / "out")
    with pytest.raises(GeoPilotInputError, match=r"other settings \(temperature: 0.0 -> 0.7\)"):
        run(CountingAgent(temperature=0.7), case_set, tmp_path / "out")
    (tmp_path / "out" / "summary.json").unlink()  # nothing names its settings any more
    with pytest.raises(GeoPilotInputError, match="written before run folders recorded their settings"):
        run(CountingAgent(temperature=0.7), case_set, tmp_path / "out")
    assert not (tmp_path / "out" / RUN_RECORD).exists()


def test_a_folder_holding_something_else_is_refused(case_set, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(GeoPilotInputError, match="not empty and holds no benchmark run"):
        run(CountingAgent(), case_set, tmp_path)
