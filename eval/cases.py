"""The benchmark case format (docs/eval_planning.md): one JSON object per line, validated with pydantic on load.

    {"id", "query", "image", "modality", "category", "difficulty", "expected_tools": [names in order; [] = no tool],
     "param_checks": [{"tool", "field", "op", "value"}], "must_contain": [], "must_not_contain": [],
     "ground_truth": [{"label", "value", "tolerance"}], "max_rounds"}

`image` is relative to the folder of the case file (or absolute); a case about several images (a before / after
pair) names them in order in `images` instead. The last four check lists are optional (empty
by default); everything else is required. A bad line is rejected with its line number, case id and field.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from geopilot.errors import GeoPilotInputError, describe_validation_error
from geopilot.fileio import iter_jsonl, regular_file

Difficulty = Literal["easy", "medium", "hard"]
DIFFICULTIES: tuple[str, ...] = ("easy", "medium", "hard")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ParamCheck(_Strict):
    """A predicate on one parameter of the calls to `tool` (dotted `field`); passes when some call satisfies it.

    contains: a list parameter has an item equal to `value`, or a text parameter contains `value` as whole words;
    equals: equal to `value` (lists as sets); any_of: like contains, for any of the alternatives in `value`;
    nonempty: present and not empty. Text is compared normalised (case, accents, hyphens, plural "s")."""

    tool: str = Field(min_length=1)
    field: str = Field(min_length=1)
    op: Literal["contains", "equals", "any_of", "nonempty"]
    value: Any = None

    @model_validator(mode="after")
    def _value_fits_op(self) -> ParamCheck:
        if self.op == "any_of" and (not isinstance(self.value, list) or not self.value):
            raise ValueError("op 'any_of' needs a non-empty list as value")
        if self.op in ("contains", "equals") and self.value is None:
            raise ValueError(f"op {self.op!r} needs a value")
        return self


class GroundTruth(_Strict):
    """A number the answer must state near `label`, within +- `tolerance` (absolute, in the answer's unit)."""

    label: str = Field(min_length=1)
    value: float
    tolerance: float = Field(0.0, ge=0)


class HistoryTurn(_Strict):
    """An earlier exchange the agent is shown before the query (memory / multi-turn cases)."""

    role: Literal["user", "assistant"]
    content: str = Field(min_length=1)


class ReferenceCall(_Strict):
    """A call a correct agent makes; the scripted reference agent (geopilot.eval.reference_agent) replays them."""

    tool: str = Field(min_length=1)
    params: dict[str, Any] = {}
    round: int = Field(1, ge=1)  # the tool round it runs in (a chain's later step reads an earlier round's result)


class Case(_Strict):
    id: str = Field(min_length=1)
    query: str = Field(min_length=1)
    image: str | None  # relative to the case file's folder; null for a text-only case
    images: list[str] | None = Field(default=None, min_length=2)  # several, in order (before, after); never with image
    modality: Literal["optical", "sar"] | None  # None: a case whose tools read no image (indicator rasters)
    category: str = Field(min_length=1)
    difficulty: Difficulty
    expected_tools: list[str]  # in order; [] = answer without any tool
    param_checks: list[ParamCheck] = []
    must_contain: list[str | list[str]] = []  # a keyword, or a list = any-of synonym group
    must_not_contain: list[str] = []
    ground_truth: list[GroundTruth] = []
    max_rounds: int = Field(ge=0)
    history: list[HistoryTurn] = []  # shown before the query, oldest first
    reference_calls: list[ReferenceCall] = []
    expect_tool_errors: bool = False  # the expected tools are meant to fail (an area that does not exist)
    chain: bool = False  # a multi-step chain: expected_tools are its steps in order, scored step by step too

    @model_validator(mode="after")
    def _checks_name_expected_tools(self) -> Case:
        if self.image is not None and self.images is not None:
            raise ValueError("images: a case has either `image` (one) or `images` (several), not both")
        stray = sorted({check.tool for check in self.param_checks} - set(self.expected_tools))
        if stray:
            raise ValueError(f"param_checks name tools that are not in expected_tools: {stray}")
        if len(self.expected_tools) > 0 and self.max_rounds < 1:
            raise ValueError("a case that expects tools needs max_rounds >= 1")
        return self


class CaseSet(BaseModel):
    """The cases of one file, with where it is (images resolve against its folder) and its content hash."""

    model_config = ConfigDict(frozen=True)

    path: Path
    sha256: str
    cases: list[Case]

    def image_path(self, case: Case) -> Path | None:
        """The case's one image (a several-image case answers with its first: `image_paths` has them all)."""
        paths = self.image_paths(case)
        return paths[0] if paths else None

    def image_paths(self, case: Case) -> list[Path]:
        names = case.images if case.images is not None else [] if case.image is None else [case.image]
        return [Path(n) if Path(n).is_absolute() else self.path.parent / n for n in names]

    def by_id(self) -> dict[str, Case]:
        return {case.id: case for case in self.cases}


def file_sha256(path: str | Path) -> str:
    regular_file(path, "case file")  # a FIFO would hang the hash
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_case_file(out: Path, cases: list[dict], version: str, count_by: tuple[str, ...]) -> dict:
    """Write `cases` as JSONL to `out`; return the frozen set's manifest (version, file, sha256, counts by key)."""
    out.write_text("".join(json.dumps(c, ensure_ascii=False) + "\n" for c in cases), encoding="utf-8")
    counts = {f"by_{key}": dict(Counter(c[key] for c in cases)) for key in count_by}
    return {"version": version, "file": out.name, "sha256": file_sha256(out), "cases": len(cases), **counts}


def load_cases(path: str | Path, check_images: bool = True) -> CaseSet:
    """Read and validate a case file; raises GeoPilotInputError naming the line, the case id and the field."""
    path = Path(path)
    if not path.is_file():
        raise GeoPilotInputError(f"case file {str(path)!r} does not exist")
    cases: list[Case] = []
    seen: dict[str, int] = {}
    for number, raw in iter_jsonl(path):
        where = f"{path.name} line {number}"
        case_id = raw.get("id")
        if case_id is not None:
            where += f", case {case_id!r}"
        try:
            case = Case.model_validate(raw)
        except ValidationError as err:
            raise GeoPilotInputError(describe_validation_error(err, where)) from None
        if case.id in seen:
            raise GeoPilotInputError(f"{where}: duplicate id (first on line {seen[case.id]})")
        seen[case.id] = number
        cases.append(case)
    if not cases:
        raise GeoPilotInputError(f"case file {str(path)!r} holds no cases")
    case_set = CaseSet(path=path.resolve(), sha256=file_sha256(path), cases=cases)
    if check_images:
        for case in cases:
            for image in case_set.image_paths(case):
                if not image.is_file():
                    raise GeoPilotInputError(f"{path.name}, case {case.id!r}: image {str(image)!r} does not exist")
    return case_set
