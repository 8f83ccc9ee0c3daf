"""geopilot/errors.py: a pydantic error becomes one line naming each key."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from geopilot.errors import describe_validation_error


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


def test_a_pydantic_error_is_one_line_naming_each_key():
    err = _error({"lr": "fast", "name": "long", "colour": 1})
    line = describe_validation_error(err, "train.yaml")
    assert line == (
        "train.yaml: lr: Input should be a valid number, unable to parse string as a number; "
        "name: name is longer than 3 characters; colour: unknown key (misspelt?)"
    )
    assert "\n" not in line and "Value error" not in line
    assert describe_validation_error(err, unknown_key="unexpected parameter").endswith("colour: unexpected parameter")
