"""One home per concept (issue 10, item 9): the modality type, the annotation records, the pydantic-error line,
the atomic write. Each test fails if a second definition or a private copy comes back."""

from __future__ import annotations

import importlib
import importlib.util

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from geopilot.errors import describe_validation_error


def test_modality_has_one_definition():
    import geopilot.records
    import geopilot.sample
    import geopilot.tool_protocol
    import geopilot.tools.tasks

    assert geopilot.records.Modality is geopilot.sample.Modality
    assert geopilot.tool_protocol.Modality is geopilot.sample.Modality
    assert geopilot.tools.tasks.Modality is geopilot.sample.Modality


def test_annotation_records_live_in_the_core():
    records = importlib.import_module("geopilot.records")
    assert {"AnnotationRecord", "ObjectAnnotation", "ReadReport"} <= set(vars(records))
    assert importlib.util.find_spec("geopilot.data_gen.records") is None
    from geopilot.tools import annotations

    assert annotations.AnnotationRecord is records.AnnotationRecord


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lr: float
    name: str = "x"

    @field_validator("name")
    @classmethod
    def _short(cls, value: str) -> str:
        if len(value) > 3:
            raise ValueError("name is longer than 3 characters")
        return value


def _error(data: dict) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        _Params.model_validate(data)
    return caught.value


def test_one_line_pydantic_error_everywhere():
    err = _error({"lr": "fast", "name": "long", "colour": 1})
    line = describe_validation_error(err, "train.yaml")
    assert line == (
        "train.yaml: lr: Input should be a valid number, unable to parse string as a number; "
        "name: name is longer than 3 characters; colour: unknown key (misspelt?)"
    )
    assert "\n" not in line and "Value error" not in line
    assert describe_validation_error(err, unknown_key="unexpected parameter").endswith("colour: unexpected parameter")
    import geopilot.config
    import geopilot.tool_protocol

    assert geopilot.config.describe_validation_error is describe_validation_error
    assert not hasattr(geopilot.tool_protocol, "describe_params_error")


def test_one_atomic_write(tmp_path, monkeypatch):
    from geopilot import fileio
    from geopilot.data_gen import generate, llm, report
    from geopilot.training import checkpoint

    for module in (generate, llm, report, checkpoint):
        assert module.atomic_write is fileio.atomic_write, module.__name__
    target = tmp_path / "state.json"
    fileio.atomic_write(target, "old")
    monkeypatch.setattr(fileio.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        fileio.atomic_write(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temp file left behind
