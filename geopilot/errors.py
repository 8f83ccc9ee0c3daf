"""The errors GeoPilot raises on purpose, and the one way a pydantic error becomes a one-line message.

Entry points map GeoPilotInputError to exit code 2.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError

UNKNOWN_KEY = "unknown key (misspelt?)"
ECHO_CHARS = 200  # the most of a user's input an error message repeats
PROBLEMS_SHOWN = 10  # a message lists this many problems of a pydantic error, then "... and N more"


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


class ImageTooLargeError(ImageInputError):
    """An image over a size limit (pixels, or the square the model pads it to): the API answers 413."""


class ConfigError(GeoPilotInputError):
    """A config file or override that does not fit its typed schema."""


class WeightsError(GeoPilotInputError):
    """Weights that are missing, unsafe (pickled code) or do not match the architecture."""


def echo(value: object, limit: int = ECHO_CHARS) -> str:
    """`repr(value)` for an error message, clipped like any echoed input."""
    return clipped(repr(value), limit)


def one_line(err: BaseException, limit: int = 2000) -> str:
    """An error's whole message on one line (a library's page joined), cut at `limit` characters."""
    text = " ".join(str(err).strip().splitlines()) or type(err).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def first_line(err: BaseException, empty: str | None = None) -> str:
    """The first line of an exception's message (libraries raise pages), or `empty` / its type name when blank."""
    text = str(err).strip()
    return text.splitlines()[0] if text else (empty or type(err).__name__)


def clipped(text: str, limit: int = ECHO_CHARS) -> str:
    """`text` (the user's input an error message repeats: a name, a key, a repr) cut to its first `limit`
    characters and its length, so a 5 MB name never comes back whole."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def validation_problems(
    err: ValidationError, unknown_key: str = UNKNOWN_KEY, under: str = "", union_tags: Collection[str] = ()
) -> list[tuple[str, str]]:
    """Each problem of a pydantic error as (dotted key, message): what `describe_validation_error` joins, for a caller
    that also reports the first key on its own (a `SampleError`'s `field`).

    An extra (forbidden) key reads `unknown_key`; pydantic's "Value error, " prefix (a validator's own message) is
    dropped. `under` is the key the validated data sits under (`requests.3`), put before every key. `union_tags` are
    the tags of a discriminated union (`user`, `assistant`, `tool`): pydantic names the member it tried right after the
    item's index (`messages.2.assistant.actions`); that tag is left out, so the key reads as the input spells it."""
    problems = []
    for problem in err.errors():
        loc = list(problem["loc"])
        tag = next((i for i in range(1, len(loc)) if loc[i] in union_tags and isinstance(loc[i - 1], int)), None)
        if tag is not None:
            del loc[tag]
        key = clipped(".".join(str(part) for part in ([under] if under else []) + loc))  # a key is input too
        message = unknown_key if problem["type"] == "extra_forbidden" else problem["msg"].removeprefix("Value error, ")
        problems.append((key, message))
    return problems


def describe_validation_error(
    err: ValidationError,
    source: str | None = None,
    unknown_key: str = UNKNOWN_KEY,
    under: str = "",
    union_tags: Collection[str] = (),
) -> str:
    """Every problem of a pydantic error on one line, each naming its dotted key: `source: train.lr: Input should be
    a valid number; data.replay_alpha: ...` (the keys and messages of `validation_problems`). The config loader, tool params,
    tool options, data_gen replies, chat requests and histories, case files and plans all use this."""
    problems = validation_problems(err, unknown_key, under, union_tags)
    text = "; ".join(f"{key}: {message}" if key else message for key, message in problems[:PROBLEMS_SHOWN])
    if len(problems) > PROBLEMS_SHOWN:  # 10,000 bad boxes are one line, not a page
        text += f"; ... and {len(problems) - PROBLEMS_SHOWN:,} more"
    return f"{source}: {text}" if source else text
