"""`run_benchmark(..., batch_size=N)` and `geopilot eval planning --batch-size N`: GeoPilotAgent.run_batch (one
GeoPilot.chat_batch per chunk of cases sharing seed and max_rounds) scores the same rows as one case at a time, a
batch that crashes falls back to its cases one by one, a killed batched run resumes, and a batched run is a run of
its own (batch_size in run.json) while batch_size 1 keeps every folder's fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.scripted import answer, plan

from geopilot.cli import main
from geopilot.errors import GeoPilotInputError
from geopilot.eval.cases import load_cases
from geopilot.eval.planning_set import PLANNING_FILE
from geopilot.eval.results_log import RESULTS, read_rows
from geopilot.eval.runner import RUN_RECORD, SCORER_VERSION, run_benchmark
from geopilot.eval.scorer import AgentRun
from geopilot.fileio import fingerprint

VARYING = ("latency_s",)  # a row's wall time: a batch's differs from one case's


def planning_subset(tmp_path: Path, count: int, every: int = 2) -> Path:
    """`count` planning cases, one per (category, modality) taken every `every`, images as absolute paths."""
    planning = load_cases(PLANNING_FILE)
    picked, seen = [], set()
    for case in planning.cases:
        if (case.category, case.modality) not in seen:
            seen.add((case.category, case.modality))
            picked.append(case.model_copy(update={"image": str(planning.image_path(case))}))
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(c.model_dump_json() + "\n" for c in picked[::every][:count]))
    return path


def eval_args(model: Path, cases: Path, out: Path, *extra: str) -> list[str]:
    return [
        "eval",
        "planning",
        "--agent",
        "geopilot",
        "--model",
        str(model),
        "--cases",
        str(cases),
        "--seeds",
        "42",
        "--out",
        str(out),
        "--max-new-tokens",
        "32",
        "--device",
        "cpu",
        *extra,
    ]


def scored_rows(out: Path) -> dict[str, dict]:
    """case id -> (run, score) of a results log, the wall times left out."""
    rows = read_rows(out / RESULTS)  # a line torn by a kill is passed over
    assert len({(r["case_id"], r["seed"]) for r in rows}) == len(rows)  # never a duplicate
    return {
        r["case_id"]: {"run": {k: v for k, v in r["run"].items() if k not in VARYING}, "score": r["score"]}
        for r in rows
    }


def test_the_tiny_model_batched_scores_the_same_rows_and_a_killed_batched_run_resumes(tmp_path, tiny, tiny_model_dir):
    from geopilot.agent import GeoPilot
    from geopilot.eval.agents import GeoPilotAgent
    from geopilot.eval.toolkit import build_tool_layer

    cases = planning_subset(tmp_path, 5)
    registry, layer = build_tool_layer()
    agent = GeoPilotAgent("tiny", registry, {"max_new_tokens": 32}, pilot=GeoPilot(*tiny, tools=registry))
    run_benchmark(agent, load_cases(cases), [42], tmp_path / "one", layer, "tiny")  # the same weights, one at a time
    assert main(eval_args(tiny_model_dir, cases, tmp_path / "three", "--batch-size", "3")) == 0  # chunks of 3 and 2
    one, three = scored_rows(tmp_path / "one"), scored_rows(tmp_path / "three")
    assert len(one) == 5 and one == three  # greedy on the tiny model: padding changes no token
    assert all(row["run"]["tokens_out"] > 0 and row["run"]["infra_error"] is None for row in three.values())
    settings = json.loads((tmp_path / "three" / RUN_RECORD).read_text())["settings"]
    assert settings["batch_size"] == 3 and "batch_size" not in json.loads((tmp_path / "one" / RUN_RECORD).read_text())
    # killed after its first row, mid-write of the next: the rerun runs the rest, in batches, and nothing twice
    log = tmp_path / "three" / RESULTS
    lines = log.read_text().splitlines(keepends=True)
    log.write_text(lines[0] + lines[1][:40])
    assert main(eval_args(tiny_model_dir, cases, tmp_path / "three", "--batch-size", "3")) == 0
    assert scored_rows(tmp_path / "three") == one


def test_a_batched_folder_is_never_resumed_unbatched_or_with_another_batch(tmp_path):
    cases = planning_subset(tmp_path, 2)
    agent = BatchingAgent()
    case_set = load_cases(cases)
    run_benchmark(agent, case_set, [1], tmp_path / "run", "fixture", "batching", batch_size=4)
    with pytest.raises(GeoPilotInputError, match=r"other settings \(batch_size: 4 -> \(not set\)\)"):
        run_benchmark(agent, case_set, [1], tmp_path / "run", "fixture", "batching")
    with pytest.raises(GeoPilotInputError, match=r"other settings \(batch_size: 4 -> 2\)"):
        run_benchmark(agent, case_set, [1], tmp_path / "run", "fixture", "batching", batch_size=2)


class BatchingAgent:
    """Answers every case with one sentence; records the chunks `run_batch` was given and the cases `run` was."""

    prompt_hash = "p" * 64
    config = {"agent": "batching", "temperature": 0.0}

    def __init__(self):
        self.batches: list[tuple[int, list[str], int]] = []  # (seed, case ids, max_rounds of each)
        self.single: list[str] = []

    def run(self, case, images, seed) -> AgentRun:
        self.single.append(case.id)
        return AgentRun(dialect="text", answer="No tool was needed.")

    def run_batch(self, cases, images_per_case, seed) -> list[AgentRun]:
        assert len(images_per_case) == len(cases) and all(images for images in images_per_case)
        assert len({case.max_rounds for case in cases}) == 1
        self.batches.append((seed, [case.id for case in cases], cases[0].max_rounds))
        return [AgentRun(dialect="text", answer="No tool was needed.") for _ in cases]


def test_chunks_share_seed_and_max_rounds_and_progress_counts_every_case(tmp_path):
    path = planning_subset(tmp_path, 7, every=1)
    rounds = [1, 2, 1, 2, 2, 1, 3]  # a chain case carries its own max_rounds
    cases = [
        json.loads(line) | {"max_rounds": r} for line, r in zip(path.read_text().splitlines(), rounds, strict=True)
    ]
    path.write_text("".join(json.dumps(case) + "\n" for case in cases))
    case_set, agent, calls = load_cases(path), BatchingAgent(), []
    progress = lambda done, total: calls.append((done, total))  # noqa: E731
    run_benchmark(agent, case_set, [5, 6], tmp_path / "run", "fixture", "batching", None, progress, 2)
    by_id = {case.id: case for case in case_set.cases}
    assert agent.single == [] and all(len(ids) <= 2 for _, ids, _ in agent.batches)
    assert all(by_id[i].max_rounds == r for _, ids, r in agent.batches for i in ids)
    ran = sorted((i, seed) for seed, ids, _ in agent.batches for i in ids)
    assert ran == sorted((case.id, seed) for case in case_set.cases for seed in (5, 6))
    assert [ids for seed, ids, _ in agent.batches if seed == 5][:2] == [
        [c["id"] for c in cases[0:3:2]],
        [cases[5]["id"]],
    ]
    assert calls == [(i, 14) for i in range(1, 15)]  # once per finished case
    rows = [json.loads(line) for line in (tmp_path / "run" / RESULTS).read_text().splitlines()]
    assert len(rows) == 14 and {row["config_hash"] for row in rows} == {
        json.loads((tmp_path / "run" / RUN_RECORD).read_text())["fingerprint"]
    }
    assert all(set(row) == set(rows[0]) and row["score"]["passed"] is not None for row in rows)


def test_batch_size_1_keeps_the_fingerprint_and_agents_without_run_batch_run_one_by_one(tmp_path):
    case_set = load_cases(planning_subset(tmp_path, 3))
    released = fingerprint(
        {
            **BatchingAgent.config,
            "prompt_hash": BatchingAgent.prompt_hash,
            "cases_sha256": case_set.sha256,
            "tool_layer": "fixture",
            "scorer": SCORER_VERSION,
        }
    )  # the config every folder recorded before batch_size existed
    agent = BatchingAgent()
    summary = run_benchmark(agent, case_set, [1], tmp_path / "one", "fixture", "batching", batch_size=1)
    assert summary["config_hash"] == released and agent.batches == [] and len(agent.single) == 3

    class OneAtATime:  # the OpenAI, HF and reference agents: no run_batch
        prompt_hash, config = BatchingAgent.prompt_hash, BatchingAgent.config
        run = BatchingAgent.run

        def __init__(self):
            self.single = []

    plain = OneAtATime()
    summary = run_benchmark(plain, case_set, [1], tmp_path / "plain", "fixture", "batching", batch_size=8)
    assert summary["config_hash"] == released and len(plain.single) == 3
    with pytest.raises(GeoPilotInputError, match="batch_size must be a whole number >= 1, got 0"):
        run_benchmark(agent, case_set, [1], tmp_path / "zero", "fixture", "batching", batch_size=0)


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_batch_size_is_one_line_and_exit_2(tmp_path, capsys, value):
    cases = planning_subset(tmp_path, 1)
    assert main(eval_args(tmp_path / "no-model", cases, tmp_path / "out", "--batch-size", value)) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(errors) == 1 and "--batch-size" in errors[0] and not (tmp_path / "out").exists()


def test_an_unreadable_image_inside_a_batch_is_one_infra_row(tmp_path, tiny):
    from geopilot.agent import GeoPilot
    from geopilot.eval.agents import GeoPilotAgent
    from geopilot.eval.toolkit import build_tool_layer

    path = planning_subset(tmp_path, 3)
    cases = [json.loads(line) for line in path.read_text().splitlines()]
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    cases[1]["image"] = str(tmp_path / "broken.png")
    path.write_text("".join(json.dumps(case) + "\n" for case in cases))
    registry, layer = build_tool_layer()
    agent = GeoPilotAgent("tiny", registry, {"max_new_tokens": 32}, pilot=GeoPilot(*tiny, tools=registry))
    run_benchmark(agent, load_cases(path), [0], tmp_path / "run", layer, "tiny", batch_size=3)
    rows = {row["case_id"]: row for row in map(json.loads, (tmp_path / "run" / RESULTS).read_text().splitlines())}
    assert len(rows) == 3 and rows[cases[1]["id"]]["score"]["category"] == "infra_error"
    assert "broken.png" in rows[cases[1]["id"]]["run"]["infra_error"]
    for ok in (cases[0]["id"], cases[2]["id"]):
        assert rows[ok]["run"]["infra_error"] is None and rows[ok]["run"]["tokens_out"] > 0


def reference_params(case, tool: str) -> dict:
    """Params the case's checks accept: the first value each names (an expression as a phrase)."""
    return {
        c.field: c.value[0] if c.field == "expression" else [c.value[0]] for c in case.param_checks if c.tool == tool
    }


class CaseSession:
    """Stands in for KVSession: a row whose question is a case's plans that case's `calls` (none: answers at
    once), and answers after its tools; so batched rows take different paths through the loop."""

    encode_seconds = 0.0

    def __init__(self, tokenizer, prompts, calls: dict[str, list]):
        self.tokenizer, self.turn = tokenizer, [0] * len(prompts)
        questions = [tokenizer.decode(p) for p in prompts]
        self.queries = [next(query for query in calls if query in question) for question in questions]
        self.calls = [calls[query] for query in self.queries]

    def generate(self, rows, tails=None, stream=None, max_new_tokens=None):
        from geopilot.generation import Turn

        turns = []
        for row in rows:
            first, self.turn[row] = self.turn[row] == 0, self.turn[row] + 1
            text = plan(*self.calls[row]) if first and self.calls[row] else answer(f"About {self.queries[row]!r}.")
            turns.append(Turn(self.tokenizer(text, add_special_tokens=False)["input_ids"], text, True, 5, 0.001))
        return turns


def test_scripted_tool_rounds_map_back_to_their_cases_in_a_batch(tmp_path, tiny):
    """Rows with tools and rows without in one chat_batch: each AgentRun is its own case's, as `run` makes it."""
    from geopilot.agent import GeoPilot
    from geopilot.eval.agents import GeoPilotAgent
    from geopilot.eval.scorer import score
    from geopilot.eval.toolkit import build_tool_layer

    case_set = load_cases(planning_subset(tmp_path, 6))  # tools of five kinds, and a question without one
    calls = {
        case.query: [(tool, reference_params(case, tool)) for tool in case.expected_tools] for case in case_set.cases
    }
    registry, _ = build_tool_layer()
    factory = lambda prompts, pixels, options, **images: CaseSession(tiny[1].tokenizer, prompts, calls)  # noqa: E731
    agent = GeoPilotAgent(
        "tiny", registry, {"max_new_tokens": 64}, pilot=GeoPilot(*tiny, registry, session_factory=factory)
    )
    images = [case_set.image_paths(case) for case in case_set.cases]
    batched = agent.run_batch(case_set.cases, images, seed=3)
    alone = [agent.run(case, paths, seed=3) for case, paths in zip(case_set.cases, images, strict=True)]
    strip = lambda run: run.model_dump(exclude=set(VARYING))  # noqa: E731
    assert [strip(r) for r in batched] == [strip(r) for r in alone]
    assert any(r.calls for r in batched) and any(not r.calls for r in batched)
    for case, run in zip(case_set.cases, batched, strict=True):
        assert [c.tool for c in run.calls] == case.expected_tools and all(c.ok for c in run.calls)
        assert score(case, run).opa, (case.id, run)
