"""Multi-step tool chains in the agent loop (docs/chains.md): plan -> tools -> plan -> tools -> answer over one KV
session, a later call reading an earlier call's artefact by `result:N`, and the refusals (bad reference, repeat)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.scripted import BrokenTool, Scripts, answer, plan
from PIL import Image
from transformers import LogitsProcessor, LogitsProcessorList

from geopilot.generation import KVSession
from geopilot.render import user_turn_text
from geopilot.tokenizer import encode_text
from geopilot.tool_chains import ChatCalls
from geopilot.tool_output import Artifact, Detection, ToolOutput
from geopilot.tool_protocol import ToolRegistry
from geopilot.tools.task_tools import DetectObjectsParams, NoParams
from geopilot.wire import format_tool_turn

QUESTION = "Remove the clouds, then count the ships."
RESTORED_SIZE = (32, 16)  # the restorer's artefact differs in size from the input (64 x 48), so the probe can tell


class Restorer:
    """remove_clouds writing a real artefact file (a small grey image)."""

    name, description, modality, params_model = "remove_clouds", "restores", "optical", NoParams

    def __init__(self, folder):
        self.folder, self.runs = folder, 0

    def run(self, image, params) -> ToolOutput:
        self.runs += 1
        path = self.folder / f"restored-{self.runs}.png"
        Image.new("RGB", RESTORED_SIZE, (120, 120, 120)).save(path)
        return ToolOutput(artifacts=[Artifact(kind="image", path=str(path))], message="restored")


class SizeProbe:
    """detect_objects that reports the size of the image it was given (in its message)."""

    name, description, modality, params_model = "detect_objects", "finds objects", "optical", DetectObjectsParams

    def __init__(self):
        self.sizes = []

    def run(self, image, params) -> ToolOutput:
        self.sizes.append(image.image.size)
        return ToolOutput(
            detections=[Detection(label=c, box=(0.1, 0.1, 0.3, 0.3)) for c in params.categories],
            message=f"{image.image.size[0]}x{image.image.size[1]}",
        )


@pytest.fixture
def chain_tools(tmp_path):
    restorer, probe = Restorer(tmp_path), SizeProbe()
    return ToolRegistry([restorer, probe], timeout_s=10), restorer, probe


CLEAR = ("remove_clouds", {})
DETECT_ON_1 = ("detect_objects", {"categories": ["ship"], "image": "result:1"})


# -- the real KV session on the tiny model, its turns forced to the scripted plans ---------------------------------


class Forced(LogitsProcessor):
    def __init__(self, ids: list[int]):
        self.ids, self.start = ids, None

    def __call__(self, input_ids, scores):
        self.start = input_ids.shape[1] if self.start is None else self.start
        forced = torch.full_like(scores, float("-inf"))
        forced[:, self.ids[min(input_ids.shape[1] - self.start, len(self.ids) - 1)]] = 0.0
        return forced


class ForcedSessions:
    """A session factory making real KVSessions whose turns are the scripted texts, in order."""

    def __init__(self, model, tokenizer, script: list[str]):
        self.model, self.tokenizer, self.script, self.sessions = model, tokenizer, list(script), []

    def __call__(self, prompts, pixels, options):
        factory = self

        class Session(KVSession):
            def generate(self, rows, tails=None, stream=None, keep_logits=False, max_new_tokens=None):
                text = factory.script.pop(0)
                ids = encode_text(factory.tokenizer, " " + text) + [factory.tokenizer.eos_token_id]
                self.logits_processor = LogitsProcessorList([Forced(ids)])
                return super().generate(rows, tails, stream, keep_logits, len(ids) + 2)

        session = Session(self.model, self.tokenizer, prompts, pixels, options)
        self.sessions.append(session)
        return session


def test_two_round_chain_on_the_tiny_model_reuses_one_kv_session(tiny, chain_tools):
    from geopilot.agent import GeoPilot

    model, processor = tiny
    registry, restorer, probe = chain_tools
    script = [plan(CLEAR), plan(DETECT_ON_1), answer("There is 1 ship.")]
    factory = ForcedSessions(model, processor.tokenizer, script)
    pilot = GeoPilot(model, processor, registry, session_factory=factory)
    image = np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    result = pilot.chat(image, QUESTION, max_rounds=2, generation={"max_new_tokens": 400})

    assert (result.outcome, result.answer, result.error) == ("tools", "There is 1 ship.", None)
    assert [(c.tool, c.round) for c in result.tool_calls] == [("remove_clouds", 1), ("detect_objects", 2)]
    assert probe.sizes == [RESTORED_SIZE]  # the second step ran on the first step's artefact, not on the input
    first, second = (c.output for c in result.tool_calls)
    assert (first.computed_on, second.computed_on) == ("input", "result:1")
    assert [t.tool_round for t in result.turns] == [1, 2, None]
    assert len(factory.sessions) == 1  # one KV session for the whole chain
    tok = processor.tokenizer
    tool_turns = [
        encode_text(tok, user_turn_text(format_tool_turn([(c.tool, c.output)], QUESTION), first=False))
        for c in result.tool_calls
    ]
    prompt = pilot.engine.prompt_tokens(result.messages[:1])
    # the first turn prefilled the prompt; each later turn only its new tool turn
    assert [t.new_input_tokens for t in result.turns] == [len(prompt)] + [len(ids) for ids in tool_turns]
    assert '"computed_on":"result:1"' in tok.decode(tool_turns[1])


# -- the loop's refusals, driven by scripted sessions ------------------------------------------------------------


def _pilot(tiny, registry, *script):
    from geopilot.agent import GeoPilot

    factory = Scripts(tiny[1].tokenizer, list(script))
    return GeoPilot(tiny[0], tiny[1], registry, session_factory=factory), factory


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("result:2", "this chat has made 1 call(s), there is no call 2"),
        ("result:0", "must be 'result:N'"),
        ("/etc/passwd", "must be 'result:N'"),
    ],
)
def test_a_bad_reference_is_a_validation_problem_with_one_repair_turn(tiny, chain_tools, image, reference, expected):
    registry, _, probe = chain_tools
    bad = ("detect_objects", {"categories": ["ship"], "image": reference})
    pilot, scripts = _pilot(tiny, registry, plan(CLEAR), plan(bad), plan(DETECT_ON_1), answer("1 ship."))
    result = pilot.chat(image, QUESTION, max_rounds=2)
    repair = scripts.fed[0][1]
    assert "Your last reply could not be used" in repair and expected in repair
    assert "/etc/passwd" not in repair  # refused without echoing a path
    assert [t.kind for t in result.turns] == ["think", "answer", "repair", "answer"]
    assert result.repaired and result.outcome == "tools" and probe.sizes == [RESTORED_SIZE]


def test_a_reference_to_the_wrong_kind_is_refused(tiny, chain_tools, image):
    registry, _, probe = chain_tools
    detect = ("detect_objects", {"categories": ["plane"]})
    on_detections = ("detect_objects", {"categories": ["ship"], "image": "result:1"})
    pilot, scripts = _pilot(tiny, registry, plan(detect), plan(on_detections), answer("No image to use."))
    result = pilot.chat(image, QUESTION, max_rounds=2)
    assert "invalid_reference" in scripts.fed[0][1] and "produced no image" in scripts.fed[0][1]
    assert result.outcome == "tools" and len(result.tool_calls) == 1


def test_a_failed_first_step_is_told_and_the_second_never_runs_on_nothing(tiny, image):
    probe = SizeProbe()
    registry = ToolRegistry([BrokenTool(), probe], timeout_s=10)
    pilot, scripts = _pilot(tiny, registry, plan(CLEAR), plan(DETECT_ON_1), plan(DETECT_ON_1), answer("It failed."))
    result = pilot.chat(image, QUESTION, max_rounds=3)
    assert '{"error":"tool' in scripts.fed[0][0] and "backend exploded" in scripts.fed[0][0]  # the model is told
    assert "call 1 (remove_clouds) failed" in scripts.fed[0][1]  # the next step is refused, with a repair turn
    assert probe.sizes == []  # never ran
    assert [c.error_kind for c in result.tool_calls] == ["tool_error", "invalid_reference"]


def test_the_same_call_on_the_same_input_is_refused_as_a_repeat(tiny, chain_tools, image):
    registry, _, probe = chain_tools
    detect = ("detect_objects", {"categories": ["ship"]})
    pilot, scripts = _pilot(tiny, registry, plan(detect), plan(detect), answer("1 ship."))
    result = pilot.chat(image, QUESTION, max_rounds=3)
    assert "repeated_call" in scripts.fed[0][1] and "call 1" in scripts.fed[0][1]
    assert len(probe.sizes) == 1 and result.outcome == "tools"


def test_a_chain_longer_than_max_rounds_ends_as_round_limit(tiny, chain_tools, image):
    registry, _, probe = chain_tools
    pilot, _ = _pilot(tiny, registry, plan(CLEAR), plan(DETECT_ON_1))
    result = pilot.chat(image, QUESTION, max_rounds=1)
    assert result.outcome == "round_limit" and "detect_objects" in result.error and probe.sizes == []


def test_references_resolve_only_inside_the_chat(chain_tools, image):
    from geopilot.image import load_image
    from geopilot.sample import Action

    registry, _, probe = chain_tools
    loaded = load_image(image)
    outside = registry.call(Action(tool="detect_objects", params=dict(DETECT_ON_1[1])), loaded)
    assert outside.error_kind == "invalid_reference" and "this call is in none" in outside.error
    calls = ChatCalls()  # a chat whose call 1 ran in this round: not readable until the round closes
    calls.record(registry.call(Action(tool="remove_clouds"), loaded, calls=calls))
    same_round = registry.call(Action(tool="detect_objects", params=dict(DETECT_ON_1[1])), loaded, calls=calls)
    assert same_round.error_kind == "invalid_reference" and "next round" in same_round.error
    calls.close_round()
    ok = registry.call(Action(tool="detect_objects", params=dict(DETECT_ON_1[1])), loaded, calls=calls)
    assert ok.ok and ok.output.computed_on == "result:1" and probe.sizes == [RESTORED_SIZE]
