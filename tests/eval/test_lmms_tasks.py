"""GeoPilot's lmms-eval tasks without lmms-eval: the same predictions score identically through `geopilot eval` and
the tasks' hooks (`geopilot.eval.lmms_docs`, what `lmms_tasks/utils.py` calls), every task's YAML names hooks that
exist, and a task's data folder is refused in one line naming its variable."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
from helpers.bench_fixtures import TASK_FOLDERS

from geopilot.cli import main
from geopilot.eval import lmms_docs
from geopilot.eval.benchmark_tasks import TASKS
from geopilot.eval.lmms_tasks_cli import tasks_folder
from geopilot.eval.loaders.common import BenchmarkError


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    root = tmp_path_factory.mktemp("lmms")
    return {task: TASK_FOLDERS[benchmark](root) for task, benchmark in lmms_docs.BENCHMARKS.items()}


def _box_text(item) -> str:
    """The first truth polygon's bounding box, written as GeoChat writes a box (0-100 grid, no rotation)."""
    xs, ys = zip(*item.reference[0], strict=True)
    w, h = item.meta["width"], item.meta["height"]
    x1, y1, x2, y2 = (round(100 * v) for v in (min(xs) / w, min(ys) / h, max(xs) / w, max(ys) / h))
    return f"{{<{x1}><{y1}><{x2}><{y2}>|<0>}}"


def _answers(loaded, task: str) -> dict[str, str]:
    """Some right, some wrong: the reference for every other item, a fixed wrong text for the rest."""
    answers = {}
    for n, item in enumerate(loaded.items):
        if task == "geopilot_referring":
            answers[item.id] = _box_text(item) if n % 2 else "no box"
        elif task == "geopilot_captions":
            answers[item.id] = item.reference[0] if n % 2 else "a dark scene"
        else:
            answers[item.id] = item.reference if n % 2 else "wrong"
    return answers


@pytest.mark.parametrize("task", list(lmms_docs.BENCHMARKS))
@pytest.mark.parametrize("reply_kind", ["geopilot_record", "plain"])
def test_the_same_predictions_score_identically_through_geopilot_eval_and_lmms(task, reply_kind, roots, monkeypatch):
    monkeypatch.setenv(lmms_docs.data_variable(task), str(roots[task]))
    bench = TASKS[lmms_docs.BENCHMARKS[task]]
    loaded = bench.load(roots[task])
    answers = _answers(loaded, task)
    records = {
        i: {"id": i, "answer": a, "outcome": "direct", "error": None, "tool_calls": []} for i, a in answers.items()
    }
    expected = bench.score(loaded, records, {})  # what `geopilot eval <task>` writes to metrics.json

    docs = lmms_docs.docs(task)
    assert [d["id"] for d in docs] == [item.id for item in loaded.items]
    values = {}
    for doc in docs:
        record = records[doc["id"]]
        reply = json.dumps({lmms_docs.RECORD_KEY: record}) if reply_kind == "geopilot_record" else record["answer"]
        for name, value in lmms_docs.process_results(doc, [reply]).items():
            values.setdefault(name, []).append(value)
    assert set(values) == set(lmms_docs.TASK_METRICS[task])
    for name, per_doc in values.items():
        assert lmms_docs.metric(name, per_doc) == expected[name]
    assert 0 < expected[lmms_docs.TASK_METRICS[task][0]] < 1  # a test that can fail: neither all right nor all wrong


class HalfRightAgent:
    """Plans the expected tools (params from each case's checks) for every other case, nothing for the rest."""

    name = "half"
    prompt_hash = "0"
    config = {"agent": "half"}

    def __init__(self):
        self.count = 0

    @staticmethod
    def param(check):
        return check.value[0] if check.field == "expression" else [check.value[0]]

    def run(self, case, image, seed):
        from geopilot.eval.scorer import AgentRun, CallRecord

        self.count += 1
        if self.count % 2:
            return AgentRun(dialect="text", answer="no tools needed")
        calls = [
            CallRecord(tool=tool, params={c.field: self.param(c) for c in case.param_checks if c.tool == tool})
            for tool in case.expected_tools
        ]
        return AgentRun(dialect="geopilot_json", calls=calls, rounds=1 if calls else 0, answer="done")


def test_planning_runs_score_identically_through_geopilot_eval_planning_and_lmms(tmp_path):
    from geopilot.eval.cases import load_cases
    from geopilot.eval.planning_set import PLANNING_FILE
    from geopilot.eval.runner import read_rows, run_benchmark

    case_set = load_cases(PLANNING_FILE)
    summary = run_benchmark(HalfRightAgent(), case_set, [lmms_docs.PLANNING_SEED], tmp_path, "fixture", "half")
    runs = {row["case_id"]: row["run"] for row in read_rows(tmp_path / "results.jsonl")}
    values = {}
    for doc in lmms_docs.docs(lmms_docs.PLANNING):
        reply = json.dumps({lmms_docs.RECORD_KEY: {"run": runs[doc["id"]]}})
        for name, value in lmms_docs.process_results(doc, [reply]).items():
            values.setdefault(name, []).append(value)
    for name in lmms_docs.PLANNING_METRICS:
        assert lmms_docs.metric(name, values[name]) == summary[name] is not None
    assert 0 < summary["TSA"] < 1 and 0 < summary["OPA"] < 1


def test_a_plain_planning_reply_is_scored_through_the_planning_fixture():
    docs = {d["id"]: d for d in lmms_docs.docs(lmms_docs.PLANNING)}
    doc = docs["object_detection/easy/002"]  # helicopters
    good = '{"reasoning":"","actions":[{"tool":"detect_objects","params":{"categories":["helicopter"]}}],"value":""}'
    wrong = '{"reasoning":"","actions":[{"tool":"extract_roads","params":{}}],"value":""}'
    scores = {
        reply: {name: lmms_docs.metric(name, [v]) for name, v in lmms_docs.process_results(doc, [reply]).items()}
        for reply in (good, wrong, "there are two helicopters")
    }
    assert scores[good] == {"TSA": 1.0, "PA": 1.0, "NTA": None, "OPA": 1.0}
    assert scores[wrong]["TSA"] == 0.0 and scores["there are two helicopters"]["OPA"] == 0.0


def test_unset_or_missing_data_folder_is_one_line_naming_the_variable(monkeypatch, tmp_path):
    monkeypatch.delenv("GEOPILOT_RSVQA_LR_DATA", raising=False)
    with pytest.raises(BenchmarkError, match=r"^geopilot_rsvqa_lr: set GEOPILOT_RSVQA_LR_DATA to .*$") as err:
        lmms_docs.docs("geopilot_rsvqa_lr")
    assert "\n" not in str(err.value)
    monkeypatch.setenv("GEOPILOT_SAR_VQA_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(BenchmarkError, match="GEOPILOT_SAR_VQA_DATA=.*nowhere.* does not exist"):
        lmms_docs.docs("geopilot_sar_vqa")
    monkeypatch.setenv("GEOPILOT_REFERRING_DATA", str(tmp_path))  # a folder, but not the benchmark's
    with pytest.raises(BenchmarkError):
        lmms_docs.docs("geopilot_referring")


def test_lmms_tasks_prints_the_shipped_folder_and_every_yaml_names_real_hooks(capsys):
    assert main(["eval", "lmms-tasks"]) == 0
    folder = capsys.readouterr().out.strip()
    assert folder == str(tasks_folder())
    spec = importlib.util.spec_from_file_location("geopilot_lmms_utils", tasks_folder() / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    tasks = {}
    for path in sorted(tasks_folder().glob("geopilot_*.yaml")):
        text = path.read_text()
        for hook in re.findall(r"!function utils\.(\w+)", text):
            assert callable(getattr(utils, hook)), f"{path.name}: utils.{hook}"
        tasks[re.search(r"^task: (\w+)$", text, re.M).group(1)] = re.findall(r'metric: "([^"]+)"', text)
    assert tasks == {
        lmms_docs.PLANNING: list(lmms_docs.PLANNING_METRICS),
        **{task: list(names) for task, names in lmms_docs.TASK_METRICS.items()},
    }
