"""The errors GeoPilot raises on purpose, and the one way a pydantic error becomes a one-line message.

Entry points map GeoPilotInputError to exit code 2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError

UNKNOWN_KEY = "unknown key (misspelt?)"


class GeoPilotError(Exception):
    """Base class: something GeoPilot detected and can explain in one line."""


class GeoPilotInputError(GeoPilotError, ValueError):
    """Bad input from the user: a file, a sample, a config value, a CLI argument. Says what to fix."""


class SampleError(GeoPilotInputError):
    """A sample that fails validation or cannot be rendered; names the sample id, line and field."""

    def __init__(
        self, message: str, *, sample_id: str | None = None, line: int | None = None, field: str | None = None
    ):
        self.sample_id, self.line, self.field = sample_id, line, field
        where = ", ".join(
            part
            for part in (
                f"sample {sample_id!r}" if sample_id else "",
                f"line {line}" if line is not None else "",
                f"field {field!r}" if field else "",
            )
            if part
        )
        super().__init__(f"{where}: {message}" if where else message)


class ImageInputError(GeoPilotInputError):
    """An image that cannot be used: missing, not an image, corrupt, truncated or too large."""


class ConfigError(GeoPilotInputError):
    """A config file or override that does not fit its typed schema."""


class WeightsError(GeoPilotInputError):
    """Weights that are missing, unsafe (pickled code) or do not match the architecture."""


def describe_validation_error(err: ValidationError, source: str | None = None, unknown_key: str = UNKNOWN_KEY) -> str:
    """Every problem of a pydantic error on one line, each naming its dotted key: `source: train.lr: Input should be
    a valid number; data.alpha: ...`. An extra (forbidden) key reads `unknown_key`; pydantic's "Value error, " prefix
    (a validator's own message) is dropped. The config loader, tool params and data_gen replies all use this."""
    parts = []
    for problem in err.errors():
        key = ".".join(str(part) for part in problem["loc"])
        message = unknown_key if problem["type"] == "extra_forbidden" else problem["msg"].removeprefix("Value error, ")
        parts.append(f"{key}: {message}" if key else message)
    text = "; ".join(parts)
    return f"{source}: {text}" if source else text
