"""The change set's two-image cases reach the agents with both images, in order: the benchmark runner hands each
agent the case's image paths, and the shared tool layer (`execute`) runs a two-image tool on them (or says which
image is missing)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from geopilot.eval.agents import execute
from geopilot.eval.cases import load_cases
from geopilot.eval.runner import run_benchmark
from geopilot.eval.scorer import AgentRun
from geopilot.eval.tool_calls import Call, ParsedReply
from geopilot.image import load_image
from geopilot.tool_chains import ChatCalls
from geopilot.tool_output import ToolOutput
from geopilot.tool_protocol import ToolRegistry

CHANGE_FILE = Path(__file__).resolve().parents[2] / "eval" / "data" / "change_v1.jsonl"


class PairParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MeanPair:
    """A two-image stand-in for detect_changes: the mean grey of each image it got, in order."""

    name, description, modality, params_model, image_count = "detect_changes", "two dates", "optical", PairParams, 2

    def run(self, image, params, images) -> ToolOutput:
        return ToolOutput(data={"means": [round(float(np.asarray(i.image).mean()), 3) for i in images]})


class RecordingAgent:
    prompt_hash, config = "r" * 64, {"agent": "recording"}

    def __init__(self):
        self.seen: list[list[Path]] = []

    def run(self, case, images, seed) -> AgentRun:
        self.seen.append(list(images))
        return AgentRun(dialect="text", answer="No tool was needed.")


def test_the_runner_hands_each_agent_both_images_in_order(tmp_path):
    case_set = load_cases(CHANGE_FILE)
    picked = [c.model_copy(update={"images": [str(p) for p in case_set.image_paths(c)]}) for c in case_set.cases[:2]]
    small = tmp_path / "cases.jsonl"
    small.write_text("".join(c.model_dump_json() + "\n" for c in picked))
    agent = RecordingAgent()
    run_benchmark(agent, load_cases(small), [0], tmp_path / "out", "annotations", "recording")
    assert agent.seen == [[Path(name) for name in case.images] for case in picked]
    assert all(len(paths) == 2 and paths[0].name.endswith("_A.jpg") for paths in agent.seen)


def test_the_tool_layer_runs_a_two_image_tool_on_the_case_images():
    case_set = load_cases(CHANGE_FILE)
    case = case_set.cases[0]
    images = [load_image(path) for path in case_set.image_paths(case)]
    registry = ToolRegistry([MeanPair()])
    parsed = ParsedReply(dialect="text", calls=[Call(tool="detect_changes", params={})])
    records, results = execute(registry, parsed, images, case, 1, ChatCalls())
    expected = [round(float(np.asarray(i.image).mean()), 3) for i in images]
    assert records[0].ok and results[0].output.data == {"means": expected}
    _, alone = execute(registry, parsed, images[:1], case, 1, ChatCalls())
    assert alone[0].error_kind == "missing_image" and "image 2 is missing" in alone[0].error
