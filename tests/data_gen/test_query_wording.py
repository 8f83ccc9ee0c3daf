"""Lexical variety of the generated queries: the vocabulary's synonyms, the template client's wordings, and the
category requests for classes an image does not contain. The call's params stay canonical whatever the wording."""

from __future__ import annotations

import random
from collections import Counter
from importlib import resources
from pathlib import Path

import pytest
import yaml

from geopilot.data_gen.abilities import plan_target
from geopilot.data_gen.templates import QUERIES, TemplateClient, names_for, plural
from geopilot.data_gen.validate import check_query
from geopilot.errors import ConfigError, GeoPilotInputError
from geopilot.records import AnnotationRecord, ObjectAnnotation
from geopilot.vocabulary import class_synonyms, default_vocabulary, is_known_class, load_vocabulary


def test_synonyms_name_everyday_words_and_are_not_lookups():
    assert {"truck", "lorry"} <= set(class_synonyms("large vehicle"))
    assert {"plane", "aircraft", "jet"} <= set(class_synonyms("airplane"))
    assert {"forest", "woodland"} <= set(class_synonyms("tree"))
    assert {"vessel", "boat"} <= set(class_synonyms("ship"))
    assert class_synonyms("arj21") == []
    assert not is_known_class("lorry") and not is_known_class("woodland")  # lookups never use synonyms
    with pytest.raises(GeoPilotInputError, match="not a canonical class"):
        class_synonyms("lorry")
    vocabulary = default_vocabulary()
    assert set(vocabulary.data.synonyms) <= set(vocabulary.data.classes)


def _shipped() -> dict:
    return yaml.safe_load(Path(str(resources.files("geopilot") / "vocabulary.yaml")).read_text())


@pytest.mark.parametrize(
    ("synonyms", "message"),
    [
        ({"ship": ["vessel"], "harbor": ["vessel"]}, "'vessel' is listed for"),
        ({"ship": ["car"]}, "unrelated class 'car'"),
        ({"pier": ["jetty"]}, "'pier' is not a canonical class"),
        ({"ship": ["ship"]}, "the class's own name"),
    ],
)
def test_an_inconsistent_synonym_table_is_refused(tmp_path, synonyms, message):
    path = tmp_path / "vocabulary.yaml"
    path.write_text(yaml.safe_dump({**_shipped(), "synonyms": synonyms}))
    with pytest.raises(ConfigError, match=message):
        load_vocabulary(path)


def test_a_synonym_may_name_a_subclass():
    assert "car" in class_synonyms("small vehicle")  # canonical `car` is a kind of small vehicle


def test_plural_keeps_uncountable_words():
    assert [plural(w) for w in ("aircraft", "lorry", "bus", "oil tank")] == [
        "aircraft",
        "lorries",
        "buses",
        "oil tanks",
    ]


def _record(labels: list[str]) -> AnnotationRecord:
    objects = [ObjectAnnotation(label, (0.1 * i, 0.1, 0.1 * i + 0.05, 0.2)) for i, label in enumerate(labels)]
    return AnnotationRecord("DOTA", "images/P0001.png", 100, 100, record_id="P0001", objects=objects)


def _plans(ability: str, record: AnnotationRecord, n: int = 300) -> list[tuple[dict, dict]]:
    client, out = TemplateClient(), []
    for seed in range(n):
        target = plan_target(ability, record, random.Random(seed))
        facts = {
            "ability": ability,
            "difficulty": target.difficulty,
            "modality": "optical",
            "tool": target.tool,
            "params": target.params,
            **target.facts,
        }
        out.append((target, client.reply("plan", facts, seed)))
    return out


def test_queries_use_synonyms_and_params_stay_canonical():
    record = _record(["large vehicle", "large vehicle", "airplane", "ship"])
    plans = _plans("object_detection", record)
    words = Counter()
    for target, reply in plans:
        assert reply["actions"] == [{"tool": "detect_objects", "params": target.params}]
        assert all(
            is_known_class(c) and c == default_vocabulary().canonical_class(c) for c in target.params["categories"]
        )
        assert check_query(reply["query"], target) == []  # the validator accepts a synonym as naming the class
        assert all(
            name in reply["reasoning"] or plural(name) in reply["reasoning"] for name in target.params["categories"]
        )
        for category in target.params["categories"]:
            words.update(n for n in names_for(category) if plural(n) in reply["query"].lower())
    assert {"lorry", "truck", "jet", "vessel"} <= set(words)  # synonyms appear ...
    assert words["large vehicle"] > 0 and words["ship"] > 0  # ... and canonical names still do
    verbs = {q.split()[0] for ts in QUERIES["object_detection"].values() for q in ts}
    assert len(verbs) >= 10


def test_some_category_requests_name_an_absent_class_of_the_source():
    record = _record(["storage tank", "storage tank"])
    targets = [target for target, _ in _plans("object_detection", record, n=200)]
    absent = [t for t in targets if t.params["categories"] != ["storage tank"]]
    assert 0.1 < len(absent) / len(targets) < 0.35
    assert all(t.facts["counts"][c] == 0 for t in absent for c in t.params["categories"] if c != "storage tank")
    assert {c for t in absent for c in t.params["categories"]} <= set(default_vocabulary().dataset_classes("DOTA"))


def test_land_cover_and_expressions_are_reworded():
    reply = TemplateClient().reply
    classes = {
        reply(
            "plan",
            {
                "ability": "semantic_segmentation",
                "difficulty": "easy",
                "modality": "optical",
                "tool": "segment_semantic",
                "params": {"classes": ["tree"]},
            },
            seed,
        )["query"]
        for seed in range(60)
    }
    assert any("woodland" in q or "forest" in q for q in classes) and any("tree" in q for q in classes)
    facts = {
        "ability": "visual_grounding",
        "difficulty": "easy",
        "modality": "optical",
        "tool": "ground",
        "params": {"expression": "the large vehicle in the upper left"},
        "target_labels": ["large vehicle"],
    }
    replies = [reply("plan", facts, seed) for seed in range(60)]
    assert any("lorry" in r["query"] or "truck" in r["query"] for r in replies)
    assert all(r["actions"][0]["params"]["expression"] == "the large vehicle in the upper left" for r in replies)


SLOTS = {
    "object_detection": "{targets}",
    "instance_segmentation": "{targets}",
    "semantic_segmentation": "{classes}",
    "visual_grounding": "{expression}",
    "visual_grounding_sar": "{expression}",
    "referring_segmentation": "{expression}",
}


def test_the_grammar_writes_each_intent_in_many_frames_and_keeps_the_slots():
    from geopilot.data_gen.wording import GRAMMAR, compose, frames

    for ability in GRAMMAR:
        written = {
            compose(ability, difficulty, random.Random(seed))
            for seed in range(200)
            for difficulty in ("easy", "medium", "hard")
        }
        assert len(written) > 300, ability  # hardly a request is written twice
        slot = SLOTS.get(ability)
        if slot is not None:
            assert all(slot in text for text in written), ability  # the class or referent is always asked about
        assert len(frames(ability)) > 1000
    assert compose("cloud_removal", "hard", random.Random(3)) == compose("cloud_removal", "hard", random.Random(3))
