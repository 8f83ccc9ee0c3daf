"""The errors GeoPilot raises on purpose. Entry points map GeoPilotInputError to exit code 2."""


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
