"""The frozen planning set: proportions, hash, byte-for-byte rebuild, disjointness from the training templates,
and the case loader's errors on bad case files."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter

import pytest

from geopilot.cli import main
from geopilot.errors import GeoPilotInputError
from geopilot.eval.cases import file_sha256, load_cases
from geopilot.eval.planning_set import (
    OPENERS,
    PLANNING_FILE,
    PLANNING_IMAGES,
    QUERIES,
    frozen_manifest,
    write_planning_images,
)


@pytest.fixture(scope="module")
def planning():
    return load_cases(PLANNING_FILE)


def test_frozen_set_has_the_paper_proportions(planning):
    cases = planning.cases
    assert len(cases) == 500
    assert Counter(c.category for c in cases) == {
        "object_detection": 80,
        "panoptic_detection": 50,
        "referring_detection": 70,
        "semantic_segmentation": 50,
        "instance_segmentation": 50,
        "referring_segmentation": 40,
        "road_extraction": 30,
        "cloud_removal": 30,
        "no_tool": 100,
    }
    assert Counter(c.difficulty for c in cases) == {"easy": 200, "medium": 200, "hard": 100}
    for category in ("object_detection", "no_tool"):
        per = Counter(c.difficulty for c in cases if c.category == category)
        total = sum(per.values())
        assert per == {"easy": total * 0.4, "medium": total * 0.4, "hard": total * 0.2}
    sar = [c for c in cases if c.modality == "sar"]
    assert {c.category for c in sar} == {"panoptic_detection", "referring_detection", "no_tool"}
    assert all(c.expected_tools in ([], ["sar_detect_all"], ["sar_ground"]) for c in sar)
    assert all(
        c.param_checks
        for c in cases
        if c.category in ("object_detection", "referring_detection", "semantic_segmentation")
    )
    assert len({c.query for c in cases}) == 500
    assert all(planning.image_path(c).is_file() for c in cases)


def test_frozen_hash_and_byte_for_byte_rebuild(tmp_path, capsys):
    manifest = frozen_manifest()
    assert manifest["sha256"] == file_sha256(PLANNING_FILE) and manifest["cases"] == 500
    shutil.copytree(PLANNING_IMAGES, tmp_path / "planning_images")
    out = tmp_path / "planning_v1.jsonl"
    assert main(["eval", "build-planning", "--images", str(tmp_path / "planning_images"), "--out", str(out)]) == 0
    assert out.read_bytes() == PLANNING_FILE.read_bytes()
    assert manifest["sha256"] in capsys.readouterr().out


def test_rebuild_over_other_images_keeps_the_queries(tmp_path, planning):
    write_planning_images(tmp_path / "imgs", seed=5, optical=2, cloudy=1, sar=1)
    out = tmp_path / "sub" / "cases.jsonl"
    assert main(["eval", "build-planning", "--images", str(tmp_path / "imgs"), "--out", str(out), "--json"]) == 0
    rebuilt = load_cases(out)
    assert [c.query for c in rebuilt.cases] == [c.query for c in planning.cases]
    assert {rebuilt.cases[0].image.split("/")[0]} == {".."}  # relative to the case file


def test_planning_images_are_deterministic(tmp_path):
    for name in ("a", "b"):
        write_planning_images(tmp_path / name, seed=0, optical=1, cloudy=1, sar=1)
    for path in (tmp_path / "a").rglob("*.jpg"):
        assert path.read_bytes() == (tmp_path / "b" / path.relative_to(tmp_path / "a")).read_bytes()


def test_build_planning_bad_images_folder(tmp_path, capsys):
    assert main(["eval", "build-planning", "--images", str(tmp_path / "nope"), "--out", str(tmp_path / "x.jsonl")]) == 2
    (tmp_path / "empty" / "optical").mkdir(parents=True)
    assert (
        main(["eval", "build-planning", "--images", str(tmp_path / "empty"), "--out", str(tmp_path / "x.jsonl")]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "no images in optical/" in err[1]


def _ngrams(text: str, n: int = 4) -> set[tuple[str, ...]]:
    words = re.sub(r"\{\w+\}", " X ", text.lower()).replace("?", " ").replace(".", " ").replace(",", " ").split()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def test_templates_are_disjoint_from_the_training_templates(planning, capsys):
    from geopilot.data_gen import templates, wording

    training = [t for per in templates.QUERIES.values() for ts in per.values() for t in ts] + templates.CAPTION_QUERIES
    ours = [t for per in QUERIES.values() for ts in per.values() for t in ts]
    assert not set(ours) & set(training)
    patterns = [re.compile(re.sub(r"\\\{\w+\\\}", ".+", re.escape(t)), re.IGNORECASE) for t in training]
    shared = [c.query for c in planning.cases for p in patterns if p.fullmatch(c.query)]
    stripped = [c.query[len(o) :] for c in planning.cases for o in OPENERS if o and c.query.startswith(o)]
    shared += [q for q in stripped for p in patterns if p.fullmatch(q)]
    assert shared == []  # no planning query is an instance of a training template

    # the query grammar (data_gen/wording.py) writes most training requests: none of its frames is a planning template
    def normal(text: str) -> str:
        return " ".join(re.sub(r"[?.,;!]", " ", re.sub(r"\{\w+\}", " X ", text.lower())).split())

    grammar = [f for ability in wording.GRAMMAR for f in wording.frames(ability)]
    assert len(grammar) > 10_000
    assert not {normal(t) for t in ours} & {normal(f) for f in grammar}
    training += grammar
    train_grams = set().union(*(_ngrams(t) for t in training))
    our_grams = set().union(*(_ngrams(t) for t in ours))
    overlap = len(our_grams & train_grams) / len(our_grams)
    with capsys.disabled():
        print(
            f"\nplanning vs training templates: 4-gram overlap {overlap:.1%} "
            f"({len(our_grams & train_grams)} of {len(our_grams)}): {sorted(our_grams & train_grams)[:8]}"
        )
    assert overlap < 0.10


GOOD = {
    "id": "k1",
    "query": "How many ships?",
    "image": None,
    "modality": "optical",
    "category": "od",
    "difficulty": "easy",
    "expected_tools": ["detect_objects"],
    "max_rounds": 1,
}


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([{k: v for k, v in GOOD.items() if k != "query"}], "line 1, case 'k1': query: Field required"),
        ([{**GOOD, "max_rounds": "two"}], "case 'k1': max_rounds: "),
        ([{**GOOD, "expected_tools": "detect_objects"}], "case 'k1': expected_tools: "),
        ([{**GOOD, "difficulty": "extreme"}], "case 'k1': difficulty: "),
        ([{**GOOD, "surprise": 1}], "case 'k1': surprise: unknown key"),
        ([GOOD, GOOD], "line 2, case 'k1': duplicate id (first on line 1)"),
        (
            [
                {
                    **GOOD,
                    "param_checks": [{"tool": "detect_objects", "field": "categories", "op": "any_of", "value": "x"}],
                }
            ],
            "any_of",
        ),
        (
            [{**GOOD, "param_checks": [{"tool": "ground", "field": "expression", "op": "nonempty"}]}],
            "not in expected_tools",
        ),
        ([{**GOOD, "image": "missing.png"}], "case 'k1': image"),
        (["not json"], "line 1: not JSON"),
        ([[1, 2]], "line 1: expected a JSON object"),
        ([], "holds no cases"),
    ],
)
def test_bad_case_files_are_rejected_with_the_case_id(tmp_path, lines, message):
    path = tmp_path / "cases.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    with pytest.raises(GeoPilotInputError, match=re.escape(message)):
        load_cases(path)
