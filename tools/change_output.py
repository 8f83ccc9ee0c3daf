"""A change mask -> the canonical output of `detect_changes` (docs/design.md §4), in the shape h46b's change tool
returns (/work/wt/CONTRACT_46.md): one detection per 8-connected region of changed pixels, largest first (box,
pixel box, its own RLE mask, its area), one `change` segment holding the whole mask, and
`data = {changed_fraction, changed_objects}` that the model reads verbatim.

The trace generator builds its `detect_changes` turns here from a LEVIR-CD label, so what training shows is what the
tool returns; when the change tool's own builder is on main this module gives way to it (one import).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from geopilot.tool_output import Artifact, Detection, ToolOutput
from geopilot.tools.canonical import encode_mask, pixel_box, segment_class

CHANGE_LABEL = "change"
FRACTION_DECIMALS = 6
EIGHT_CONNECTED = np.ones((3, 3), dtype=bool)  # diagonal neighbours join a region (a building's corner pixels)


def change_output(
    mask: np.ndarray,
    *,
    label: str = CHANGE_LABEL,
    artifacts: list[Artifact] | None = None,
    provenance: Literal["model", "annotations"] = "model",
) -> ToolOutput:
    """Boolean (H, W) change mask -> ToolOutput; `artifacts` are the files written from it (the mask as a PNG)."""
    from scipy import ndimage  # the `tools` extra

    mask = np.asarray(mask, dtype=bool)
    if mask.ndim != 2 or mask.size == 0:
        raise ValueError(f"a change mask is one (height, width) plane, got shape {mask.shape}")
    height, width = mask.shape
    regions, count = ndimage.label(mask, structure=EIGHT_CONNECTED)
    sizes = np.bincount(regions.ravel(), minlength=count + 1)
    found = ndimage.find_objects(regions)
    detections = []
    for index in sorted(range(1, count + 1), key=lambda i: (-int(sizes[i]), i)):
        rows, cols = found[index - 1]
        box = (cols.start, rows.start, cols.stop, rows.stop)
        detections.append(
            Detection(
                label=label,
                box=pixel_box(box, width, height),
                mask=encode_mask(regions == index),
                area=round(int(sizes[index]) / mask.size, FRACTION_DECIMALS),
                pixel_box=tuple(float(v) for v in box),
            )
        )
    return ToolOutput(
        provenance=provenance,
        detections=detections,
        segments=[segment_class(CHANGE_LABEL, mask)] if count else [],
        artifacts=list(artifacts or []),
        data={"changed_fraction": round(float(mask.mean()), FRACTION_DECIMALS), "changed_objects": count},
    )


def label_mask(pixels: np.ndarray) -> np.ndarray:
    """A change label as datasets store it (LEVIR-CD 0 / 255, copies with 0 / 1; one band or three equal) -> bool."""
    pixels = np.asarray(pixels)
    if pixels.ndim == 3:
        pixels = pixels.max(axis=2)
    return pixels > 0
