"""The scripted reference agent: replays a case's `reference_calls` through the same tool layer and answers by
stating every number of every tool output next to its key. It shows what a correct agent scores on a suite, so a
shortfall points at the cases, the tools or the scorer, not at a model.

    geopilot eval planning --agent reference --catalog region/catalog.yaml --cases indicator_cases.jsonl --out DIR
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from geopilot.errors import GeoPilotInputError
from geopilot.eval.agents import execute
from geopilot.eval.cases import Case
from geopilot.eval.scorer import AgentRun
from geopilot.eval.tool_calls import Call, ParsedReply
from geopilot.eval.toolkit import sha256_text
from geopilot.image import load_image
from geopilot.tool_chains import ChatCalls
from geopilot.tool_protocol import ToolRegistry

AREA_IDENTIFIERS = {"id", "level"}  # an area record's code (VAL-N-1 reads as a number) and level: not findings


def render(value: Any) -> str:
    """A tool's `data` as one sentence of `key value` clauses, each number right after what it measures."""
    if isinstance(value, dict):
        if "name" in value and "value" in value:
            return f"{value['name']} {render(value['value'])}"
        named = isinstance(value.get("name"), str)
        head = f"{value['name']}: " if named else ""
        clauses = [
            _clause(key, item)
            for key, item in value.items()
            if not (named and (key == "name" or key in AREA_IDENTIFIERS))
        ]
        return head + ", ".join(clauses)
    if isinstance(value, list):
        return "; ".join(render(item) for item in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _clause(key: str, item: Any) -> str:
    text = f"{key.replace('_', ' ')} {render(item)}"
    if key == "change" and isinstance(item, int | float) and item:
        text += " (an increase)" if item > 0 else " (a decrease)"
    return text


def _outputs_sentence(result) -> str:
    """A detection, segmentation or objects-in-regions output as `key number` clauses (chain answers)."""
    output = result.output
    data = output.data or {}
    if "inside" in data:
        return "; ".join(
            f"inside {label} {data['inside'][label]}, outside {label} {data['outside'][label]}"
            for label in data["inside"]
        )
    if result.tool == "segment_referring":
        return f"area {100 * sum(d.area or 0.0 for d in output.detections):.2f} %"
    counts: dict[str, int] = {}
    for detection in output.detections:
        counts[detection.label] = counts.get(detection.label, 0) + 1
    return "; ".join(f"{label} {n}" for label, n in sorted(counts.items())) or "none found"


def answer_from(results, chain: bool = False) -> str:
    """The reference answer: each output's numbers next to what they measure; for a chain, the last step's."""
    if chain and results and results[-1].ok:
        return f"{results[-1].tool}: {_outputs_sentence(results[-1])}."
    sentences = []
    for result in results:
        if not result.ok:
            sentences.append(f"The {result.tool} tool could not answer: {result.error}.")
        elif result.output.data is not None and result.output.data.get("rejected"):
            sentences.append(f"I cannot help with that: {result.output.data.get('reason')}.")
        elif result.output.data is not None:
            sentences.append(f"{result.tool}: {render(result.output.data)}.")
        else:
            sentences.append(f"{result.tool}: done.")
    return " ".join(sentences) or "No tool was needed."


class ReferenceAgent:
    """`stop_after=N`: replay only the first N rounds and answer without their numbers (a chain suite's check that
    a first step alone scores first-step accuracy, never chain accuracy)."""

    name = "reference"

    def __init__(self, registry: ToolRegistry, stop_after: int | None = None):
        self.registry, self.stop_after = registry, stop_after
        self.prompt_hash = sha256_text("reference" if stop_after is None else f"reference-stop-{stop_after}")
        self.config = {"agent": self.name, **({"stop_after": stop_after} if stop_after is not None else {})}

    def run(self, case: Case, images: list[Path], seed: int) -> AgentRun:
        if case.expected_tools and not case.reference_calls:  # replaying nothing would score as a wrong agent
            raise GeoPilotInputError(
                f"case {case.id!r} expects {', '.join(case.expected_tools)} but has no `reference_calls`, the key the "
                "reference agent replays; this case set (the shipped planning_v1 has none) is for scoring a model"
            )
        started = time.perf_counter()
        loaded = [load_image(image) for image in images]  # the case's images, in order
        chat, records, results = ChatCalls(), [], []
        rounds = sorted({c.round for c in case.reference_calls})
        for round_ in rounds if self.stop_after is None else rounds[: self.stop_after]:
            calls = [Call(tool=c.tool, params=dict(c.params)) for c in case.reference_calls if c.round == round_]
            done, outputs = execute(self.registry, ParsedReply(dialect="text", calls=calls), loaded, case, round_, chat)
            records += done
            results += outputs
        stopped = self.stop_after is not None  # it stops where its step ends: no numbers of a later step
        answer = f"I ran {', '.join(r.tool for r in results)}." if stopped else answer_from(results, case.chain)
        return AgentRun(
            dialect="reference",
            calls=records,
            answer=answer,
            rounds=max((r.round for r in records), default=0),
            latency_s=time.perf_counter() - started,
        )
