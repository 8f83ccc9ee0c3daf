"""Small real Tool classes (the protocol, not mocks of it), plan/answer texts, and a scripted session that stands
in for the model's turns, so the agent loop can be driven through every path with exact plan texts."""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field

from geopilot.generation import Turn
from geopilot.sample import Action, AssistantMessage
from geopilot.tool_output import Detection, RoadGraph, ToolOutput
from geopilot.wire import assistant_json


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CategoriesParams(_Params):
    categories: list[str] = Field(min_length=1)


class NoParams(_Params):
    pass


class Detector:
    name, description, modality, params_model = (
        "detect_objects",
        "finds objects by category",
        "optical",
        CategoriesParams,
    )

    def run(self, image, params: CategoriesParams) -> ToolOutput:
        return ToolOutput(
            detections=[Detection(label=c, box=(0.1, 0.2, 0.4, 0.5), score=0.9) for c in params.categories]
        )


class RoadExtractor:
    name, description, modality, params_model = "extract_roads", "road graph", "optical", NoParams

    def run(self, image, params) -> ToolOutput:
        return ToolOutput(roads=RoadGraph(nodes=[(0.1, 0.1), (0.5, 0.5), (0.9, 0.1)], edges=[(0, 1), (1, 2)]))


class SarDetector:
    name, description, modality, params_model = "sar_detect_all", "every SAR target", "sar", NoParams

    def run(self, image, params) -> ToolOutput:
        return ToolOutput(detections=[Detection(label="ship", box=(0.5, 0.5, 0.6, 0.7))])


class SlowTool:
    name, description, modality, params_model = "segment_semantic", "takes too long", "optical", NoParams

    def run(self, image, params) -> ToolOutput:
        time.sleep(3)
        return ToolOutput()


class BrokenTool:
    name, description, modality, params_model = "remove_clouds", "always fails", "optical", NoParams

    def run(self, image, params) -> ToolOutput:
        raise RuntimeError("backend exploded")


def plan(*actions: tuple[str, dict], reasoning: str = "I will use a tool.", value: str | None = None) -> str:
    """The wire text of a think turn calling `actions`."""
    return assistant_json(
        AssistantMessage(reasoning=reasoning, actions=[Action(tool=t, params=p) for t, p in actions], value=value)
    )


def answer(value: str, reasoning: str = "From the tool output.") -> str:
    return assistant_json(AssistantMessage(reasoning=reasoning, value=value))


class ScriptedSession:
    """Stands in for KVSession: each row's turns are the given texts, in order; records the tails it was fed."""

    encode_seconds = 0.0

    def __init__(self, tokenizer, prompts: list[list[int]], scripts: list[list[str]]):
        self.tokenizer, self.prompts = tokenizer, prompts
        self.scripts = [list(s) for s in scripts]
        self.fed: list[list[str]] = [[] for _ in scripts]  # decoded user turns each row received after its first turn

    def generate(self, rows, tails=None, stream=None):
        turns = []
        for i, row in enumerate(rows):
            if tails is not None:
                self.fed[row].append(self.tokenizer.decode(tails[i]))
            assert self.scripts[row], f"row {row} asked for more turns than scripted (fed: {self.fed[row]})"
            text = self.scripts[row].pop(0)
            if stream is not None:
                for start in range(0, len(text), 5):
                    stream(text[start : start + 5])
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            new = len(tails[i]) if tails is not None else len(self.prompts[row])
            turns.append(Turn(ids, text, True, new, 0.001))
        return turns


class Scripts:
    """A session factory for GeoPilot(session_factory=...) that keeps the sessions it made, for assertions."""

    def __init__(self, tokenizer, *scripts: list[str]):
        self.tokenizer, self.scripts, self.sessions = tokenizer, scripts, []

    def __call__(self, prompts, pixel_values, options):
        assert pixel_values.shape[0] == len(prompts)
        session = ScriptedSession(self.tokenizer, prompts, list(self.scripts))
        self.sessions.append(session)
        return session

    @property
    def fed(self) -> list[list[str]]:
        return self.sessions[-1].fed
