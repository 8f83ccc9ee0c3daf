"""End-to-end planning runs: a loopback OpenAI-compatible server playing a scripted agent in mixed dialects (the
TSA the script implies comes out), kill + resume without duplicate rows, endpoint faults, the tiny GeoPilot model,
the hf agent, and the leaderboard over run folders."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers.scripted import Scripts, openai_planning_args

from geopilot.cli import main
from geopilot.eval.cases import load_cases
from geopilot.eval.planning_set import PLANNING_FILE

DIALECTS = ["geopilot_json", "openai_tool_calls", "hermes", "python_call", "tool_code", "llava_plus"]


def _params(case, tool: str) -> dict:
    params = {}
    for check in case.param_checks:
        if check.tool == tool:
            first = check.value[0]
            params[check.field] = f"the {first} on the left" if check.field == "expression" else [first]
    return params


def _render(dialect: str, calls: list[tuple[str, dict]]) -> dict:
    """A chat-completion `message` that makes `calls` in `dialect`."""
    if dialect == "openai_tool_calls":
        return {
            "content": None,
            "tool_calls": [
                {"id": f"call_{i}", "type": "function", "function": {"name": t, "arguments": json.dumps(p)}}
                for i, (t, p) in enumerate(calls)
            ],
        }
    python = "[" + ", ".join(f"{t}(" + ", ".join(f"{k}={v!r}" for k, v in p.items()) + ")" for t, p in calls) + "]"
    text = {
        "geopilot_json": json.dumps(
            {"reasoning": "A tool is needed.", "actions": [{"tool": t, "params": p} for t, p in calls], "value": None}
        ),
        "hermes": "".join(f"<tool_call>{json.dumps({'name': t, 'arguments': p})}</tool_call>" for t, p in calls),
        "python_call": python,
        "tool_code": f"```tool_code\n{python}\n```",
        "llava_plus": '"thoughts🤔" A tool. "actions🚀" '
        + json.dumps([{"API_name": t, "API_params": p} for t, p in calls])
        + ' "value👉" ',
    }[dialect]
    return {"content": text}


def build_script(cases) -> tuple[dict[str, dict], dict[str, dict]]:
    """query -> the first reply; and case id -> what the script implies (dialect, tsa)."""
    script, implied = {}, {}
    for i, case in enumerate(cases):
        right = i % 5 != 4
        if i % 11 == 7:
            script[case.query] = {"content": '<tool_call>{"name": "detect_all", "arguments": {</tool_call>'}
            implied[case.id] = {"dialect": "unparsable", "tsa": False}
            continue
        if not case.expected_tools:
            if right:
                dialect = "text" if i % 2 else "geopilot_json"
                text = (
                    "Farmland with a river."
                    if i % 2
                    else json.dumps({"reasoning": "r", "actions": [], "value": "Farmland."})
                )
                script[case.query] = {"content": text}
                implied[case.id] = {"dialect": dialect, "tsa": True}
                continue
            calls = [("detect_all", {})]
        elif right:
            calls = [(tool, _params(case, tool)) for tool in case.expected_tools]
        else:
            calls = [("extract_roads" if case.expected_tools == ["detect_all"] else "detect_all", {})]
        dialect = DIALECTS[i % len(DIALECTS)]
        script[case.query] = _render(dialect, calls)
        implied[case.id] = {"dialect": dialect, "tsa": right}
    return script, implied


class _QuietServer(ThreadingHTTPServer):
    """A client that gave up (the SLOW case) makes its late reply fail; that is expected here, not worth a traceback
    on stderr, where it would land in a later test's captured output."""

    def handle_error(self, request, client_address):
        pass


class ScriptedAgent:
    """A loopback OpenAI-compatible /v1/chat/completions playing `script` (query -> first reply message).

    Queries starting with FAIL500 get HTTP 500, SLOW sleeps past the client's timeout, EMPTY an empty reply."""

    def __init__(self, script: dict[str, dict], latency_s: float = 0.0):
        self.script, self.latency_s, self.requests = script, latency_s, 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests += 1
                time.sleep(outer.latency_s)
                messages = body["messages"]
                user = next(m for m in messages if m["role"] == "user")["content"]
                query = next(part["text"] for part in user if part["type"] == "text")
                assert any(part["type"] == "image_url" for part in user)
                if query.startswith("FAIL500"):
                    return self._send(500, {"error": "boom"})
                if query.startswith("SLOW"):
                    time.sleep(1.5)
                if len(messages) > 2:  # tool outputs came back: the final answer
                    message = {"content": "Done, see the tool output."}
                elif query.startswith("EMPTY"):
                    message = {"content": ""}
                else:
                    message = outer.script[query]
                reply = {
                    "choices": [{"message": {"role": "assistant", **message}}],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 10},
                }
                self._send(200, reply)

            def _send(self, status: int, payload: dict):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def subset(tmp_path: Path, per_category: int, every: int = 1) -> tuple[Path, list]:
    """The first `per_category` cases and the first `per_category` optical ones of each category (absolute images)."""
    planning = load_cases(PLANNING_FILE)
    picked, seen = [], {}
    for case in planning.cases:
        key = (case.category, case.modality)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] <= per_category:
            picked.append(case.model_copy(update={"image": str(planning.image_path(case))}))
    picked = picked[::every]
    path = tmp_path / "subset.jsonl"
    path.write_text("".join(c.model_dump_json() + "\n" for c in picked))
    return path, picked


def read_results(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def run_local_agent(tmp_path: Path, agent: str, model_dir: Path, every: int, seed: str, max_new_tokens: str):
    """`geopilot eval planning --agent geopilot|hf` on the tiny model over a case subset: (cases file, cases, out
    folder, result rows), one row per case."""
    cases_file, cases = subset(tmp_path, 1, every=every)
    out = tmp_path / agent
    args = [
        "eval",
        "planning",
        "--agent",
        agent,
        "--model",
        str(model_dir),
        "--cases",
        str(cases_file),
        "--seeds",
        seed,
        "--out",
        str(out),
        "--max-new-tokens",
        max_new_tokens,
        "--device",
        "cpu",
    ]
    assert main(args) == 0
    rows = read_results(out)
    assert len(rows) == len(cases)
    return cases_file, cases, out, rows


def check_run(out: Path, cases, implied: dict, seeds: list[int]) -> dict:
    rows = read_results(out)
    assert sorted((r["case_id"], r["seed"]) for r in rows) == sorted((c.id, s) for c in cases for s in seeds)
    assert len({r["config_hash"] for r in rows}) == 1 and all(r["prompt_hash"] for r in rows)
    for row in rows:
        assert row["run"]["dialect"] == implied[row["case_id"]]["dialect"], row["case_id"]
        assert row["score"]["tsa"] is implied[row["case_id"]]["tsa"], row["case_id"]
    summary = json.loads((out / "summary.json").read_text())
    expected_tsa = sum(v["tsa"] for v in implied.values()) / len(implied)
    assert summary["TSA"] == pytest.approx(expected_tsa) and summary["OPA"] == pytest.approx(expected_tsa)
    assert summary["PA"] == 1.0 and summary["std"]["TSA"] == 0.0 and summary["seeds"] == seeds
    assert summary["ci95"]["TSA"][0] <= expected_tsa <= summary["ci95"]["TSA"][1]
    with (out / "cases.csv").open() as handle:
        table = list(csv.DictReader(handle))
    assert len(table) == len(cases) * len(seeds)
    assert all(row["TSA"] == str(int(implied[row["case_id"]]["tsa"])) for row in table)
    board = (out / "leaderboard.md").read_text()
    assert "| Model | TSA | PA | NTA | OPA |" in board and "| Tool Category | # Samples |" in board
    assert (out / "leaderboard.png").read_bytes()[:4] == b"\x89PNG"
    return summary


def test_scripted_openai_agent_in_mixed_dialects(tmp_path):
    cases_file, cases = subset(tmp_path, 3)
    script, implied = build_script(cases)
    assert len({v["dialect"] for v in implied.values()}) == 8
    with ScriptedAgent(script) as server:
        assert main(openai_planning_args(server.url, cases_file, tmp_path / "run")) == 0
        summary = check_run(tmp_path / "run", cases, implied, [42, 1337])
        requests = server.requests
        assert main(openai_planning_args(server.url, cases_file, tmp_path / "run")) == 0  # all done: nothing re-run
        assert server.requests == requests
    assert summary["dialects"]["openai_tool_calls"] >= 2 and summary["infra_errors"] == 0


def test_killed_halfway_and_resumed_without_duplicates(tmp_path):
    cases_file, cases = subset(tmp_path, 2)
    script, implied = build_script(cases)
    out = tmp_path / "run"
    with ScriptedAgent(script, latency_s=0.05) as server:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        args = [sys.executable, "-m", "geopilot.cli", *openai_planning_args(server.url, cases_file, out)]
        process = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 120
        while time.time() < deadline and process.poll() is None:
            if (out / "results.jsonl").is_file() and len((out / "results.jsonl").read_text().splitlines()) >= 6:
                break
            time.sleep(0.05)
        assert process.poll() is None, process.stderr.read().decode()[-2000:]
        process.send_signal(signal.SIGKILL)
        process.wait()
        done = len(read_results(out))
        assert 6 <= done < 2 * len(cases)
        assert main(openai_planning_args(server.url, cases_file, out)) == 0
    check_run(out, cases, implied, [42, 1337])


def test_endpoint_faults_are_classified_not_crashes(tmp_path):
    base = {
        "image": str(load_cases(PLANNING_FILE).image_path(load_cases(PLANNING_FILE).cases[0])),
        "modality": "optical",
        "category": "object_detection",
        "difficulty": "easy",
        "expected_tools": ["detect_objects"],
        "max_rounds": 1,
    }
    queries = {
        "FAIL500 count planes": None,
        "SLOW count planes": None,
        "EMPTY count planes": None,
        "UNKNOWN count planes": {
            "content": json.dumps(
                {"reasoning": "r", "value": None, "actions": [{"tool": "detect_planes", "params": {}}]}
            )
        },
        "BADPARAMS count planes": {"content": "detect_objects(categories=[], colour='red')"},
    }
    path = tmp_path / "faults.jsonl"
    path.write_text("".join(json.dumps({"id": q.split()[0], "query": q, **base}) + "\n" for q in queries))
    with ScriptedAgent({q: m for q, m in queries.items() if m}) as server:
        code = main(openai_planning_args(server.url, path, tmp_path / "run", "7", "--request-timeout", "0.5"))
    assert code == 0
    rows = {r["case_id"]: r for r in read_results(tmp_path / "run")}
    assert rows["FAIL500"]["score"]["category"] == "infra_error" and "HTTP 500" in rows["FAIL500"]["run"]["infra_error"]
    assert "timed out" in rows["SLOW"]["run"]["infra_error"]
    assert rows["EMPTY"]["score"]["category"] == "unparsable" and rows["EMPTY"]["run"]["dialect"] == "empty"
    assert rows["UNKNOWN"]["score"]["category"] == "unknown_tool"
    assert rows["BADPARAMS"]["score"]["category"] == "invalid_params" and rows["BADPARAMS"]["score"]["tsa"] is True
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["infra_errors"] == 2 and summary["n_rows"] == 5
    assert summary["TSA"] == pytest.approx(1 / 3) and summary["PA"] == 0.0  # over the 3 non-infra rows


def test_bad_cli_input_exits_2(tmp_path, capsys):
    cases_file, _ = subset(tmp_path, 1)
    assert main(openai_planning_args("localhost:1", cases_file, tmp_path / "r")) == 2
    assert main(openai_planning_args("http://127.0.0.1:9/v1", cases_file, tmp_path / "r", "4,x")) == 2
    assert (
        main(
            openai_planning_args(
                "http://127.0.0.1:9/v1", cases_file, tmp_path / "r", "1", "--api-key-env", "NOPE_UNSET_VAR"
            )
        )
        == 2
    )
    assert (
        main(["eval", "planning", "--agent", "geopilot", "--model", str(tmp_path / "none"), "--out", str(tmp_path)])
        == 2
    )
    assert main(["eval", "planning", "--agent", "nope", "--model", "m", "--out", str(tmp_path)]) == 2
    assert main(["eval", "nope"]) == 2
    assert main(["eval", "leaderboard", str(tmp_path / "missing")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(errors) == 7 and all("error" in line for line in errors)
    assert "http://" in errors[0] and "--seeds" in errors[1] and "NOPE_UNSET_VAR" in errors[2]


def test_other_config_in_the_same_folder_is_refused(tmp_path, capsys):
    cases_file, cases = subset(tmp_path, 1)
    script, _ = build_script(cases)
    with ScriptedAgent(script) as server:
        assert main(openai_planning_args(server.url, cases_file, tmp_path / "run", "1")) == 0
        assert main(openai_planning_args(server.url, cases_file, tmp_path / "run", "1", "--temperature", "0.7")) == 2
    assert "other settings (temperature: 0.0 -> 0.7)" in capsys.readouterr().err


def test_tiny_geopilot_model_and_the_leaderboard(tmp_path, tiny_model_dir, capsys):
    cases_file, cases, out, rows = run_local_agent(
        tmp_path, "geopilot", tiny_model_dir, every=3, seed="42", max_new_tokens="32"
    )
    assert all(r["score"]["category"] != "infra_error" for r in rows)
    assert all(r["run"]["dialect"] in ("unparsable", "geopilot_json", "llava_plus") for r in rows)  # recorded per row
    assert all(r["run"]["tokens_out"] > 0 for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) >= {"TSA", "PA", "NTA", "OPA", "std", "ci95", "by_category", "by_difficulty"}
    script, _ = build_script(cases)
    with ScriptedAgent(script) as server:
        assert main(openai_planning_args(server.url, cases_file, tmp_path / "scripted", "42")) == 0
    capsys.readouterr()
    assert main(["eval", "leaderboard", str(out), str(tmp_path / "scripted"), "--out", str(tmp_path / "board")]) == 0
    board = capsys.readouterr().out
    assert board.index("openai:scripted") < board.index("geopilot:tiny")  # sorted by OPA
    assert "Paired differences to openai:scripted" in board and "| Difficulty | # Queries |" in board
    assert (tmp_path / "board" / "leaderboard.png").is_file()


def test_the_geopilot_agent_on_a_qwen2_5_vl_export(tmp_path, qwen_dir):
    """`eval planning --agent geopilot --model DIR` loads a Qwen2.5-VL export by its model_type and scores every case."""
    *_, out, rows = run_local_agent(tmp_path, "geopilot", qwen_dir, every=6, seed="1", max_new_tokens="32")
    assert all(r["score"]["category"] != "infra_error" for r in rows), [r["run"].get("infra_error") for r in rows]
    assert all(r["run"]["tokens_out"] > 0 for r in rows)
    assert json.loads((out / "summary.json").read_text())["OPA"] is not None


def test_hf_agent_on_a_local_vlm_dir(tmp_path, tiny_model_dir):
    *_, rows = run_local_agent(tmp_path, "hf", tiny_model_dir, every=6, seed="1", max_new_tokens="4")
    assert all(r["run"]["infra_error"] is None and r["run"]["tokens_out"] > 0 for r in rows), rows[0]["run"]


@pytest.mark.slow
def test_full_planning_set_scripted_and_tiny_model(tmp_path, tiny_model_dir):
    planning = load_cases(PLANNING_FILE)
    script, implied = build_script(planning.cases)
    with ScriptedAgent(script) as server:
        assert main(openai_planning_args(server.url, None, tmp_path / "scripted", "42,1337,2024")) == 0
    summary = check_run(tmp_path / "scripted", planning.cases, implied, [42, 1337, 2024])
    assert summary["n_cases"] == 500 and summary["by_category"]["object_detection"]["n"] == 80
    args = [
        "eval",
        "planning",
        "--agent",
        "geopilot",
        "--model",
        str(tiny_model_dir),
        "--seeds",
        "42",
        "--out",
        str(tmp_path / "tiny"),
        "--max-new-tokens",
        "24",  # room for the shortest plan the grammar allows
        "--device",
        "cpu",
    ]
    assert main(args) == 0
    assert len(read_results(tmp_path / "tiny")) == 500


def test_geopilot_agent_maps_a_chat_result_to_a_scored_run(tiny_model_dir, tiny_tokenizer):
    from geopilot.agent import GeoPilot
    from geopilot.eval.agents import GeoPilotAgent
    from geopilot.eval.scorer import score
    from geopilot.eval.toolkit import build_tool_layer

    planning = load_cases(PLANNING_FILE)
    case = planning.cases[0]
    plan = json.dumps(
        {
            "reasoning": "r",
            "actions": [{"tool": "detect_objects", "params": _params(case, "detect_objects")}],
            "value": None,
        }
    )
    answer = json.dumps({"reasoning": "r", "actions": [], "value": "None found."})
    registry, _ = build_tool_layer()
    pilot = GeoPilot.from_pretrained(
        tiny_model_dir,
        tools=registry,
        device="cpu",
        session_factory=Scripts(tiny_tokenizer, ["not a plan", plan, answer]),
    )
    agent = GeoPilotAgent(str(tiny_model_dir), registry, {"max_new_tokens": 32}, pilot=pilot)
    run = agent.run(case, planning.image_paths(case), seed=42)
    assert run.dialect == "geopilot_json" and run.answer == "None found." and run.rounds == 1
    assert [(c.tool, c.ok) for c in run.calls] == [("detect_objects", True)]
    assert run.parse_error and run.raw == "not a plan"  # the repaired first turn is kept
    result = score(case, run)
    assert result.passed and result.opa


def test_the_reference_agent_refuses_a_case_set_without_reference_calls(tmp_path, capsys):
    """The shipped planning_v1 carries no reference_calls: replaying nothing must not score as a 20 % agent."""
    from geopilot.cli import main

    assert main(["eval", "planning", "--agent", "reference", "--out", str(tmp_path / "run"), "--seeds", "1"]) == 2
    err = capsys.readouterr().err
    assert "has no `reference_calls`" in err and len(err.strip().splitlines()) == 1
