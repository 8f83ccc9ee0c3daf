"""The indicator tools (GNA's kind of tool set) as registry tools: pydantic params, a declared `data` schema,
canonical `ToolOutput(data=...)`. They read no image (`modality=None`); every call names its layer and area.

    registry = build_indicator_registry("region/catalog.yaml")
    registry.call(Action(tool="analyse_area", params={"layer": "land_cover", "area": "Añora de Ríos",
                                                     "level": "municipality"}), image=None)

Errors the agent must see (an area that does not exist, a display-only layer, a polygon outside the raster)
are raised as GeoPilotInputError and come back through `ToolRegistry.call` as the result's `error`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from geopilot.artifacts import artifacts_dir as artifacts_folder
from geopilot.artifacts import prune_artifacts, publish_artifact
from geopilot.errors import GeoPilotInputError
from geopilot.tool_output import Artifact, ToolOutput
from geopilot.tool_protocol import ToolRegistry
from geopilot.tools.indicators.areas import Area, AreaIndex
from geopilot.tools.indicators.catalog import Catalog, Layer, load_catalog
from geopilot.tools.indicators.zonal import ZonalStats, zonal_stats

Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
STATS = ("mean", "min", "max", "std")
MAX_AREAS = 20
MAX_CHARTS = 200  # newest charts kept per artefact folder: a long-running server's folder stays bounded


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # a NaN threshold is a 422


class _Data(BaseModel):
    model_config = ConfigDict(extra="allow")


class NoParams(_Params):
    pass


class LayerParams(_Params):
    layer: Text = Field(description="layer id, as list_layers gives it")


class LookupParams(_Params):
    name: Text = Field(description="the area's name (accents and case are ignored) or its id")
    level: Text | None = Field(None, description="province, municipality, ...; omit to search every level")


class AreaParams(_Params):
    layer: Text = Field(description="layer id")
    area: Text = Field(description="area name or id")
    level: Text = Field(description="administrative level of the area, e.g. municipality")
    date: Text | None = Field(None, description="for dated layers: which date (default: the latest)")


class CompareParams(_Params):
    layer: Text
    areas: list[Text] = Field(min_length=2, max_length=MAX_AREAS, description="area names or ids")
    level: Text
    metric: Text = Field(description="a class name of a categorical layer, or mean|min|max|std of a continuous one")
    date: Text | None = None


class RankParams(_Params):
    layer: Text
    level: Text
    metric: Text = Field(description="a class name, or mean|min|max|std")
    n: int = Field(5, ge=1, le=100)
    order: Literal["top", "bottom"] = "top"
    within: Text | None = Field(None, description="only areas inside this enclosing area (name or id)")
    date: Text | None = None


class ThresholdParams(_Params):
    layer: Text
    level: Text
    metric: Text = Field(description="a class name (percent of the area), or mean|min|max|std")
    op: Literal["above", "below"]
    threshold: float
    within: Text | None = None
    date: Text | None = None


class TimeSeriesParams(_Params):
    layer: Text = Field(description="a layer with dates")
    area: Text
    level: Text
    metric: Text = "mean"


class ChartParams(_Params):
    layer: Text
    areas: list[Text] = Field(min_length=1, max_length=MAX_AREAS)
    level: Text
    metric: Text
    date: Text | None = None


class BufferParams(_Params):
    area: Text
    level: Text
    distance_m: float = Field(gt=0, le=100_000, description="buffer distance in metres")
    layer: Text | None = Field(None, description="also analyse this layer over the buffered area")


class SelectParams(_Params):
    area: Text
    level: Text
    target_level: Text = Field(description="the level of the features to select")
    relation: Literal["intersects", "within", "contains", "touches"] = "within"


class CentroidParams(_Params):
    level: Text
    within: Text | None = None


class RejectParams(_Params):
    reason: Text = Field(description="why the request is out of scope for these tools")


@dataclass(eq=False)  # hashed by identity: `stats` is cached per context
class Context:
    catalog: Catalog
    areas: AreaIndex
    configured_artifacts_dir: Path | None  # None: this process's private folder, made on the first chart

    def analysable(self, layer_id: str, date: str | None = None) -> tuple[Layer, str | None]:
        layer = self.catalog.layer(layer_id)
        if layer.display_only:
            raise GeoPilotInputError(f"layer {layer.id!r} is display-only: it can be shown on a map, not analysed")
        if date is not None and not layer.dates:
            raise GeoPilotInputError(f"layer {layer.id!r} has no dates")
        if layer.dates:
            date = date or layer.dates[-1]
            if date not in layer.dates:
                raise GeoPilotInputError(f"layer {layer.id!r} has no date {date!r}; dates: {', '.join(layer.dates)}")
        return layer, date

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - one Context per registry, stats are immutable
    def stats(self, layer_id: str, date: str | None, level: str, area_id: str) -> ZonalStats:
        layer = self.catalog.layer(layer_id)
        area = next(a for a in self.areas.all(level) if a.id == area_id)
        return zonal_stats(
            layer.raster_path(self.catalog.root, date),
            area.geometry,
            area.crs,
            layer.kind == "categorical",
            layer.nodata,
            band=layer.band(date),
        )

    def metric(self, layer: Layer, date: str | None, area: Area, metric: str) -> float:
        stats = self.stats(layer.id, date, area.level, area.id)
        if layer.kind == "categorical":
            shares = named_shares(layer, stats)
            if metric not in shares:
                raise GeoPilotInputError(f"layer {layer.id!r} has no class {metric!r}; classes: {', '.join(shares)}")
            return shares[metric]
        if metric not in STATS:
            raise GeoPilotInputError(f"layer {layer.id!r} is continuous: metric must be one of {', '.join(STATS)}")
        return round(stats.summary()[metric], 4)

    @functools.cached_property
    def working_crs(self):
        """Geometry operations (buffers, spatial relations) run in the first raster's CRS, in its units."""
        import rasterio

        with rasterio.open(self.catalog.layers[0].raster_path(self.catalog.root)) as dataset:
            return dataset.crs

    def geometry(self, area: Area):
        from geopilot.tools.indicators.zonal import to_raster_crs

        return to_raster_crs(area.geometry, area.crs, self.working_crs)

    def areas_within(self, level: str, within: str | None) -> list[Area]:
        candidates = self.areas.all(level)
        if within is None:
            return candidates
        parents = self.areas.find_any_level(within)
        if not parents:
            raise GeoPilotInputError(
                f"no area named {within!r} at any level; closest names: {self.areas.closest_anywhere(within)}"
            )
        parent = self.geometry(parents[0])
        return [a for a in candidates if (g := self.geometry(a)).intersection(parent).area >= 0.5 * g.area]


def _crs(text: str):
    from rasterio.crs import CRS

    return CRS.from_user_input(text)


def named_shares(layer: Layer, stats: ZonalStats) -> dict[str, float]:
    shares = stats.class_shares()
    return {name: round(shares.get(value, 0.0), 2) for value, name in layer.classes.items()}


def area_stats(layer: Layer, stats: ZonalStats) -> dict[str, Any]:
    if layer.kind == "categorical":
        result: dict[str, Any] = {"class_shares": named_shares(layer, stats)}
    else:
        summary = stats.summary()
        result = {key: round(summary[key], 4) for key in STATS} | {"count": int(summary["count"])}
        if layer.units:
            result["units"] = layer.units
    if stats.outside_raster_pct > 0.05:
        result["outside_raster_pct"] = round(stats.outside_raster_pct, 2)
    return result


# --- the tools -------------------------------------------------------------------------------------------------


def list_layers(ctx: Context, params: NoParams) -> dict:
    return {
        "layers": [
            {
                "id": x.id,
                "kind": x.kind,
                "description": x.description,
                "display_only": x.display_only,
                **({"units": x.units} if x.units else {}),
                **({"dates": x.dates} if x.dates else {}),
            }
            for x in ctx.catalog.layers
        ],
        "levels": ctx.catalog.levels(),
    }


def get_legend(ctx: Context, params: LayerParams) -> dict:
    layer = ctx.catalog.layer(params.layer)
    if layer.kind == "categorical":
        return {"layer": layer.id, "kind": layer.kind, "classes": {str(k): v for k, v in layer.classes.items()}}
    return {"layer": layer.id, "kind": layer.kind, "units": layer.units}


def lookup_area(ctx: Context, params: LookupParams) -> dict:
    if params.level is not None:
        return {"matches": [ctx.areas.find(params.name, params.level).summary()]}
    found = ctx.areas.find_any_level(params.name)
    if not found:
        raise GeoPilotInputError(
            f"no area named {params.name!r} at any level ({', '.join(ctx.areas.levels())}); "
            f"closest names: {ctx.areas.closest_anywhere(params.name)}"
        )
    return {"matches": [a.summary() for a in found]}


def analyse_area(ctx: Context, params: AreaParams) -> dict:
    layer, date = ctx.analysable(params.layer, params.date)
    area = ctx.areas.find(params.area, params.level)
    stats = ctx.stats(layer.id, date, area.level, area.id)
    return area.summary() | {"layer": layer.id, **({"date": date} if date else {})} | area_stats(layer, stats)


def compare_areas(ctx: Context, params: CompareParams) -> dict:
    layer, date = ctx.analysable(params.layer, params.date)
    areas = [ctx.areas.find(name, params.level) for name in params.areas]
    values = [{"name": a.name, "id": a.id, "value": ctx.metric(layer, date, a, params.metric)} for a in areas]
    ordered = sorted(values, key=lambda v: v["value"], reverse=True)
    result = {
        "layer": layer.id,
        "metric": params.metric,
        "values": values,
        "highest": ordered[0]["name"],
        "lowest": ordered[-1]["name"],
    }
    if len(values) == 2:
        result["difference"] = round(values[0]["value"] - values[1]["value"], 4)
    return result


def rank_areas(ctx: Context, params: RankParams) -> dict:
    layer, date = ctx.analysable(params.layer, params.date)
    scored = [(a, ctx.metric(layer, date, a, params.metric)) for a in ctx.areas_within(params.level, params.within)]
    scored.sort(key=lambda item: item[1], reverse=params.order == "top")
    return {
        "layer": layer.id,
        "metric": params.metric,
        "order": params.order,
        "ranking": [
            {"rank": i + 1, "name": a.name, "id": a.id, "value": v} for i, (a, v) in enumerate(scored[: params.n])
        ],
    }


def threshold_count(ctx: Context, params: ThresholdParams) -> dict:
    layer, date = ctx.analysable(params.layer, params.date)
    areas = ctx.areas_within(params.level, params.within)
    passing = []
    for area in areas:
        value = ctx.metric(layer, date, area, params.metric)
        if (value > params.threshold) if params.op == "above" else (value < params.threshold):
            passing.append({"name": area.name, "id": area.id, "value": value})
    return {
        "layer": layer.id,
        "metric": params.metric,
        "op": params.op,
        "threshold": params.threshold,
        "count": len(passing),
        "of": len(areas),
        "areas": passing,
    }


def statistics_over_time(ctx: Context, params: TimeSeriesParams) -> dict:
    layer = ctx.catalog.layer(params.layer)
    if not layer.dates:
        raise GeoPilotInputError(f"layer {layer.id!r} has no dates; use analyse_area")
    ctx.analysable(layer.id, layer.dates[0])
    area = ctx.areas.find(params.area, params.level)
    series = [{"date": d, "value": ctx.metric(layer, d, area, params.metric)} for d in layer.dates]
    return area.summary() | {
        "layer": layer.id,
        "metric": params.metric,
        "series": series,
        "change": round(series[-1]["value"] - series[0]["value"], 4),
    }


def generate_chart(ctx: Context, params: ChartParams) -> ToolOutput:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layer, date = ctx.analysable(params.layer, params.date)
    areas = [ctx.areas.find(name, params.level) for name in params.areas]
    values = [ctx.metric(layer, date, a, params.metric) for a in areas]
    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.bar([a.name for a in areas], values, color="#4C72B0")
    axes.set_ylabel(f"{params.metric} (%)" if layer.kind == "categorical" else params.metric)
    axes.set_title(f"{layer.id}{f' {date}' if date else ''}")
    axes.tick_params(axis="x", rotation=30)
    figure.tight_layout()
    folder = artifacts_folder(ctx.configured_artifacts_dir)
    try:
        name = publish_artifact(folder, "chart", ".png", lambda target: figure.savefig(target, format="png", dpi=100))
    finally:
        plt.close(figure)
    prune_artifacts(folder, "chart", ".png", keep=MAX_CHARTS)
    data = {
        "layer": layer.id,
        "metric": params.metric,
        "values": {a.name: v for a, v in zip(areas, values, strict=True)},
    }
    return ToolOutput(data=data, artifacts=[Artifact(kind="image", path=str(name))])


def buffer_area(ctx: Context, params: BufferParams) -> dict:
    area = ctx.areas.find(params.area, params.level)
    if ctx.working_crs.is_geographic:
        raise GeoPilotInputError("buffers need a projected raster CRS (metres); this catalogue's is geographic")
    base = ctx.geometry(area)
    buffered = base.buffer(params.distance_m)
    result = area.summary() | {
        "distance_m": params.distance_m,
        "area_km2": round(base.area / 1e6, 3),
        "buffered_km2": round(buffered.area / 1e6, 3),
    }
    if params.layer is not None:
        layer, date = ctx.analysable(params.layer)
        stats = zonal_stats(
            layer.raster_path(ctx.catalog.root, date),
            buffered,
            ctx.working_crs.to_string(),
            layer.kind == "categorical",
            layer.nodata,
            band=layer.band(date),
        )
        result |= {"layer": layer.id} | area_stats(layer, stats)
    return result


def _related(relation: str, other, geometry) -> bool:
    """Spatial predicates with 1 m of slack, so areas sharing a digitised edge read as touching, not overlapping."""
    if relation == "within":
        return other.buffer(-1.0).within(geometry)
    if relation == "contains":
        return other.buffer(1.0).contains(geometry)
    overlap = other.intersection(geometry).area
    if relation == "intersects":
        return overlap >= 1.0
    return overlap < 1.0 and other.distance(geometry) < 1.0  # touches


def select_features(ctx: Context, params: SelectParams) -> dict:
    area = ctx.areas.find(params.area, params.level)
    geometry = ctx.geometry(area)
    selected = [
        other.summary()
        for other in ctx.areas.all(params.target_level)
        if other.id != area.id and _related(params.relation, ctx.geometry(other), geometry)
    ]
    return area.summary() | {"relation": params.relation, "target_level": params.target_level, "features": selected}


def centroids(ctx: Context, params: CentroidParams) -> dict:
    from geopilot.tools.indicators.zonal import to_raster_crs

    rows = []
    for area in ctx.areas_within(params.level, params.within):
        point = to_raster_crs(ctx.geometry(area).centroid, ctx.working_crs.to_string(), _crs("EPSG:4326"))
        rows.append({"name": area.name, "id": area.id, "lon": round(point.x, 5), "lat": round(point.y, 5)})
    return {"level": params.level, "centroids": rows}


def reject_task(ctx: Context, params: RejectParams) -> dict:
    return {"rejected": True, "reason": params.reason}


@dataclass
class IndicatorTool:
    """A registry Tool over a catalogue: `run(image, params)` ignores the image."""

    name: str
    description: str
    params_model: type[BaseModel]
    function: Callable[[Context, Any], dict | ToolOutput]
    context: Context
    modality: None = None
    data_model: type[BaseModel] = _Data

    def run(self, image: Any, params: BaseModel) -> ToolOutput:
        result = self.function(self.context, params)
        return result if isinstance(result, ToolOutput) else ToolOutput(data=result)


TOOLS: list[tuple[str, str, type[BaseModel], Callable]] = [
    (
        "list_layers",
        "List the indicator layers (id, kind, units, dates, display-only) and area levels.",
        NoParams,
        list_layers,
    ),
    ("get_legend", "The legend of a layer: class names by pixel value, or its units.", LayerParams, get_legend),
    (
        "lookup_area",
        "Find an administrative area by name or id; returns its id, level and parent.",
        LookupParams,
        lookup_area,
    ),
    (
        "analyse_area",
        "Statistics of one layer over one area: class shares in percent, or mean/min/max/std.",
        AreaParams,
        analyse_area,
    ),
    ("compare_areas", "Compare one metric of a layer between areas of the same level.", CompareParams, compare_areas),
    ("rank_areas", "Top or bottom N areas of a level by one metric of a layer.", RankParams, rank_areas),
    (
        "threshold_count",
        "How many areas of a level have a metric above or below a threshold.",
        ThresholdParams,
        threshold_count,
    ),
    (
        "statistics_over_time",
        "One metric of a dated layer over one area, for every date.",
        TimeSeriesParams,
        statistics_over_time,
    ),
    ("generate_chart", "A bar chart (PNG) of one metric of a layer over some areas.", ChartParams, generate_chart),
    (
        "buffer_area",
        "An area grown by a distance in metres, its size, and optionally a layer analysed over it.",
        BufferParams,
        buffer_area,
    ),
    (
        "select_features",
        "Areas of a level that intersect, lie within, contain or touch a given area.",
        SelectParams,
        select_features,
    ),
    ("centroids", "Centre points (lon, lat) of the areas of a level.", CentroidParams, centroids),
    ("reject_task", "Decline a request these tools cannot answer, saying why.", RejectParams, reject_task),
]


def build_indicator_registry(
    catalog: str | Path | Catalog, artifacts_dir: str | Path | None = None, timeout_s: float = 60.0
) -> ToolRegistry:
    catalog = catalog if isinstance(catalog, Catalog) else load_catalog(catalog)
    if artifacts_dir is not None and (str(artifacts_dir).strip() == "" or Path(artifacts_dir).is_file()):
        raise GeoPilotInputError(f"artifacts dir {str(artifacts_dir)!r} is not a folder (give a folder, or omit it)")
    folder = Path(artifacts_dir) if artifacts_dir is not None else None
    context = Context(catalog, AreaIndex(catalog), folder)
    tools = [IndicatorTool(name, text, model, function, context) for name, text, model, function in TOOLS]
    return ToolRegistry(tools, timeout_s=timeout_s)
