"""Administrative areas from GeoPackage/GeoJSON (read with pyogrio), looked up by name without guessing.

A name matches when it equals the area's name ignoring case, accents and repeated spaces ("Añora" == "anora");
an id matches exactly. A name that matches nothing is an error listing the closest names (whole names, or runs of
their words: "Anora" is close to "Añora de Ríos"), never a silent pick.
"""

from __future__ import annotations

import difflib
import unicodedata
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import shapely
from shapely.geometry.base import BaseGeometry

from geopilot.errors import GeoPilotInputError
from geopilot.tools.indicators.catalog import AreaSource, Catalog

CLOSEST = 3  # names an unknown-name error lists


class AreaNotFound(GeoPilotInputError):
    """No area of that name (or id) at that level."""


def normalise_name(name: str) -> str:
    decomposed = unicodedata.normalize("NFKD", name)
    plain = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    return " ".join(plain.casefold().split())


def likeness(query: str, name: str) -> float:
    """0..1: how close a query is to an area name, both normalised: to the whole name, or to a run of as many of its
    words as the query has (a partial name is close to the name it is part of)."""
    query, name = normalise_name(query), normalise_name(name)
    words, size = name.split(), len(query.split())
    runs = [" ".join(words[i : i + size]) for i in range(max(1, len(words) - size + 1))]
    return max(difflib.SequenceMatcher(None, query, text).ratio() for text in [name, *runs])


def closest_names(query: str, areas: list[Area], n: int = CLOSEST) -> list[Area]:
    """The n areas whose names are most like `query`, most like first (ties in name order)."""
    return sorted(areas, key=lambda a: (-likeness(query, a.name), a.name, a.level))[:n]


@dataclass(frozen=True)
class Area:
    level: str
    name: str
    id: str
    parent: str | None
    geometry: BaseGeometry  # in `crs`
    crs: str  # as the source file states it (WKT or "EPSG:n")

    def summary(self) -> dict:
        return {
            "name": self.name,
            "id": self.id,
            "level": self.level,
            **({"parent": self.parent} if self.parent else {}),
        }


def read_areas(source: AreaSource, root: Path) -> list[Area]:
    import pyogrio.raw

    path = root / source.path
    if not path.is_file():
        raise GeoPilotInputError(f"area file for level {source.level!r} not found: {path}")
    meta, _, wkb, field_data = pyogrio.raw.read(path, layer=source.layer)
    fields = list(meta["fields"])
    for wanted in (source.name_field, source.id_field, source.parent_field):
        if wanted is not None and wanted not in fields:
            raise GeoPilotInputError(f"{path}: no field {wanted!r} (fields: {', '.join(fields)})")
    column = {name: field_data[i] for i, name in enumerate(fields)}
    crs = meta["crs"] or "EPSG:4326"  # GeoJSON without a crs member is WGS 84 by RFC 7946
    areas = []
    for i, geometry in enumerate(shapely.from_wkb(wkb)):
        if geometry is None or geometry.is_empty:
            continue
        if not geometry.is_valid:
            geometry = shapely.make_valid(geometry)
        parent = str(column[source.parent_field][i]) if source.parent_field else None
        areas.append(
            Area(
                source.level, str(column[source.name_field][i]), str(column[source.id_field][i]), parent, geometry, crs
            )
        )
    return areas


class AreaIndex:
    """Every area of every level in a catalogue, read on first use."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog

    @cached_property
    def _by_level(self) -> dict[str, list[Area]]:
        return {source.level: read_areas(source, self.catalog.root) for source in self.catalog.areas}

    def levels(self) -> list[str]:
        return self.catalog.levels()

    def all(self, level: str) -> list[Area]:
        if level not in self._by_level:
            raise AreaNotFound(f"unknown level {level!r}; levels: {', '.join(self._by_level)}")
        return self._by_level[level]

    def find(self, name: str, level: str) -> Area:
        areas = self.all(level)
        key = normalise_name(name)
        matches = [a for a in areas if normalise_name(a.name) == key or a.id == name.strip()]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise AreaNotFound(
                f"{name!r} names {len(matches)} areas at level {level!r}; pass the id instead: "
                + ", ".join(f"{a.name} ({a.id})" for a in matches)
            )
        close = ", ".join(a.name for a in closest_names(name, areas))
        raise AreaNotFound(f"no {level} named {name!r}" + (f"; closest names: {close}" if close else ""))

    def closest_anywhere(self, name: str) -> str:
        """For a name no level has: the closest names of every level, with their levels."""
        areas = [area for level in self.levels() for area in self.all(level)]
        return ", ".join(f"{a.name} ({a.level})" for a in closest_names(name, areas))

    def find_any_level(self, name: str) -> list[Area]:
        """Every area with this name at any level (for lookups that do not say the level)."""
        found = []
        for level in self.levels():
            try:
                found.append(self.find(name, level))
            except AreaNotFound:
                continue
        return found
