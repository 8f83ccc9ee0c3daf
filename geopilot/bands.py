"""Which bands of an image make the picture GeoPilot shows: one place, one order of rules.

1. Explicit band numbers (1-based; three for R, G, B or one shown grey): `chat(..., bands=[4, 3, 2])`, `--bands 4,3,2`,
   `bands:` in configs/tools.yaml, the API's `geopilot.bands`. Out of range is an `ImageInputError`.
2. The GeoTIFF's colour interpretation: bands tagged red, green and blue.
3. Band names (descriptions, or the `BANDNAME` / `POLARISATION` tags) of known sensors:
   Sentinel-2 `B04/B03/B02` (also `B4/B3/B2` from GDAL's SAFE driver and Earth Engine, `"B4, central wavelength 665 nm"`,
   `S2_B04`, `B04_10m`, `TCI_R/G/B`), Landsat 8/9 `SR_B4/SR_B3/SR_B2`, and the common names `red/green/blue`.
   `B4/B3/B2` is red/green/blue for both Sentinel-2 and Landsat 8/9 (Landsat 4-7 differ: give their bands explicitly).
   SAR: polarisations `VV/VH` (or `HH/HV`) by name: the co-polarised band (VV, else HH) is shown grey, so the picture
   stays colourless like every other SAR image the model was trained on (a VV/VH/ratio false colour would read as
   optical). The band names also say the modality (SAR for polarisations, optical for a known optical sensor).
4. Otherwise: one band as is, two bands the first, three or more the first three, with a note saying it is a guess.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from geopilot.errors import ImageInputError

RED_NAMES = {"B04", "B4", "SR_B4", "RED", "TCI_R"}
GREEN_NAMES = {"B03", "B3", "SR_B3", "GREEN", "TCI_G"}
BLUE_NAMES = {"B02", "B2", "SR_B2", "BLUE", "TCI_B"}
CO_POLARISATIONS = ("VV", "HH")  # shown, in this order of preference
POLARISATIONS = {"VV", "VH", "HH", "HV"}
_PREFIXES = ("S2_", "SENTINEL2_", "L8_", "L9_")  # stack exporters prefix band names with the sensor
_RESOLUTION_SUFFIX = re.compile(r"_(10|20|60)M$")  # SAFE L2A file stems: B02_10m


@dataclass(frozen=True)
class BandChoice:
    """The bands shown as the picture (1-based; one number = shown grey), why, and what the band names say."""

    bands: tuple[int, ...]
    reason: str
    modality: str | None = None  # "sar" / "optical" when the band names say so; None: decided from the pixels
    note: str | None = None  # set when the choice is a guess: said in the result


def band_name(description: str | None, tags: dict[str, str] | None = None) -> str | None:
    """A band's name, normalised: the tags' BANDNAME or POLARISATION, else the description's first word
    ("B4, central wavelength 665 nm" -> "B4"), upper case, without a sensor prefix or a resolution suffix."""
    tags = tags or {}
    text = tags.get("BANDNAME") or tags.get("POLARISATION") or description
    if not text or not text.strip():
        return None
    name = re.split(r"[,\s(]", text.strip().upper(), maxsplit=1)[0]
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return _RESOLUTION_SUFFIX.sub("", name) or None


def parse_bands(text: str) -> list[int]:
    """`"4,3,2"` -> [4, 3, 2] (the CLI's `--bands`); a ValueError names what is wrong."""
    try:
        bands = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"bands must be comma-separated band numbers like 4,3,2, got {text!r}") from None
    check_band_list(bands)
    return bands


def check_band_list(bands: Sequence[int]) -> None:
    """Three band numbers (R, G, B) or one (grey), each >= 1; the image's band count is checked by `choose_bands`."""
    if isinstance(bands, (str, bytes)) or not all(isinstance(b, int) and not isinstance(b, bool) for b in bands):
        raise ImageInputError(f"bands must be a list of band numbers like [4, 3, 2], got {bands!r}")
    if len(bands) not in (1, 3):
        raise ImageInputError(f"bands: give 3 band numbers (red, green, blue) or 1 (grey), got {len(bands)}")
    if any(b < 1 for b in bands):
        raise ImageInputError(f"bands are numbered from 1, got {','.join(map(str, bands))}")


def choose_bands(
    count: int,
    explicit: Sequence[int] | None = None,
    colorinterp: Sequence[str] = (),
    names: Sequence[str | None] = (),
    name: str = "image",
) -> BandChoice:
    """The bands to show for an image of `count` bands (rules 1-4 of the module docstring). `colorinterp` are the
    bands' colour interpretations in lower case (rasterio's ColorInterp names), `names` the `band_name`s."""
    if explicit is not None:
        check_band_list(explicit)
        outside = [b for b in explicit if b > count]
        if outside:
            raise ImageInputError(
                f"{name}: bands {','.join(map(str, explicit))}: band {outside[0]} is out of range; "
                f"the image has {count} band{'s' if count != 1 else ''} (1-{count})"
            )
        return BandChoice(tuple(explicit), "explicit")
    by_colour = [_first(colorinterp, colour) for colour in ("red", "green", "blue")]
    if all(by_colour):
        return BandChoice(tuple(by_colour), "colour interpretation")
    upper = [n.upper() if n else None for n in names]
    by_name = [_first_in(upper, group) for group in (RED_NAMES, GREEN_NAMES, BLUE_NAMES)]
    if all(by_name):
        shown = "/".join(upper[b - 1] for b in by_name)
        return BandChoice(tuple(by_name), f"band names {shown} ({_sensor(upper)})", "optical")
    polarised = [n for n in upper if n in POLARISATIONS]
    for co_pol in CO_POLARISATIONS:
        if co_pol in upper and len(polarised) >= 2:
            shown = upper.index(co_pol) + 1
            return BandChoice((shown,), f"dual-pol SAR ({'/'.join(polarised)}): {co_pol} shown", "sar")
    if count == 1:
        return BandChoice((1,), "single band")
    if count == 2:
        return BandChoice((1,), "two bands: the first shown", note=f"{name}: 2 bands without names: band 1 shown")
    return BandChoice(
        (1, 2, 3),
        "first three bands",
        note=f"{name}: {count} bands without colour interpretation or known band names: bands 1,2,3 shown as RGB "
        "(pass bands=[r, g, b] to choose)",
    )


def _first(values: Sequence[str | None], wanted: str) -> int | None:
    return next((i + 1 for i, value in enumerate(values) if value == wanted), None)


def _first_in(values: Sequence[str | None], group: set[str]) -> int | None:
    return next((i + 1 for i, value in enumerate(values) if value in group), None)


def _sensor(names: Sequence[str | None]) -> str:
    if any(n and n.startswith("SR_") for n in names):
        return "Landsat 8/9"
    if any(n in ("B8A", "B02", "B03", "B04", "TCI_R") for n in names):
        return "Sentinel-2"
    if any(n in ("B2", "B3", "B4") for n in names):
        return "Sentinel-2 or Landsat 8/9"
    return "common names"
