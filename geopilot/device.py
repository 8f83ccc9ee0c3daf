"""The one reading of a device name (`--device`, `device=`): "auto", "cpu", "cuda", "cuda:1", "mps".

A name torch does not know, or a device this machine does not have, is a one-line `GeoPilotInputError` (exit 2 on
the CLI) before any weights are read, not a CUDA-driver traceback from deep inside a `.to(device)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from geopilot.errors import GeoPilotInputError, first_line

if TYPE_CHECKING:
    import torch


def resolve_device(name: str = "auto") -> torch.device:
    """`auto` -> CUDA when present, else CPU; anything else must name a device that is here."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as err:
        first = first_line(err)
        raise GeoPilotInputError(f"unknown device {name!r} (use auto, cpu, cuda, cuda:N or mps): {first}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise GeoPilotInputError(f"device {name!r} was asked for, but CUDA is not available here; use cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise GeoPilotInputError(f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise GeoPilotInputError(f"device {name!r} was asked for, but MPS is not available here; use cpu")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise GeoPilotInputError(f"device {name!r} is not supported (use auto, cpu, cuda, cuda:N or mps)")
    return device
