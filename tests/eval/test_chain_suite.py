"""The chain suite chains_v1: frozen and rebuilt byte for byte, four kinds over optical and SAR, templates apart
from training's, and scored with chain breakdowns: the reference agent 100 %, a first-step-only agent 0 chains."""

from __future__ import annotations

import json
import re

import pytest

from geopilot.data_gen.chains import QUERIES as TRAINING_QUERIES
from geopilot.eval.cases import load_cases
from geopilot.eval.chain_set import CHAINS_FILE, QUERIES, frozen_manifest, write_chains
from geopilot.eval.cli import COMMANDS
from geopilot.eval.reference_agent import ReferenceAgent
from geopilot.eval.runner import run_benchmark
from geopilot.eval.toolkit import annotation_layer, suite_annotations


@pytest.fixture(scope="module")
def suite():
    return load_cases(CHAINS_FILE)


def test_the_frozen_suite_is_rebuilt_byte_for_byte(tmp_path):
    manifest = write_chains(tmp_path / "chains_v1.jsonl")
    assert manifest == frozen_manifest()
    assert (tmp_path / "chains_v1.jsonl").read_bytes() == CHAINS_FILE.read_bytes()
    assert json.loads((tmp_path / "chains_v1.annotations.json").read_text()) == json.loads(
        suite_annotations(CHAINS_FILE).read_text()
    )
    assert "build-chains" in COMMANDS


def test_the_suite_covers_four_chain_kinds_over_optical_and_sar(suite):
    cases = suite.cases
    assert len(cases) >= 120 and all(c.chain for c in cases)
    assert {c.category for c in cases} == {
        "chain_cloud_detection",
        "chain_grounding_segmentation",
        "chain_detection_in_region",
        "chain_sar_detection_counting",
    }
    assert {c.modality for c in cases} == {"optical", "sar"}
    for case in cases:
        assert [c.tool for c in case.reference_calls] == case.expected_tools and case.ground_truth
        assert [c.round for c in case.reference_calls] == list(range(1, len(case.expected_tools) + 1))


def _skeleton(template: str) -> str:
    return re.sub(r"\{\w+\}", "{}", template).lower()


def test_templates_are_disjoint_from_the_training_chain_templates(suite):
    training = {_skeleton(t) for templates in TRAINING_QUERIES.values() for t in templates}
    assert not training & {_skeleton(t) for templates in QUERIES.values() for t in templates}
    words = lambda text: set(re.findall(r"[a-z]+", text.lower()))  # noqa: E731
    for case in suite.cases:  # no query is a training template filled in
        for template in training:
            fixed = [part.strip() for part in template.split("{}") if len(part.strip()) > 12]
            assert not all(part in case.query.lower() for part in fixed) or not fixed, (case.id, template)
    assert all(words(c.query) for c in suite.cases)


@pytest.mark.parametrize(
    ("stop_after", "expected"),
    [
        (None, {"first_step": 1.0, "second_step": 1.0, "both": 1.0, "answer": 1.0, "chain": 1.0}),
        (1, {"first_step": 1.0, "second_step": 0.0, "both": 0.0, "answer": 0.0, "chain": 0.0}),
    ],
)
def test_scripted_agents_score_as_the_breakdowns_say(suite, tmp_path, stop_after, expected):
    registry, layer = annotation_layer(suite_annotations(CHAINS_FILE))
    summary = run_benchmark(ReferenceAgent(registry, stop_after), suite, [0], tmp_path / "run", layer, "reference")
    chains = summary["chains"]
    assert {k: chains[k] for k in expected} == expected
    assert set(chains["by_kind"]) == {c.category for c in suite.cases} and set(chains["by_modality"]) == {
        "optical",
        "sar",
    }
    if stop_after is None:
        assert summary["OPA"] == 1.0 and summary["accuracy"]["mean"] == 1.0 and not summary["failures"]
