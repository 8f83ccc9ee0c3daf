"""Each backend's numeric precision: what upstream evaluates in, our default, and whether fp16 is allowed (torch-free).

Every upstream but SegEarth-OV evaluates in float32; SegEarth-OV's runs CLIP and its upsampler in float16
(`segearth_segmentor.py` L48 `create_model(..., precision='fp16')`, L157 `.half()`, L184-185 autocast, L292
`inputs.half()`). Every backend defaults to fp32: for SegEarth-OV the test below shows fp16 gives fp32's label maps,
and CPU runs fp32 in any case. fp16 (CUDA only: CPU always runs fp32) is
allowed only where `tests/tools/test_precision.py` shows it returns the same outputs as fp32 on fixed inputs with
random weights, within the tolerance of `benchmarks/specialists_check.py`; elsewhere it is refused with one line
naming the setting. Numerically fragile parts stay fp32 whatever the rest runs in (`fp32_parts`, the submodules
`weights.place` keeps in float32). docs/tools.md has the measured differences.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator

Precision = Literal["fp32", "fp16"]
LOG = logging.getLogger("geopilot.tools")


@dataclass(frozen=True)
class BackendPrecision:
    upstream: Precision  # what upstream's published evaluation runs in
    default: Precision
    fp16_allowed: bool
    why: str  # one line: why fp16 is refused, or what it changes
    fp32_parts: tuple[str, ...] = ()  # submodules that stay float32 in any precision


PRECISIONS: dict[str, BackendPrecision] = {
    "lae_dino": BackendPrecision(
        "fp32", "fp32", True, "fp16 found the same boxes within 0.001; near-tied scores (< 1e-4 apart) may swap order"
    ),
    "segearth_ov": BackendPrecision("fp16", "fp32", True, "fp16 (upstream's) gave fp32's masks on the fixed inputs"),
    "remotesam": BackendPrecision(
        "fp32", "fp32", True, "fp16 gave the same masks (probabilities within 0.01); the EPOC contour model stays fp32"
    ),
    "denodet": BackendPrecision(
        "fp32",
        "fp32",
        False,
        "fp16 changes which boxes survive (55 vs 56 on a fixed input) even with the DCT gate in fp32",
        fp32_parts=("neck.trans_deno",),  # the gate's 1e-15 is 0 in fp16; the DCT sums 4096 products
    ),
    "sam_road": BackendPrecision(
        "fp32",
        "fp32",
        False,
        "the graph hinges on exact 8-bit scores: fp16 changed 0.6 % of them and gave 42 vs 45 nodes on a fixed input",
        fp32_parts=("map_decoder",),  # score maps before NMS
    ),
    "spa_gan": BackendPrecision("fp32", "fp32", True, "fp16 moved restored pixels by at most 1 of 255"),
    "bit_cd": BackendPrecision(
        "fp32", "fp32", False, "the mask is an argmax of two logits; fp16 is not yet shown to give fp32's masks"
    ),
}


def check_precision(backend: str, precision: Precision) -> Precision:
    """The precision if the backend allows it; else ValueError, one line naming the `precision` setting."""
    if precision not in ("fp32", "fp16"):
        raise ValueError(f"unknown precision {precision!r}; use fp32 or fp16")
    policy = PRECISIONS[backend]
    if precision == "fp16" and not policy.fp16_allowed:
        raise ValueError(f"fp16 is refused for {backend} (docs/tools.md: fp32 required; {policy.why}); use fp32")
    return precision


def precision_setting(backend: str):
    """The type of a backend options model's `precision` field: fp32 | fp16, fp16 only where allowed."""
    return Annotated[Precision, AfterValidator(lambda value: check_precision(backend, value))]


def note_checkpoint_dtypes(source: str, dtypes: set[str], precision: Precision) -> str | None:
    """A checkpoint stored in another float dtype than the run's is converted on load; say so (a note, logged)."""
    wanted = {"fp32": "float32", "fp16": "float16"}[precision]
    other = sorted(d for d in dtypes if d != wanted)
    if not other:
        return None
    note = f"{source}: weights stored as {', '.join(other)} are converted to {wanted} (precision: {precision})"
    LOG.warning(note)
    return note
