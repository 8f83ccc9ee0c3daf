"""Modality when the caller does not say: inferred from the pixels (geopilot/image.py rule 4) and reported, never
used to reject a tool the model chose; a declared modality still gates every call."""

from __future__ import annotations

import io

import numpy as np
import pytest
from helpers.scripted import answer, plan
from PIL import Image

from geopilot.image import infer_modality, load_image

RNG = np.random.default_rng(0)
SPECKLE = RNG.gamma(1.0, 3000.0, (40, 48)).clip(0, 65535).astype(np.uint16)  # 16-bit SAR amplitude


def _png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def _jpeg_grey_as_rgb() -> bytes:
    grey = (SPECKLE / 256).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(np.repeat(grey[:, :, None], 3, axis=2)).save(buffer, format="JPEG", quality=80)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (_png(SPECKLE), "sar"),  # one band, 16-bit (PIL mode I;16)
        (SPECKLE, "sar"),
        (np.stack([SPECKLE, SPECKLE // 3], axis=2), "sar"),  # dual-pol: two bands
        ((SPECKLE / 256).astype(np.uint8), "sar"),  # one band, 8-bit
        (_jpeg_grey_as_rgb(), "sar"),  # grey stored as RGB, as SSDD/HRSID ship their SAR chips
        (RNG.integers(0, 255, (40, 48, 3), dtype=np.uint8), "optical"),
        (RNG.integers(0, 4000, (40, 48, 4), dtype=np.uint16), "optical"),  # 16-bit multispectral: colour decides
    ],
    ids=["png-16bit", "array-16bit", "dual-pol", "grey-8bit", "jpeg-grey-rgb", "rgb", "multispectral-16bit"],
)
def test_the_documented_rule(source, expected):
    loaded = load_image(source)
    assert infer_modality(loaded) == expected
    assert infer_modality(loaded.image) == expected


def test_an_undeclared_sar_image_gets_its_sar_tool(make_pilot):
    pilot, scripts = make_pilot([plan(("sar_detect_all", {})), answer("One ship.")])
    result = pilot.chat(_png(SPECKLE), "Any ships?")
    assert scripts.fed[0] and "wrong_modality" not in scripts.fed[0][0]
    assert (result.outcome, result.repaired, result.error) == ("tools", False, None)
    assert result.tool_calls[0].output.detections[0].label == "ship"
    assert (result.modality, result.modality_source) == ("sar", "inferred")


def test_undeclared_modality_never_vetoes_the_model(make_pilot, image):
    """Inference is reported, not enforced: a grey optical (panchromatic) image may read as SAR, and its optical
    tool must still run; a colour image's SAR call runs too (the model's choice stands)."""
    pilot, _ = make_pilot(
        [plan(("detect_objects", {"categories": ["plane"]})), answer("1 plane.")],
        [plan(("sar_detect_all", {})), answer("1 ship.")],
    )
    grey, colour = pilot.chat_batch(
        [{"image": (SPECKLE / 256).astype(np.uint8), "query": "Planes?"}, {"image": image, "query": "Ships?"}]
    )
    assert (grey.modality, grey.outcome, grey.tool_calls[0].error) == ("sar", "tools", None)
    assert (colour.modality, colour.outcome, colour.tool_calls[0].error) == ("optical", "tools", None)
    assert grey.modality_source == colour.modality_source == "inferred"


def test_a_declared_modality_gates_even_against_the_pixels(make_pilot):
    pilot, scripts = make_pilot([plan(("sar_detect_all", {})), answer("No SAR tool on optical data.")])
    result = pilot.chat(_png(SPECKLE), "Any ships?", modality="optical")
    assert "wrong_modality" in scripts.fed[0][0] and result.repaired
    assert (result.modality, result.modality_source) == ("optical", "declared")
