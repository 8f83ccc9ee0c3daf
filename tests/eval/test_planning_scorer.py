"""Golden tests of the deterministic scorer: one per branch, the precedence of categories, and the text checks."""

from __future__ import annotations

import pytest

from geopilot.eval.cases import Case
from geopilot.eval.scorer import PRECEDENCE, AgentRun, CallRecord, score
from geopilot.eval.text_checks import extract_numbers, forbidden_present, keyword_present, numbers_by_label


def case(**overrides) -> Case:
    base = {
        "id": "c1",
        "query": "How many planes?",
        "image": "x.png",
        "modality": "optical",
        "category": "od",
        "difficulty": "easy",
        "expected_tools": ["detect_objects"],
        "param_checks": [
            {"tool": "detect_objects", "field": "categories", "op": "any_of", "value": ["plane", "aircraft"]}
        ],
        "max_rounds": 1,
    }
    return Case.model_validate({**base, **overrides})


def call(tool="detect_objects", params=None, error_kind=None, round_=1) -> CallRecord:
    params = {"categories": ["planes"]} if params is None else params
    return CallRecord(tool=tool, params=params, ok=error_kind is None, error_kind=error_kind, round=round_)


def run(*calls, dialect="geopilot_json", answer="There are 3 planes.", rounds=None, **kw) -> AgentRun:
    return AgentRun(
        dialect=dialect,
        calls=list(calls),
        answer=answer,
        rounds=rounds if rounds is not None else (1 if calls else 0),
        **kw,
    )


def flags(result):
    return result.tsa, result.pa, result.nta, result.opa


def test_right_tool_right_params_passes():
    result = score(case(), run(call()))
    assert result.passed and result.category is None and result.categories == []
    assert flags(result) == (True, True, None, True)


def test_infra_error_is_excluded():
    result = score(case(), AgentRun(dialect="empty", infra_error="HTTP 500 (after 3 attempts)"))
    assert (result.passed, result.category, flags(result)) == (None, "infra_error", (None, None, None, None))


@pytest.mark.parametrize("dialect", ["unparsable", "empty"])
def test_unparsable_and_empty_are_incorrect(dialect):
    result = score(case(), AgentRun(dialect=dialect, parse_error="bad"))
    assert result.category == "unparsable" and "missing_tool" in result.categories
    assert flags(result) == (False, None, None, False)


def test_unknown_tool_comes_before_missing_tool():
    result = score(case(), run(call("detect_planes", error_kind="unknown_tool")))
    assert result.categories[:2] == ["unknown_tool", "missing_tool"] and result.category == "unknown_tool"
    assert result.tsa is False


def test_no_tool_case_abstaining_and_calling():
    no_tool = case(expected_tools=[], param_checks=[], max_rounds=0)
    good = score(no_tool, run(answer="It is farmland."))
    assert good.passed and flags(good) == (True, None, True, True)
    bad = score(no_tool, run(call("detect_all", {}), answer="Found things."))
    assert bad.category == "unnecessary_tool" and flags(bad) == (False, None, False, False)
    assert "too_many_rounds" in bad.categories  # one tool round with max_rounds 0


def test_missing_tool_when_the_only_call_failed_modality():
    result = score(case(), run(call(error_kind="wrong_modality")))
    assert result.category == "missing_tool"


def test_timeout_counts_as_unsuccessful_call():
    result = score(case(), run(call(error_kind="timeout")))
    assert result.category == "missing_tool" and "tool_failed" in result.categories


def test_extra_tool():
    result = score(case(), run(call(), call("extract_roads", {})))
    assert result.category == "extra_tool" and flags(result) == (False, None, None, False)


def test_wrong_order_of_several_tools():
    two = case(expected_tools=["remove_clouds", "detect_objects"])
    assert score(two, run(call("remove_clouds", {}), call())).passed
    result = score(two, run(call(), call("remove_clouds", {})))
    assert result.category == "wrong_order" and result.tsa is False


def test_invalid_params_keep_the_tool_selected_but_fail_pa():
    result = score(case(), run(call(params={"categories": []}, error_kind="invalid_params")))
    assert result.category == "invalid_params" and "param_mismatch" in result.categories
    assert flags(result) == (True, False, None, False)


def test_param_mismatch():
    result = score(case(), run(call(params={"categories": ["ship"]})))
    assert result.category == "param_mismatch" and flags(result) == (True, False, None, False)
    assert "got ['ship']" in next(c.detail for c in result.checks if c.category == "param_mismatch")


@pytest.mark.parametrize(
    ("check", "params", "holds"),
    [
        ({"op": "contains", "value": "storage tank"}, {"categories": ["Storage-Tanks"]}, True),
        ({"op": "contains", "value": "ship"}, {"categories": ["plane"]}, False),
        ({"op": "equals", "value": ["plane", "ship"]}, {"categories": ["ships", "plane"]}, True),
        ({"op": "equals", "value": ["plane"]}, {"categories": ["plane", "ship"]}, False),
        ({"op": "any_of", "value": ["car", "vehicle"]}, {"categories": ["small vehicle", "cars"]}, True),
        ({"op": "nonempty"}, {"categories": ["x"]}, True),
        ({"op": "nonempty"}, {}, False),
    ],
)
def test_param_check_ops(check, params, holds):
    c = case(param_checks=[{"tool": "detect_objects", "field": "categories", **check}])
    assert score(c, run(call(params=params))).passed is holds


def test_contains_on_text_is_whole_words():
    c = case(
        expected_tools=["ground"],
        param_checks=[{"tool": "ground", "field": "expression", "op": "contains", "value": "ship"}],
    )
    assert score(c, run(call("ground", {"expression": "the white Ships near the dock"}))).passed
    assert not score(c, run(call("ground", {"expression": "the shipyard crane"}))).passed


def test_tool_failed_at_run_time_after_a_good_call():
    result = score(case(), run(call(), call(error_kind="tool_error")))
    assert result.category == "tool_failed" and result.opa is True  # planning was right; the tool broke


def test_keywords_synonym_groups_and_forbidden_scope():
    c = case(must_contain=["plane", ["airport", "airfield"]], must_not_contain=["error"])
    assert score(c, run(call(), answer="Three PLANES at the airfield, margin of error small.")).passed
    missing = score(c, run(call(), answer="Three planes."))
    assert missing.category == "missing_keyword"
    forbidden = score(c, run(call(), answer="Error: the planes at the airport could not be counted."))
    assert forbidden.category == "forbidden_term"


def test_numbers_with_tolerance_near_their_label():
    c = case(
        ground_truth=[
            {"label": "water", "value": 12.5, "tolerance": 0.5},
            {"label": "tree", "value": 40, "tolerance": 1},
        ]
    )
    assert score(c, run(call(), answer="Water covers 12,8 % and trees about 40 percent.")).passed
    swapped = score(c, run(call(), answer="Water covers 40 % and trees 12.5 %."))
    assert swapped.category == "numeric_mismatch" and len([x for x in swapped.checks if not x.passed]) == 2


def test_rounds_over_the_limit():
    result = score(case(), run(call(), call(round_=2), rounds=2))
    assert result.category == "too_many_rounds" and result.opa is True


def test_precedence_lists_every_category_once():
    assert len(PRECEDENCE) == len(set(PRECEDENCE)) and PRECEDENCE[0] == "infra_error"


def test_text_helpers():
    assert [n.value for n in extract_numbers("1,500 ships, 12,5 % water, -3 m, v1.5 and 0.25")] == [
        1500,
        12.5,
        -3,
        0.25,
    ]
    assert [n.unit for n in extract_numbers("12 % and 3 km and 4 percent")] == ["%", "km", "percent"]
    assert numbers_by_label("Forest: 30 %, water: 10 %.", ["water", "forest"]) == {"water": [10.0], "forest": [30.0]}
    assert numbers_by_label("About 7.", ["planes"]) == {"planes": [7.0]}  # one label, not repeated
    assert keyword_present("Café", "cafe") and not keyword_present("shipyard", "ship")
    assert not forbidden_present("within the margin of error", "error")
    assert forbidden_present("an error occurred", "error")
