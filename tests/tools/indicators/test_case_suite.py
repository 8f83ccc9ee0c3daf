"""The indicator case suite through the benchmark harness: the scripted reference agent scores 100 %, and a
loopback OpenAI-compatible agent (real HTTP, OpenAI tool_calls, answers composed from the tool messages it gets
back) scores exactly what its script implies, with the leaderboard, per-case CSV and failure taxonomy written."""

from __future__ import annotations

import collections
import csv
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers.scripted import openai_planning_args

from geopilot.cli import main
from geopilot.eval.cases import load_cases
from geopilot.eval.indicator_suite import write_suite
from geopilot.eval.reference_agent import render


@pytest.fixture(scope="module")
def suite(region, tmp_path_factory):
    path = tmp_path_factory.mktemp("suite") / "indicator_cases.jsonl"
    write_suite(region, path)
    return path


def test_suite_shape(suite, truth):
    cases = load_cases(suite).cases
    assert len(cases) >= 100
    categories = collections.Counter(case.category for case in cases)
    for needed in (
        "tool_selection",
        "comparison",
        "ranking",
        "threshold",
        "cross_indicator",
        "memory",
        "error_handling",
        "refusal",
        "multilingual_es",
        "multilingual_gl",
        "multilingual_eu",
        "multilingual_pt",
    ):
        assert categories[needed] >= 3, needed
    assert all(case.image is None and case.modality is None for case in cases)
    assert sum(bool(case.history) for case in cases) >= 5
    near = [c for c in cases if c.id.startswith("compare-forest") and c.difficulty == "hard"]
    assert len(near) >= 3  # near-equal pairs: 0.1 to 2 points apart, tolerances below half the gap
    for case in near:
        a, b = case.ground_truth
        assert 0.1 <= abs(a.value - b.value) <= 2 and a.tolerance < abs(a.value - b.value) / 2
    share = next(c for c in cases if c.id == "share-00")
    name = share.reference_calls[0].params["area"]
    assert share.ground_truth[0].value == pytest.approx(
        truth["municipality"][name]["land_cover"][share.ground_truth[0].label], abs=1e-4
    )


def test_reference_agent_scores_every_check(region, suite, tmp_path, capsys):
    out = tmp_path / "reference"
    args = [
        "eval",
        "planning",
        "--agent",
        "reference",
        "--catalog",
        str(region / "catalog.yaml"),
        "--cases",
        str(suite),
        "--seeds",
        "42",
        "--out",
        str(out),
        "--json",
    ]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["accuracy"]["mean"] == 1.0, summary["failures"]
    assert summary["OPA"] == 1.0 and summary["infra_errors"] == 0


def _scripted_server(cases):
    """query -> the case; every 9th case the agent answers without its tools (so it must fail those)."""
    by_query = {case.query: (i, case) for i, case in enumerate(cases)}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            messages = body["messages"]
            query = next(m for m in reversed(messages) if m["role"] == "user" and isinstance(m["content"], list))
            index, case = by_query[query["content"][0]["text"]]
            if messages[-1]["role"] == "tool":  # the outputs came back: answer from them
                outputs = [json.loads(m["content"]) for m in messages if m["role"] == "tool"]
                text = " ".join(render(o["data"]) if "data" in o else f"That failed: {o.get('error')}" for o in outputs)
                message = {"content": text}
            elif index % 9 == 4 or not case.reference_calls:
                message = {"content": "I think it is about 50 %."}
            else:
                message = {
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"call_{k}",
                            "type": "function",
                            "function": {"name": c.tool, "arguments": json.dumps(c.params)},
                        }
                        for k, c in enumerate(case.reference_calls)
                    ],
                }
            payload = json.dumps(
                {
                    "choices": [{"message": {"role": "assistant", **message}}],
                    "usage": {"prompt_tokens": 50, "completion_tokens": 10},
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return ThreadingHTTPServer(("127.0.0.1", 0), Handler)


def test_loopback_openai_agent_scores_what_its_script_implies(region, suite, tmp_path, capsys):
    cases = load_cases(suite).cases
    server = _scripted_server(cases)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = tmp_path / "loopback"
        url = f"http://127.0.0.1:{server.server_port}/v1"
        tools = ["--tools-as", "openai", "--catalog", str(region / "catalog.yaml")]
        assert main(openai_planning_args(url, suite, out, "7", *tools, "--json")) == 0
    finally:
        server.shutdown()
    summary = json.loads(capsys.readouterr().out)
    skipped = {case.id for i, case in enumerate(cases) if i % 9 == 4 and case.reference_calls}
    assert summary["accuracy"]["mean"] == pytest.approx(1 - len(skipped) / len(cases))
    assert summary["failures"] == {"missing_tool": len(skipped)}
    with open(out / "cases.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["case_id"] for row in rows if row["passed"] != "1"} == skipped
    assert (out / "leaderboard.md").is_file() and (out / "leaderboard.png").is_file()
    assert main(["eval", "leaderboard", str(out), str(out)]) == 0
