"""The deterministic scorer: one case + one agent run -> every check, pass/fail, and a failure category. No judge.

Checks, in the order of PRECEDENCE (the first failing one is the row's `category`; all failing ones are kept):
  infra_error       the run never got a usable reply (timeout, endpoint failure): no other check; excluded
  unparsable        the reply is empty or tries a tool-call dialect and gets it wrong (geopilot.eval.tool_calls)
  unknown_tool      a call names a tool that is not in the registry
  unnecessary_tool  a no-tool case (expected_tools == []) made a call
  missing_tool      recall < 1: an expected tool has no successful call (see below)
  extra_tool        a call to a known tool that the case does not expect
  wrong_order       the expected tools were first called in another order (cases with several tools)
  invalid_params    a call to an expected tool failed its params schema
  param_mismatch    a `param_checks` predicate holds for no successful call of its tool
  tool_failed       an expected tool timed out or raised in the tool layer
  missing_keyword   a `must_contain` keyword (or every member of a synonym group) is absent from the answer
  forbidden_term    a `must_not_contain` term is present (outside benign phrases such as "margin of error")
  numeric_mismatch  a `ground_truth` number is not stated near its label within its tolerance
  too_many_rounds   more tool rounds than `max_rounds`
A chain case (`chain: true`) is also scored step by step (`ChainScore`: first step, second step, both, answer).
A case with `expect_tool_errors` (an area that does not exist) counts a call the tool rejected as selecting the
tool, and its tool errors are the point, not a failure. A call is *successful* when the tool layer accepted the tool name and modality and it did not time out or
raise; a call whose params fail the schema still counts as choosing that tool (the parameters are PA's
concern, not TSA's). Cost and latency are recorded on the row, never gated.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from geopilot.eval.cases import Case, ParamCheck
from geopilot.eval.text_checks import (
    contains_term,
    forbidden_present,
    keyword_present,
    normalise_term,
    numbers_by_label,
)

PRECEDENCE: tuple[str, ...] = (
    "infra_error",
    "unparsable",
    "unknown_tool",
    "unnecessary_tool",
    "missing_tool",
    "extra_tool",
    "wrong_order",
    "invalid_params",
    "param_mismatch",
    "tool_failed",
    "missing_keyword",
    "forbidden_term",
    "numeric_mismatch",
    "too_many_rounds",
)
SELECTION = {"unparsable", "unknown_tool", "unnecessary_tool", "missing_tool", "extra_tool", "wrong_order"}
PARAMS = {"invalid_params", "param_mismatch"}
SELECTED_KINDS = (None, "invalid_params")  # error kinds of a call that still selected its tool
RUNTIME_FAILURES = ("timeout", "tool_error", "invalid_output")


class CallRecord(BaseModel):
    tool: str
    params: dict[str, Any] = {}
    ok: bool = True
    error_kind: str | None = None  # unknown_tool | invalid_params | wrong_modality | timeout | tool_error | ...
    error: str | None = None
    round: int = 1


class AgentRun(BaseModel):
    """What an agent did on one case: its calls (as the tool layer saw them), its answer and its costs."""

    dialect: str
    calls: list[CallRecord] = []
    answer: str | None = None
    rounds: int = 0  # tool rounds executed
    latency_s: float = 0.0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float | None = None
    infra_error: str | None = None
    parse_error: str | None = None
    raw: str = ""  # the first reply, as sent (truncated)


class Check(BaseModel):
    name: str
    category: str
    passed: bool
    detail: str = ""


class ChainScore(BaseModel):
    """A chain case step by step: a step is right when a successful call of its tool satisfies every param check of
    that tool (a reference to the previous step's result included) in a later round than the step before."""

    first_step: bool
    second_step: bool  # a one-call chain (SAR detection -> counting): its second step is the answer's counting
    both: bool
    answer: bool  # every keyword and number check of the answer
    chain: bool  # the whole case passed


class Score(BaseModel):
    passed: bool | None  # all checks passed; None for an infra error (excluded from accuracy)
    category: str | None  # the first failing check by PRECEDENCE
    categories: list[str]  # every failing category, in PRECEDENCE order
    checks: list[Check]
    tsa: bool | None  # right tool set (no-tool cases: no call); None for an infra error
    pa: bool | None  # right parameters, given the right tools (tool cases with tsa only)
    nta: bool | None  # no-tool cases only: abstained
    opa: bool | None  # the planning decision is right: tsa and pa, or nta
    chain: ChainScore | None = None  # chain cases only


def _field(params: dict, path: str) -> Any:
    value: Any = params
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _contains(value: Any, wanted: Any) -> bool:
    if isinstance(value, list):
        return any(_equals(item, wanted) for item in value)
    if isinstance(value, str) and isinstance(wanted, str):
        return contains_term(value, wanted)
    return _equals(value, wanted)


def _equals(value: Any, wanted: Any) -> bool:
    if isinstance(value, list):
        wanted = wanted if isinstance(wanted, list) else [wanted]
        return {_norm(v) for v in value} == {_norm(w) for w in wanted}
    return _norm(value) == _norm(wanted)


def _norm(value: Any) -> Any:
    return normalise_term(value) if isinstance(value, str) else value


def param_check_holds(check: ParamCheck, params: dict) -> bool:
    value = _field(params, check.field)
    if check.op == "nonempty":
        return value not in (None, "", [], {})
    if value is None:
        return False
    if check.op == "contains":
        return _contains(value, check.value)
    if check.op == "equals":
        return _equals(value, check.value)
    return any(_contains(value, alternative) for alternative in check.value)  # any_of


def _no_calls_check(name: str, category: str, calls: list) -> Check:
    """Passes when there are no such calls; the detail is each call's error (or its tool's name)."""
    return Check(name=name, category=category, passed=not calls, detail="; ".join(c.error or c.tool for c in calls))


def _tool_checks(case: Case, run: AgentRun) -> list[Check]:
    checks = []
    unknown = sorted({c.tool for c in run.calls if c.error_kind == "unknown_tool"})
    checks.append(Check(name="known_tools", category="unknown_tool", passed=not unknown, detail=", ".join(unknown)))
    if not case.expected_tools:
        called = [c.tool for c in run.calls]
        checks.append(Check(name="no_tool", category="unnecessary_tool", passed=not called, detail=", ".join(called)))
        return checks
    kinds = SELECTED_KINDS + (RUNTIME_FAILURES if case.expect_tool_errors else ())
    selected = [c for c in run.calls if c.error_kind in kinds]
    selected_names = [c.tool for c in selected]
    missing = [t for t in case.expected_tools if t not in selected_names]
    checks.append(Check(name="tool_recall", category="missing_tool", passed=not missing, detail=", ".join(missing)))
    extra = sorted({c.tool for c in run.calls if c.error_kind != "unknown_tool"} - set(case.expected_tools))
    checks.append(Check(name="no_extra_tools", category="extra_tool", passed=not extra, detail=", ".join(extra)))
    if len(case.expected_tools) > 1:
        first_seen = list(dict.fromkeys(n for n in selected_names if n in case.expected_tools))
        ordered = first_seen == [t for t in dict.fromkeys(case.expected_tools) if t in first_seen]
        checks.append(Check(name="tool_order", category="wrong_order", passed=ordered, detail=" -> ".join(first_seen)))
    invalid = [c for c in run.calls if c.tool in case.expected_tools and c.error_kind == "invalid_params"]
    checks.append(_no_calls_check("params_valid", "invalid_params", invalid))
    for check in case.param_checks:
        candidates = [c.params for c in run.calls if c.tool == check.tool and c.ok]
        holds = any(param_check_holds(check, params) for params in candidates)
        seen = "no successful call" if not candidates else "; ".join(str(_field(p, check.field)) for p in candidates)
        name = (
            f"param:{check.tool}.{check.field} {check.op} {check.value!r}"
            if check.op != "nonempty"
            else (f"param:{check.tool}.{check.field} nonempty")
        )
        checks.append(Check(name=name, category="param_mismatch", passed=holds, detail=f"got {seen}"))
    failed = [
        c
        for c in run.calls
        if c.tool in case.expected_tools
        and c.error_kind in RUNTIME_FAILURES
        and not (case.expect_tool_errors and c.error_kind == "tool_error")
    ]
    checks.append(_no_calls_check("tools_ran", "tool_failed", failed))
    return checks


def _answer_checks(case: Case, run: AgentRun) -> list[Check]:
    answer = run.answer or ""
    checks = []
    for keyword in case.must_contain:
        name = "keyword:" + ("|".join(keyword) if isinstance(keyword, list) else keyword)
        checks.append(Check(name=name, category="missing_keyword", passed=keyword_present(answer, keyword)))
    for term in case.must_not_contain:
        checks.append(
            Check(name=f"forbidden:{term}", category="forbidden_term", passed=not forbidden_present(answer, term))
        )
    if case.ground_truth:
        attached = numbers_by_label(answer, [truth.label for truth in case.ground_truth])
        for truth in case.ground_truth:
            found = attached[truth.label]
            ok = any(abs(value - truth.value) <= truth.tolerance + 1e-9 for value in found)
            checks.append(
                Check(
                    name=f"number:{truth.label}",
                    category="numeric_mismatch",
                    passed=ok,
                    detail=f"expected {truth.value:g} +- {truth.tolerance:g}, found {found}",
                )
            )
    checks.append(
        Check(
            name="rounds",
            category="too_many_rounds",
            passed=run.rounds <= case.max_rounds,
            detail=f"{run.rounds} > {case.max_rounds}" if run.rounds > case.max_rounds else "",
        )
    )
    return checks


def _step_rounds(case: Case, run: AgentRun) -> list[int | None]:
    """The round of the first right call of each step (None: no right call), each after the step before."""
    rounds: list[int | None] = []
    after = 0
    for tool in case.expected_tools:
        checks = [c for c in case.param_checks if c.tool == tool]
        right = [
            c.round
            for c in run.calls
            if c.tool == tool and c.ok and c.round > after and all(param_check_holds(k, c.params) for k in checks)
        ]
        rounds.append(min(right) if right else None)
        after = rounds[-1] if rounds[-1] is not None else 10**9
    return rounds


def chain_score(case: Case, run: AgentRun, checks: list[Check], passed: bool) -> ChainScore:
    steps = [r is not None for r in _step_rounds(case, run)]
    answer = all(c.passed for c in checks if c.category in ("missing_keyword", "forbidden_term", "numeric_mismatch"))
    second = steps[1] if len(steps) > 1 else answer  # a one-call chain's second step is the answer's counting
    return ChainScore(first_step=steps[0], second_step=second, both=steps[0] and second, answer=answer, chain=passed)


def planning_metrics(case: Case, failing: set[str]) -> dict[str, bool | None]:
    """A scored case's tsa, pa, nta and opa (see `Score`) from the categories of its failing checks."""
    tsa = not (failing & SELECTION)
    if not case.expected_tools:
        return {"tsa": tsa, "pa": None, "nta": tsa, "opa": tsa}
    pa = (not (failing & PARAMS)) if tsa else None
    return {"tsa": tsa, "pa": pa, "nta": None, "opa": bool(tsa and pa)}


def score(case: Case, run: AgentRun) -> Score:
    if run.infra_error is not None:
        check = Check(name="infra", category="infra_error", passed=False, detail=run.infra_error)
        return Score(
            passed=None,
            category="infra_error",
            categories=["infra_error"],
            checks=[check],
            tsa=None,
            pa=None,
            nta=None,
            opa=None,
        )
    parse_ok = run.dialect not in ("empty", "unparsable")
    checks = [Check(name="parse", category="unparsable", passed=parse_ok, detail=run.parse_error or "")]
    checks += _tool_checks(case, run) + _answer_checks(case, run)
    failing = {check.category for check in checks if not check.passed}
    categories = [category for category in PRECEDENCE if category in failing]
    return Score(
        passed=not categories,
        category=categories[0] if categories else None,
        categories=categories,
        checks=checks,
        chain=chain_score(case, run, checks, not categories) if case.chain and case.expected_tools else None,
        **planning_metrics(case, failing),
    )
