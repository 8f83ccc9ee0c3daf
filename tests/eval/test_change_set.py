"""The change question set change_v1: rebuilt byte for byte, two images per case, truth from the labels, templates
apart from data_gen's change grammar, scored by the planning scorer and the caption metrics."""

from __future__ import annotations

import json
import re

import numpy as np
from PIL import Image

from geopilot.eval.cases import load_cases
from geopilot.eval.change_set import (
    CHANGE_FILE,
    CHANGE_MANIFEST,
    COUNTS,
    QUERIES,
    change_caption_scores,
    references_path,
    write_change_set,
)
from geopilot.eval.planning_set import CLOSERS, OPENERS
from geopilot.eval.scorer import AgentRun, CallRecord, score


def test_the_frozen_set_is_rebuilt_byte_for_byte(tmp_path):
    manifest = write_change_set(tmp_path / "change_v1.jsonl")
    assert manifest == json.loads(CHANGE_MANIFEST.read_text())
    assert (tmp_path / "change_v1.jsonl").read_bytes() == CHANGE_FILE.read_bytes()
    assert references_path(tmp_path / "change_v1.jsonl").read_bytes() == references_path(CHANGE_FILE).read_bytes()
    shipped = sorted(p.name for p in (CHANGE_FILE.parent / "change_images").iterdir())
    assert shipped == sorted(p.name for p in (tmp_path / "change_images").iterdir())
    for name in shipped:
        assert (tmp_path / "change_images" / name).read_bytes() == (
            CHANGE_FILE.parent / "change_images" / name
        ).read_bytes()


def test_every_case_has_a_before_after_pair_and_truth_from_its_label():
    from scipy import ndimage

    case_set = load_cases(CHANGE_FILE)  # checks every image exists
    assert {c.category: 0 for c in case_set.cases}.keys() == COUNTS.keys()
    for category, total in COUNTS.items():
        assert sum(c.category == category for c in case_set.cases) == total
    for case in case_set.cases:
        before, after = case_set.image_paths(case)
        assert case.image is None and before.name.endswith("_A.jpg") and after.name == before.name.replace("_A", "_B")
        label = np.asarray(Image.open(before.with_name(before.name.replace("_A.jpg", "_label.png")))) > 0
        truth = {t.label: t for t in case.ground_truth}
        if case.category == "change_captioning":
            assert case.expected_tools == [] and not truth
            continue
        assert case.expected_tools == ["detect_changes"]
        if case.category == "change_counting":
            assert truth["building"].value == ndimage.label(label, structure=np.ones((3, 3)))[1]
            assert [c.field for c in case.param_checks] == ["classes"]
        if case.category == "change_area":
            assert abs(truth["%"].value - 100 * label.mean()) < 0.01


def test_templates_are_written_apart_from_the_training_grammar():
    from geopilot.data_gen.wording import CHANGE_GRAMMAR, frames

    def normal(text: str) -> str:
        return " ".join(re.sub(r"[?.,;!]", " ", re.sub(r"\{\w+\}", " X ", text.lower())).split())

    training = {normal(f.replace("{modality}", "optical")) for ability in CHANGE_GRAMMAR for f in frames(ability)}
    ours = [t for per in QUERIES.values() for ts in per.values() for t in ts]
    assert not {normal(t) for t in ours} & training
    for case in load_cases(CHANGE_FILE).cases:  # no query, stripped of its opener and closer, is a training frame
        body = case.query
        for opener in sorted(filter(None, OPENERS), key=len, reverse=True):
            body = body.removeprefix(opener)
        for closer in sorted(filter(None, CLOSERS), key=len, reverse=True):
            body = body.removesuffix(closer)
        assert normal(body) not in training

    def grams(text: str) -> set:
        words = normal(text).split()
        return {tuple(words[i : i + 4]) for i in range(len(words) - 3)}

    ours_grams = set().union(*(grams(t) for t in ours))
    train_grams = set().union(*(grams(f) for f in training))
    assert len(ours_grams & train_grams) / len(ours_grams) < 0.10


def test_the_planning_scorer_scores_change_cases_like_the_others():
    case_set = load_cases(CHANGE_FILE)
    counting = next(c for c in case_set.cases if c.category == "change_counting")
    n = int(counting.ground_truth[0].value)
    right = AgentRun(
        dialect="geopilot_json",
        calls=[CallRecord(tool="detect_changes", params={"classes": ["building"]})],
        answer=f"{n} buildings changed between the two dates.",
        rounds=1,
    )
    assert score(counting, right).passed
    no_classes = right.model_copy(update={"calls": [CallRecord(tool="detect_changes")]})
    assert "param_mismatch" in score(counting, no_classes).categories
    wrong_tool = right.model_copy(
        update={"calls": [CallRecord(tool="detect_objects", params={"categories": ["building"]})]}
    )
    assert not score(counting, wrong_tool).passed and score(counting, wrong_tool).tsa == 0
    wrong_number = right.model_copy(update={"answer": f"{n + 3} buildings changed."})
    assert "numeric_mismatch" in score(counting, wrong_number).categories
    caption = next(c for c in case_set.cases if c.category == "change_captioning")
    assert score(caption, AgentRun(dialect="geopilot_json", answer="Two houses were built.")).passed
    calls_a_tool = AgentRun(dialect="geopilot_json", calls=[CallRecord(tool="detect_changes")], answer="x", rounds=1)
    assert not score(caption, calls_a_tool).passed


def test_change_captions_are_scored_with_the_caption_metrics(tmp_path):
    references = {
        json.loads(line)["id"]: json.loads(line)["references"]
        for line in references_path(CHANGE_FILE).read_text().splitlines()
    }
    assert len(references) == COUNTS["change_captioning"] and all(len(r) == 5 for r in references.values())
    results = tmp_path / "results.jsonl"
    rows = [{"case_id": i, "seed": 42, "run": {"answer": refs[0]}} for i, refs in references.items()]
    rows += [{"case_id": i, "seed": 7, "run": {"answer": ""}} for i in references]
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    perfect = change_caption_scores(CHANGE_FILE, results, seed=42)
    empty = change_caption_scores(CHANGE_FILE, results, seed=7)
    assert perfect["BLEU-4"] > 0.99 and perfect["total"] == len(references) and perfect["missing"] == 0
    assert empty["BLEU-1"] < 1e-6 and empty["CIDEr"] == 0.0 and empty["empty"] == len(references)


def test_levir_cc_references_are_the_readers_captions(tmp_path):
    from geopilot.eval.benchmark_tasks import score_captions
    from geopilot.eval.change_set import levir_cc_references

    root = tmp_path / "LEVIR-CC"
    (root / "images" / "test" / "A").mkdir(parents=True)
    (root / "images" / "test" / "B").mkdir(parents=True)
    for side in ("A", "B"):
        Image.new("RGB", (16, 16)).save(root / "images" / "test" / side / "test_000001.png")
    raws = [" many villas are built along the road .", " the road   has houses now ."]
    entry = {"filepath": "test", "filename": "test_000001.png", "split": "test", "changeflag": 1}
    entry["sentences"] = [{"raw": r, "tokens": r.split()[:-1], "imgid": 0, "sentid": k} for k, r in enumerate(raws)]
    (root / "LevirCCcaptions.json").write_text(json.dumps({"images": [entry]}))
    references = levir_cc_references(root)
    assert references == [
        {"id": "test/test_000001", "references": ["many villas are built along the road.", "the road has houses now."]}
    ]
    refs = {r["id"]: r["references"] for r in references}
    assert score_captions(refs, {"test/test_000001": "many villas are built along the road."}, "ptb")["BLEU-4"] > 0.99
