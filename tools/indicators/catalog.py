"""The indicator catalogue (`--catalog FILE.yaml`): which rasters exist, what their pixels mean, which areas exist.

    layers:
      - id: land_cover
        path: rasters/land_cover.tif          # relative to the catalogue file
        kind: categorical                     # or continuous
        classes: {1: forest, 2: cropland}     # categorical only: pixel value -> class name
        units: null                           # continuous only, e.g. "probability" or "t/ha"
        nodata: 0                             # overrides the file's own nodata value when given
        display_only: false                   # true: may be shown on a map, never analysed
        dates: []                             # one raster per date (`path` holds "{date}"), or one band per date
        description: Land cover classes
    areas:
      - level: municipality
        path: areas/region.gpkg
        layer: municipalities                 # the GeoPackage layer; omit for GeoJSON
        name_field: name
        id_field: code
        parent_field: province                # optional: the name of the enclosing area

Names are matched ignoring case, accents and surrounding spaces; nothing else is guessed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from geopilot.config import StrictConfig, load_config
from geopilot.errors import ConfigError


class Layer(StrictConfig):
    id: str = Field(min_length=1, pattern=r"^\S+$")
    path: str
    kind: Literal["categorical", "continuous"]
    classes: dict[int, str] = {}
    units: str | None = None
    nodata: float | None = None
    display_only: bool = False
    dates: list[str] = []
    description: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> Layer:
        if self.kind == "categorical" and not self.classes:
            raise ValueError(f"layer {self.id!r}: a categorical layer needs `classes`")
        if self.kind == "continuous" and self.classes:
            raise ValueError(f"layer {self.id!r}: a continuous layer has no `classes`")
        if "{date}" in self.path and not self.dates:
            raise ValueError(f"layer {self.id!r}: a '{{date}}' placeholder in `path` needs `dates`")
        if len(set(self.dates)) != len(self.dates):
            raise ValueError(f"layer {self.id!r}: repeated dates")
        return self

    def raster_path(self, root: Path, date: str | None = None) -> Path:
        """The file holding `date` (default: the latest) of a dated layer, or the layer's one file."""
        if self.dates and "{date}" in self.path:
            return root / self.path.format(date=date if date is not None else self.dates[-1])
        return root / self.path

    def band(self, date: str | None = None) -> int:
        """The band holding `date`: a dated layer without a '{date}' path keeps its dates as bands 1..n."""
        if self.dates and "{date}" not in self.path:
            return self.dates.index(date if date is not None else self.dates[-1]) + 1
        return 1


class AreaSource(StrictConfig):
    level: str = Field(min_length=1, pattern=r"^\S+$")
    path: str
    layer: str | None = None
    name_field: str = "name"
    id_field: str = "id"
    parent_field: str | None = None


class Catalog(StrictConfig):
    layers: list[Layer] = Field(min_length=1)
    areas: list[AreaSource] = Field(min_length=1)
    root: Path = Path(".")  # filled by load_catalog: the catalogue's folder

    @model_validator(mode="after")
    def _unique_ids(self) -> Catalog:
        for what, keys in (("layer id", [x.id for x in self.layers]), ("area level", [a.level for a in self.areas])):
            repeated = sorted({k for k in keys if keys.count(k) > 1})
            if repeated:
                raise ValueError(f"repeated {what}: {', '.join(repeated)}")
        return self

    def layer(self, layer_id: str) -> Layer:
        for layer in self.layers:
            if layer.id == layer_id:
                return layer
        raise ConfigError(f"unknown layer {layer_id!r}; layers: {', '.join(x.id for x in self.layers)}")

    def levels(self) -> list[str]:
        return [a.level for a in self.areas]


def load_catalog(path: str | Path) -> Catalog:
    """Read and validate a catalogue; every relative path in it is relative to the catalogue's folder."""
    path = Path(path)
    catalog = load_config(Catalog, path)
    return catalog.model_copy(update={"root": path.resolve().parent})
