"""The shared fakes of every test folder: small real Tool classes (the protocol, not mocks of it: a detector, slow,
hanging and broken tools), plan/answer texts, and scripted sessions that stand in for the model's turns (by row
script, or by what the question says), so the agent loop is driven through every path with exact plan texts."""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from geopilot.cancellation import check_cancelled
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
    """`boxes` fixed boxes per requested category."""

    name, description, modality, params_model = (
        "detect_objects",
        "finds objects by category",
        "optical",
        CategoriesParams,
    )
    BOXES = ((0.1, 0.2, 0.4, 0.5), (0.5, 0.5, 0.7, 0.9))

    def __init__(self, boxes: int = 1):
        self.boxes = self.BOXES[:boxes]

    def run(self, image, params: CategoriesParams) -> ToolOutput:
        return ToolOutput(
            detections=[Detection(label=c, box=b, score=0.9) for c in params.categories for b in self.boxes]
        )


class BoxParams(_Params):
    box: tuple[float, float, float, float] = Field(description="the region to segment, normalised [x1, y1, x2, y2]")


class BoxSegmenter:
    """A box-prompted tool: keeps the params it received, answers with the box it was given."""

    name, description, modality, params_model = "segment_box", "segments the object inside a box", "optical", BoxParams

    def __init__(self):
        self.received: list[tuple[float, ...]] = []

    def run(self, image, params: BoxParams) -> ToolOutput:
        self.received.append(params.box)
        return ToolOutput(detections=[Detection(label="plane", box=params.box, score=0.9)])


class RoadExtractor:
    name, description, modality, params_model = "extract_roads", "road graph", "optical", NoParams

    def run(self, image, params) -> ToolOutput:
        return ToolOutput(roads=RoadGraph(nodes=[(0.1, 0.1), (0.5, 0.5), (0.9, 0.1)], edges=[(0, 1), (1, 2)]))


class SarDetector:
    name, description, modality, params_model = "sar_detect_all", "every SAR target", "sar", NoParams

    def run(self, image, params) -> ToolOutput:
        return ToolOutput(detections=[Detection(label="ship", box=(0.5, 0.5, 0.6, 0.7))])


class SlowTool:
    """Takes `seconds`, with a cancellation point every 10 ms (a registry timeout or the chat deadline ends it)."""

    description, params_model = "takes a while", NoParams

    def __init__(self, seconds: float = 3.0, name: str = "segment_semantic", modality: str | None = "optical"):
        self.seconds, self.name, self.modality = seconds, name, modality

    def run(self, image, params) -> ToolOutput:
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline:
            check_cancelled()
            time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
        return ToolOutput()


class HangingTool:
    """Sleeps `seconds` without a cancellation point: the caller's deadline has to hold on its own."""

    name, description, modality, params_model = "extract_roads", "never returns in time", "optical", NoParams

    def __init__(self, seconds: float = 30.0):
        self.seconds = seconds

    def run(self, image, params) -> ToolOutput:
        time.sleep(self.seconds)
        return ToolOutput()


class BrokenTool:
    description, params_model = "always fails", NoParams

    def __init__(self, name: str = "remove_clouds", modality: str | None = "optical"):
        self.name, self.modality = name, modality

    def run(self, image, params) -> ToolOutput:
        raise RuntimeError("backend exploded")


def plan(*actions: tuple[str, dict] | str, reasoning: str = "I will use a tool.", value: str | None = None) -> str:
    """The wire text of a think turn calling `actions`: (tool, params) pairs, or a tool name (no params)."""
    pairs = [(a, {}) if isinstance(a, str) else a for a in actions]
    return assistant_json(
        AssistantMessage(reasoning=reasoning, actions=[Action(tool=t, params=p) for t, p in pairs], value=value)
    )


def answer(value: str, reasoning: str = "From the tool output.") -> str:
    return assistant_json(AssistantMessage(reasoning=reasoning, value=value))


class CutOff(str):
    """A scripted turn that stopped at max_new_tokens (`Turn.finished` False)."""


class ScriptedSession:
    """Stands in for KVSession: each row's turns are the given texts, in order; records the tails it was fed and the
    `max_new_tokens` of every call (a turn's ids are cut to it, as decoding would stop)."""

    encode_seconds = 0.0

    def __init__(self, tokenizer, prompts: list[list[int]], scripts: list[list[str]]):
        self.tokenizer, self.prompts = tokenizer, prompts
        self.scripts = [list(s) for s in scripts]
        self.fed: list[list[str]] = [[] for _ in scripts]  # decoded user turns each row received after its first turn
        self.limits: list[int | None] = []

    def generate(self, rows, tails=None, stream=None, max_new_tokens=None):
        self.limits.append(max_new_tokens)
        turns = []
        for i, row in enumerate(rows):
            if tails is not None:
                self.fed[row].append(self.tokenizer.decode(tails[i]))
            assert self.scripts[row], f"row {row} asked for more turns than scripted (fed: {self.fed[row]})"
            text = self.scripts[row].pop(0)
            if stream is not None:
                for start in range(0, len(text), 5):
                    stream(text[start : start + 5])
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][:max_new_tokens]
            new = len(tails[i]) if tails is not None else len(self.prompts[row])
            turns.append(Turn(ids, text, not isinstance(text, CutOff), new, 0.001))
        return turns


class Scripts:
    """A session factory for GeoPilot(session_factory=...) that keeps the sessions it made, for assertions."""

    def __init__(self, tokenizer, *scripts: list[str]):
        self.tokenizer, self.scripts, self.sessions = tokenizer, scripts, []

    def __call__(self, prompts, pixel_values, options, image_counts=None, **images):
        """`images`: a family's other image inputs (Qwen2.5-VL's `image_grid_thw`: one row per image);
        `image_counts`: each conversation's images, when one has several."""
        rows = images["image_grid_thw"].shape[0] if "image_grid_thw" in images else pixel_values.shape[0]
        assert rows == sum(image_counts or [1] * len(prompts))
        self.image_counts = image_counts
        session = ScriptedSession(self.tokenizer, prompts, list(self.scripts))
        self.sessions.append(session)
        return session

    @property
    def fed(self) -> list[list[str]]:
        return self.sessions[-1].fed

    @property
    def limits(self) -> list[int | None]:
        return self.sessions[-1].limits


LONG_S = 5.0  # a turn of a question containing LONG takes this long (a long generation)


class KeywordSession:
    """Stands in for KVSession by what each question says: TOOL gets a detector plan, SLOW the slow tool, HANG the
    hanging tool, anything else a direct answer (LONG: after LONG_S); the answer turn after tools (or the first turn
    of a conversation ending with a client's tool results) quotes the count. A one-row turn given a `stream` sends
    4-character pieces, its `delay_s` spread over them (KVSession too streams only one row)."""

    encode_seconds = 0.0

    def __init__(self, tokenizer, prompts, delay_s: float):
        self.tokenizer, self.delay_s = tokenizer, delay_s
        self.questions = [tokenizer.decode(p) for p in prompts]
        self.turn = [0] * len(prompts)

    def generate(self, rows, tails=None, stream=None, max_new_tokens=None):
        delay = max(LONG_S if "LONG" in self.questions[r] else self.delay_s for r in rows)
        if stream is None or len(rows) != 1:  # a streamed turn takes its delay piece by piece, as decoding does
            time.sleep(delay)
            stream = None
        turns = []
        for row in rows:
            text = self._reply(self.questions[row], self.turn[row])
            self.turn[row] += 1
            if stream is not None:
                starts = range(0, len(text), 4)
                for start in starts:
                    time.sleep(delay / len(starts))
                    stream(text[start : start + 4])
            turns.append(Turn(self.tokenizer(text, add_special_tokens=False)["input_ids"], text, True, 5, 0.001))
        return turns

    @staticmethod
    def _reply(question: str, turn: int) -> str:
        if turn > 0 or "Answer my first question" in question:  # after tools, or a client brought tool results
            return answer("There are 2 planes.")
        for word, action in (
            ("SLOW", ("segment_semantic", {})),
            ("HANG", ("extract_roads", {})),
            ("TOOL", ("detect_objects", {"categories": ["plane"]})),
        ):
            if word in question:
                return plan(action, reasoning="Counting needs the detector.")
        return answer("A direct answer about the scene.")


def openai_planning_args(url: str, cases: Path | None, out: Path, seeds: str = "42,1337", *extra: str) -> list[str]:
    """`geopilot eval planning` against a scripted OpenAI-compatible server at `url` (model "scripted", one retry);
    `cases` None: the frozen planning set."""
    args = ["eval", "planning", "--agent", "openai", "--engine-url", url, "--model", "scripted"]
    args += ["--seeds", seeds, "--out", str(out), "--retries", "1"]
    return args + (["--cases", str(cases)] if cases is not None else []) + list(extra)
