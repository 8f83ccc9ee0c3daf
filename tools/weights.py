"""Local-only weights: find a checkpoint, read it without running pickled code, load it strictly.

Resolution order (never a hub download): the explicit path from `configs/tools.yaml`, then
`$GEOPILOT_WEIGHTS_DIR/<backend>/[<file>]`, else `WeightsError("weights not found: put X at Y")`.
Reading: `.safetensors` through safetensors, anything else through `torch.load(weights_only=True)`, which refuses
pickles that would call code. Loading: keys are remapped, then compared with the module's own keys; any missing,
unexpected or mis-shaped key is listed in the error, and `load_state_dict(strict=True)` does the copy.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from geopilot.errors import GeoPilotInputError, WeightsError, first_line

if TYPE_CHECKING:  # torch is imported where it is used, so the tool registry builds without it
    import torch
    from torch import nn

WEIGHTS_DIR_ENV = "GEOPILOT_WEIGHTS_DIR"
CONTAINER_KEYS = ("state_dict", "model", "module")  # Lightning/mmengine, RemoteSAM, DeepSpeed wrappers
SHOWN_KEYS = 12  # how many offending keys an error lists before "... and N more"


def weights_root() -> Path | None:
    root = os.environ.get(WEIGHTS_DIR_ENV)
    return Path(root).expanduser() if root else None


def resolve_weights(backend: str, explicit: str | Path | None = None, filename: str | None = None) -> Path:
    """The local path of a backend's weights (a file when `filename` is given, else the backend's folder)."""
    if explicit is not None:
        path = Path(explicit).expanduser()
        if path.is_dir() and filename is not None and (path / filename).is_file():
            return path / filename
        if path.exists():
            return path
        raise WeightsError(
            f"weights not found: {path} does not exist (fix `weights:` for {backend!r} in the tools config)"
        )
    root = weights_root()
    relative = Path(backend) / filename if filename else Path(backend)
    if root is None:
        raise WeightsError(
            f"weights not found: put {relative} under the folder ${WEIGHTS_DIR_ENV} names (it is unset), "
            f"or set `weights:` for {backend!r} in the tools config"
        )
    path = root / relative
    if not path.exists():
        raise WeightsError(f"weights not found: put {relative} at {path}")
    return path


def _describe(keys: list[str]) -> str:
    shown = ", ".join(keys[:SHOWN_KEYS])
    return shown + (f" ... and {len(keys) - SHOWN_KEYS} more" if len(keys) > SHOWN_KEYS else "")


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a checkpoint file, unwrapped from the usual containers; refuses pickled code."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"weights not found: {path} is not a file")
    import torch

    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device="cpu")
        except Exception as err:  # noqa: BLE001 - safetensors raises its own error types
            raise WeightsError(f"{path}: not a readable safetensors file: {first_line(err)}") from None
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise WeightsError(
            f"{path}: refused: the checkpoint holds pickled objects beyond tensors (possibly code); "
            f"only weights are loaded ({first_line(err)})"
        ) from None
    except Exception as err:  # noqa: BLE001 - on garbage torch raises KeyError, ValueError, RuntimeError, EOFError, ...
        reason = first_line(err, empty="empty or truncated")
        raise WeightsError(f"{path}: not a readable checkpoint ({type(err).__name__}: {reason})") from None
    while isinstance(data, Mapping):
        inner = next((data[k] for k in CONTAINER_KEYS if isinstance(data.get(k), Mapping)), None)
        if inner is None:
            break
        data = inner
    if not isinstance(data, Mapping):
        raise WeightsError(f"{path}: expected a state dict (a mapping of names to tensors), got {type(data).__name__}")
    not_tensors = [str(k) for k, v in data.items() if not isinstance(v, torch.Tensor)]
    if not_tensors:
        raise WeightsError(f"{path}: entries that are not tensors: {_describe(not_tensors)}")
    return dict(data)


def remap_keys(state_dict: Mapping[str, torch.Tensor], remap: Callable[[str], str | None]) -> dict[str, torch.Tensor]:
    """Rename every key with `remap`; a key mapped to None is dropped on purpose (e.g. training-only buffers)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        new = remap(key)
        if new is None:
            continue
        if new in out:
            raise WeightsError(f"key map sends two checkpoint keys to {new!r} (one of them is {key!r})")
        out[new] = value
    return out


def load_strict(module: nn.Module, state_dict: Mapping[str, torch.Tensor], source: str = "checkpoint") -> None:
    """`module.load_state_dict(strict=True)` with an error that lists every mismatch by name."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    mis_shaped = sorted(
        f"{k} {tuple(state_dict[k].shape)} vs {tuple(expected[k].shape)}"
        for k in set(expected) & set(state_dict)
        if tuple(state_dict[k].shape) != tuple(expected[k].shape)
    )
    problems = []
    if missing:
        problems.append(f"missing keys ({len(missing)}): {_describe(missing)}")
    if unexpected:
        problems.append(f"unexpected keys ({len(unexpected)}): {_describe(unexpected)}")
    if mis_shaped:
        problems.append(f"shape mismatches ({len(mis_shaped)}): {_describe(mis_shaped)}")
    if problems:
        raise WeightsError(f"{source} does not match {type(module).__name__}: " + "; ".join(problems))
    module.load_state_dict(state_dict, strict=True)


def pick_device(device: str = "auto") -> torch.device:
    """`auto` -> CUDA when present, else CPU; anything else must be a device that is here (geopilot.device)."""
    from geopilot.device import resolve_device

    try:
        return resolve_device(device)
    except GeoPilotInputError as err:
        raise WeightsError(str(err)) from None


def float_dtypes(state_dict: Mapping[str, torch.Tensor]) -> set[str]:
    """The floating-point dtypes a checkpoint stores its tensors in, e.g. {"float16"}."""
    return {str(v.dtype).removeprefix("torch.") for v in state_dict.values() if v.is_floating_point()}


def run_precision(device: torch.device, precision: str) -> str:
    """What a module placed on `device` runs in: the configured precision on CUDA, fp32 on CPU (fp16 is slow there)."""
    return precision if device.type == "cuda" else "fp32"


def to_precision(module: nn.Module, precision: str, fp32_parts: tuple[str, ...] = ()) -> nn.Module:
    """`module` in fp16 or fp32 (on whatever device it is), its `fp32_parts` submodules kept float32."""
    import torch

    module = module.to(torch.float16 if precision == "fp16" else torch.float32)
    for name in fp32_parts:
        module.get_submodule(name).float()
    return module


def place(
    module: nn.Module,
    device: torch.device,
    precision: str = "fp32",
    fp32_parts: tuple[str, ...] = (),
    stored: set[str] | None = None,
    source: str = "checkpoint",
) -> nn.Module:
    """Move to `device` in eval mode, in `run_precision(device, precision)`; the `fp32_parts` submodules stay float32.
    `stored` (the checkpoint's dtypes, `float_dtypes`): weights stored in another dtype are converted, with a note."""
    from geopilot.tools.precision import note_checkpoint_dtypes

    effective = run_precision(device, precision)
    module = to_precision(module.to(device).eval(), effective, fp32_parts)
    if stored:
        note_checkpoint_dtypes(source, stored, effective)
    return module


def load_checkpoint(
    module: nn.Module,
    checkpoint: Path,
    load_state: Callable[..., None],
    device: torch.device,
    precision: str = "fp32",
    fp32_parts: tuple[str, ...] = (),
) -> nn.Module:
    """Read `checkpoint`, load it with the backend's `load_state(module, state, source=...)`, then `place` the module
    (the checkpoint's own dtypes noted)."""
    state = read_state_dict(checkpoint)
    load_state(module, state, source=str(checkpoint))
    return place(module, device, precision, fp32_parts, float_dtypes(state), str(checkpoint))
