"""`geopilot eval planning` on the change question set change_v1: the reference agent picks every tool right and
states every number (detect_changes answering from the pairs' labels), the agents under test are given both images
in order and their detect_changes calls run on the pair, and the captioning answers get caption metrics."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.scripted import Scripts

from geopilot.cli import main
from geopilot.eval.agents import OpenAIAgent, Reply
from geopilot.eval.cases import load_cases
from geopilot.eval.change_set import CHANGE_FILE, references_path
from geopilot.eval.scorer import score
from geopilot.eval.toolkit import annotation_layer, suite_annotations


def read_results(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def first_of_each_category(tmp_path: Path) -> Path:
    """change_v1's first case of each category in a folder of its own, with the pairs, annotations and captions."""
    cases = [json.loads(line) for line in CHANGE_FILE.read_text().splitlines()]
    picked = [case for case in cases if case["id"].endswith("/000")]
    out = tmp_path / "change_subset.jsonl"
    out.write_text("".join(json.dumps(case) + "\n" for case in picked))
    (tmp_path / "change_images").symlink_to(CHANGE_FILE.parent / "change_images")
    (tmp_path / "change_subset.annotations.json").write_bytes(suite_annotations(CHANGE_FILE).read_bytes())
    ids = {case["id"] for case in picked}
    references = [
        line for line in references_path(CHANGE_FILE).read_text().splitlines() if json.loads(line)["id"] in ids
    ]
    references_path(out).write_text("".join(line + "\n" for line in references))
    return out


def test_the_reference_agent_scores_every_change_case(tmp_path, capsys):
    out = tmp_path / "reference"
    args = ["eval", "planning", "--agent", "reference", "--cases", str(CHANGE_FILE), "--seeds", "42"]
    assert main(args + ["--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "TSA 100.0%  PA 100.0%  NTA 100.0%  OPA 100.0%  all checks 100.0%  (95 cases x 1 seeds" in printed
    cases = {case.id: case for case in load_cases(CHANGE_FILE).cases}
    rows = read_results(out)
    assert len(rows) == 95 and all(row["score"]["passed"] for row in rows)
    for row in rows:
        case = cases[row["case_id"]]
        calls = row["run"]["calls"]
        assert [(c["tool"], c["ok"]) for c in calls] == [(tool, True) for tool in case.expected_tools]
        numbers = [c for c in row["score"]["checks"] if c["name"].startswith("number:")]
        assert len(numbers) == len(case.ground_truth) and all(c["passed"] for c in numbers)
    area = next(row for row in rows if row["category"] == "change_area")
    truth = cases[area["case_id"]].ground_truth[0].value
    assert f"({truth:.2f} %)" in area["run"]["answer"]  # the label's changed share, stated in percent
    summary = json.loads((out / "summary.json").read_text())
    captions = summary["captions"]["42"]
    assert captions["total"] == 20 and captions["missing"] == 0 and {"BLEU-4", "ROUGE-L", "CIDEr"} <= set(captions)
    assert "captions (seed 42, 20 cases): BLEU-4" in printed


def test_the_tiny_geopilot_model_runs_the_change_cases(tmp_path, tiny_model_dir):
    cases_file = first_of_each_category(tmp_path)
    out = tmp_path / "geopilot"
    args = ["eval", "planning", "--agent", "geopilot", "--model", str(tiny_model_dir), "--cases", str(cases_file)]
    assert main(args + ["--seeds", "42", "--out", str(out), "--max-new-tokens", "24", "--device", "cpu"]) == 0
    rows = read_results(out)
    assert len(rows) == 4 and all(r["run"]["infra_error"] is None and r["run"]["tokens_out"] > 0 for r in rows)
    assert all(c["error_kind"] != "missing_image" for r in rows for c in r["run"]["calls"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["tool_layer"] == "annotations:change_subset.annotations.json"  # the pairs' labels
    assert summary["captions"]["42"]["total"] == 1


def test_the_geopilot_agent_sends_both_images_and_detect_changes_reads_them(tiny_model_dir, tiny_tokenizer):
    from geopilot.agent import GeoPilot
    from geopilot.eval.agents import GeoPilotAgent

    change = load_cases(CHANGE_FILE)
    case = next(c for c in change.cases if c.category == "change_counting")
    truth = case.ground_truth[0].value
    plan = json.dumps({"reasoning": "r", "actions": [{"tool": "detect_changes", "params": {"classes": ["house"]}}]})
    answer = json.dumps({"reasoning": "r", "actions": [], "value": f"{truth:g} buildings changed."})
    registry, _ = annotation_layer(suite_annotations(CHANGE_FILE))
    scripts = Scripts(tiny_tokenizer, [plan, answer])
    pilot = GeoPilot.from_pretrained(tiny_model_dir, tools=registry, device="cpu", session_factory=scripts)
    agent = GeoPilotAgent(str(tiny_model_dir), registry, {"max_new_tokens": 32}, pilot=pilot)
    run = agent.run(case, change.image_paths(case), seed=42)
    assert scripts.image_counts == [2]  # before and after, one pixel row each
    assert [(c.tool, c.ok) for c in run.calls] == [("detect_changes", True)] and score(case, run).passed
    pilot = GeoPilot.from_pretrained(
        tiny_model_dir, tools=registry, device="cpu", session_factory=Scripts(tiny_tokenizer, [plan, answer])
    )
    alone = GeoPilotAgent(str(tiny_model_dir), registry, {"max_new_tokens": 32}, pilot=pilot)
    one = alone.run(case, change.image_paths(case)[:1], seed=42)
    assert [c.error_kind for c in one.calls] == ["missing_image"] and not score(case, one).passed


class AnsweringEndpoint(OpenAIAgent):
    """The OpenAI-compatible agent with its endpoint replaced by a fixed plan, then a fixed answer."""

    def __init__(self, registry, replies: list[str]):
        super().__init__("http://127.0.0.1:9/v1", "scripted", registry)
        self.replies, self.requests = list(replies), []

    def _ask(self, messages: list[dict], seed: int) -> Reply:
        self.requests.append(json.loads(json.dumps(messages)))
        return Reply(self.replies.pop(0), None, 10, 10)


def test_the_openai_agent_sends_one_image_part_per_image_in_order():
    change = load_cases(CHANGE_FILE)
    case = next(c for c in change.cases if c.category == "change_area")
    registry, _ = annotation_layer(suite_annotations(CHANGE_FILE))
    plan = json.dumps({"reasoning": "r", "actions": [{"tool": "detect_changes", "params": {}}], "value": None})
    truth = case.ground_truth[0].value
    agent = AnsweringEndpoint(registry, [plan, f"About {truth:.2f} % of the tile changed."])
    run = agent.run(case, change.image_paths(case), seed=1)
    user = next(m for m in agent.requests[0] if m["role"] == "user")["content"]
    images = [part["image_url"]["url"] for part in user if part["type"] == "image_url"]
    paths = change.image_paths(case)
    assert len(images) == 2 and images[0] != images[1] and user[0]["type"] == "text"
    assert [c.tool for c in run.calls] == ["detect_changes"] and run.calls[0].ok and score(case, run).passed
    swapped = AnsweringEndpoint(registry, [plan, "done"]).run(case, paths[::-1], seed=1)
    assert not swapped.calls[0].ok  # the after image has no record as image 1: the order reaches the tool
