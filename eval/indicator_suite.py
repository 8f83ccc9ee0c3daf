"""The indicator case suite: 100+ cases in the harness's case format over the synthetic region
(`geopilot synth-region`), with numeric ground truth computed from its rasters (`truth.json`).

    geopilot eval build-indicators --region DIR --out cases.jsonl

Categories follow GNA's: tool selection, continuous statistics, comparison (near-equal pairs included), ranking,
thresholds, time series, cross-indicator synthesis, memory (a prior exchange in `history`), multilingual
(Spanish, Galician, Basque, Portuguese), spatial relations, catalogue questions, charts, buffers, error handling
(areas that do not exist, display-only layers) and refusal. Every case carries `reference_calls`: the calls a
correct agent makes, which the scripted reference agent replays.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from geopilot.eval.cases import Case, GroundTruth, HistoryTurn, ParamCheck, ReferenceCall

LAND = "land_cover"
CO2 = "co2_suitability"
EROSION = "erosion_probability"
PCT_TOL = 0.5  # percentage points: the tools round to 0.01, answers may round to 0.1
MEAN_TOL = 0.01
NOT_FOUND = [
    "not found",
    "does not exist",
    "doesn't exist",
    "no municipality",
    "no province",
    "no area",
    "could not find",
    "couldn't find",
    "unknown",
    "no existe",
    "not exist",
]
CLASSES = ["forest", "cropland", "grassland", "urban", "water"]  # the land-cover classes the questions ask about
PAIR_INDICES = ((0, 1), (4, 5), (6, 7), (10, 11), (2, 9), (3, 8))  # compared municipalities, by index
DISPLAY_ONLY = [
    "display only",
    "display-only",
    "cannot be analysed",
    "cannot be analyzed",
    "only for display",
    "not analysable",
    "can't be analysed",
]


def _call(tool: str, **params: Any) -> ReferenceCall:
    return ReferenceCall(tool=tool, params=params)


def _check(tool: str, field: str, op: str, value: Any = None) -> ParamCheck:
    return ParamCheck(tool=tool, field=field, op=op, value=value)


def _case(
    cid,
    query,
    category,
    difficulty,
    calls,
    *,
    checks=(),
    contain=(),
    forbid=(),
    truth=(),
    history=(),
    rounds=None,
    tool_errors=False,
):
    """A validated Case (a wrong field fails here, when the suite is built, not when it is scored)."""
    return Case(
        id=cid,
        query=query,
        image=None,
        modality=None,
        category=category,
        difficulty=difficulty,
        expected_tools=list(dict.fromkeys(call.tool for call in calls)),
        param_checks=list(checks),
        must_contain=list(contain),
        must_not_contain=list(forbid),
        ground_truth=[GroundTruth(label=lbl, value=round(v, 4), tolerance=round(tol, 3)) for lbl, v, tol in truth],
        max_rounds=rounds if rounds is not None else max(len(calls), 1) + 1,
        history=[HistoryTurn.model_validate(turn) for turn in history],
        reference_calls=list(calls),
        expect_tool_errors=tool_errors,
    )


def build_cases(truth: dict) -> list[Case]:
    """Every case of the suite, by category, with its ground truth from the region's `truth.json`."""
    return [case for build in CATEGORY_BUILDERS for case in build(truth)]


def _views(truth: dict) -> tuple[dict, dict, list[str], list[str]]:
    """(municipality truth, province truth, municipality names, province names)."""
    return truth["municipality"], truth["province"], list(truth["municipality"]), list(truth["province"])


def _pairs(names: list[str]) -> list[tuple[str, str]]:
    """The compared municipalities, including near-equal ones (differences of 0.1 to 2 points)."""
    return [(names[a], names[b]) for a, b in PAIR_INDICES]


def _tool_selection_cases(truth: dict) -> Iterator[Case]:
    """Tool selection: one class share of one municipality (two layers)."""
    m, p, names, provinces = _views(truth)
    for i, name in enumerate(names):
        cls = CLASSES[i % len(CLASSES)]
        yield (
            _case(
                f"share-{i:02d}",
                f"What percentage of {name} is covered by {cls}?",
                "tool_selection",
                "easy",
                [_call("analyse_area", layer=LAND, area=name, level="municipality")],
                checks=[
                    _check("analyse_area", "layer", "equals", LAND),
                    _check("analyse_area", "area", "contains", name),
                ],
                truth=[(cls, m[name][LAND][cls], PCT_TOL)],
                forbid=["error"],
            )
        )
    for i, name in enumerate(names[::2]):
        yield (
            _case(
                f"co2-{i:02d}",
                f"How much of the municipality of {name} is eligible for CO2 afforestation credits without conditions?",
                "tool_selection",
                "easy",
                [_call("analyse_area", layer=CO2, area=name, level="municipality")],
                checks=[_check("analyse_area", "layer", "equals", CO2)],
                truth=[("eligible", m[name][CO2]["eligible"], PCT_TOL)],
            )
        )


def _statistics_cases(truth: dict) -> Iterator[Case]:
    """Continuous statistics."""
    m, p, names, provinces = _views(truth)
    for i, name in enumerate(provinces):
        yield (
            _case(
                f"erosion-province-{i}",
                f"What is the mean soil erosion probability in the province of {name}?",
                "statistics",
                "easy",
                [_call("analyse_area", layer=EROSION, area=name, level="province")],
                checks=[_check("analyse_area", "level", "equals", "province")],
                truth=[("mean", p[name][EROSION]["mean"], MEAN_TOL)],
            )
        )
    for i, name in enumerate(names[1::3]):
        yield (
            _case(
                f"erosion-max-{i}",
                f"What is the highest erosion probability found anywhere in {name}?",
                "statistics",
                "medium",
                [_call("analyse_area", layer=EROSION, area=name, level="municipality")],
                truth=[("max", m[name][EROSION]["max"], MEAN_TOL)],
            )
        )


def _comparison_cases(truth: dict) -> Iterator[Case]:
    """Comparison, including near-equal pairs (differences of 0.1 to 2 points)."""
    m, p, names, provinces = _views(truth)
    pairs = _pairs(names)
    for i, (a, b) in enumerate(pairs):
        va, vb = m[a][LAND]["forest"], m[b][LAND]["forest"]
        winner = a if va > vb else b
        near = abs(va - vb) <= 2
        yield (
            _case(
                f"compare-forest-{i}",
                f"Which has the larger share of forest, {a} or {b}?",
                "comparison",
                "hard" if near else "medium",
                [_call("compare_areas", layer=LAND, areas=[a, b], level="municipality", metric="forest")],
                checks=[_check("compare_areas", "metric", "equals", "forest")],
                contain=[winner],
                truth=[(a, va, min(PCT_TOL, abs(va - vb) / 2.5)), (b, vb, min(PCT_TOL, abs(va - vb) / 2.5))],
            )
        )
    for i, (a, b) in enumerate(zip(provinces[:2], provinces[2:], strict=True)):
        va, vb = p[a][EROSION]["mean"], p[b][EROSION]["mean"]
        yield (
            _case(
                f"compare-erosion-{i}",
                f"Is erosion risk higher on average in {a} or in {b}?",
                "comparison",
                "medium",
                [_call("compare_areas", layer=EROSION, areas=[a, b], level="province", metric="mean")],
                contain=[a if va > vb else b],
            )
        )


def _ranking_cases(truth: dict) -> Iterator[Case]:
    """Ranking."""
    m, p, names, provinces = _views(truth)
    for i, (metric, layer, order) in enumerate(
        [
            ("mean", EROSION, "top"),
            ("mean", EROSION, "bottom"),
            ("forest", LAND, "top"),
            ("urban", LAND, "bottom"),
            ("eligible", CO2, "top"),
            ("water", LAND, "top"),
        ]
    ):
        values = {n: (m[n][layer][metric]) for n in names}
        ranked = sorted(values, key=values.get, reverse=order == "top")[:3]
        what = (
            f"mean {layer.replace('_', ' ')}" if metric == "mean" else f"share of {metric} ({layer.replace('_', ' ')})"
        )
        yield (
            _case(
                f"rank-{i}",
                f"List the three municipalities with the {'highest' if order == 'top' else 'lowest'} {what}.",
                "ranking",
                "medium",
                [_call("rank_areas", layer=layer, level="municipality", metric=metric, n=3, order=order)],
                checks=[_check("rank_areas", "order", "equals", order)],
                contain=ranked,
            )
        )
    for i, country in enumerate(truth["country"]):
        inside = [n for n in names if truth["municipality"][n]["id"].startswith(truth["country"][country]["id"])]
        best = max(inside, key=lambda n: m[n][EROSION]["mean"])
        yield (
            _case(
                f"rank-within-{i}",
                f"Which municipality of {country} has the highest mean erosion probability?",
                "ranking",
                "hard",
                [_call("rank_areas", layer=EROSION, level="municipality", metric="mean", n=1, within=country)],
                checks=[_check("rank_areas", "within", "contains", country)],
                contain=[best],
            )
        )


def _threshold_cases(truth: dict) -> Iterator[Case]:
    """Thresholds."""
    m, p, names, provinces = _views(truth)
    for i, (metric, layer, op, threshold) in enumerate(
        [
            ("urban", LAND, "above", 20.0),
            ("forest", LAND, "above", 25.0),
            ("water", LAND, "below", 10.0),
            ("mean", EROSION, "above", 0.5),
            ("eligible", CO2, "above", 30.0),
            ("grassland", LAND, "below", 15.0),
        ]
    ):
        count = sum(
            1 for n in names if (m[n][layer][metric] > threshold if op == "above" else m[n][layer][metric] < threshold)
        )
        unit = "" if metric == "mean" else "%"
        what = (
            f"a mean erosion probability {op} {threshold}" if metric == "mean" else f"{op} {threshold:g}{unit} {metric}"
        )
        yield (
            _case(
                f"threshold-{i}",
                f"How many municipalities have {what}?",
                "threshold",
                "medium",
                [
                    _call(
                        "threshold_count", layer=layer, level="municipality", metric=metric, op=op, threshold=threshold
                    )
                ],
                checks=[_check("threshold_count", "op", "equals", op)],
                truth=[("municipalities", count, 0)],
            )
        )


def _time_series_cases(truth: dict) -> Iterator[Case]:
    """Time series (a dated layer: only statistics_over_time covers every date)."""
    m, p, names, provinces = _views(truth)
    for i, name in enumerate(names[::2]):
        series = m[name]["ndvi"]
        change = series["2024"]["mean"] - series["2021"]["mean"]
        yield (
            _case(
                f"ndvi-trend-{i}",
                f"How did the mean NDVI of {name} change between 2021 and 2024?",
                "time_series",
                "medium",
                [_call("statistics_over_time", layer="ndvi", area=name, level="municipality")],
                truth=[("change", change, MEAN_TOL)],
                contain=[
                    ["increase", "increased", "rose", "grew", "decrease", "decreased", "fell", "dropped", "declined"]
                ],
            )
        )
    for i, name in enumerate(names[1::4]):
        yield (
            _case(
                f"ndvi-year-{i}",
                f"What was the mean NDVI in {name} in 2022?",
                "time_series",
                "easy",
                [_call("analyse_area", layer="ndvi", area=name, level="municipality", date="2022")],
                checks=[_check("analyse_area", "date", "equals", "2022")],
                truth=[("NDVI", m[name]["ndvi"]["2022"]["mean"], MEAN_TOL)],
            )
        )


def _cross_indicator_cases(truth: dict) -> Iterator[Case]:
    """Cross-indicator synthesis."""
    m, p, names, provinces = _views(truth)
    for i, name in enumerate(names[::2]):
        yield (
            _case(
                f"cross-{i}",
                f"For {name}, give the share of land eligible for CO2 credits and the mean erosion probability.",
                "cross_indicator",
                "hard",
                [
                    _call("analyse_area", layer=CO2, area=name, level="municipality"),
                    _call("analyse_area", layer=EROSION, area=name, level="municipality"),
                ],
                truth=[("eligible", m[name][CO2]["eligible"], PCT_TOL), ("mean", m[name][EROSION]["mean"], MEAN_TOL)],
                rounds=3,
            )
        )


def _memory_cases(truth: dict) -> Iterator[Case]:
    """Memory: a prior exchange in `history`, the follow-up leaves the layer implicit."""
    m, p, names, provinces = _views(truth)
    for i in range(8):
        first, second = names[i], names[(i + 5) % len(names)]
        cls = CLASSES[(i + 2) % len(CLASSES)]
        history = [
            {"role": "user", "content": f"What share of {first} is {cls}?"},
            {"role": "assistant", "content": f"In {first}, {cls} covers {m[first][LAND][cls]:.1f} % of the land."},
        ]
        yield (
            _case(
                f"memory-{i}",
                f"And in {second}?",
                "memory",
                "hard",
                [_call("analyse_area", layer=LAND, area=second, level="municipality")],
                checks=[_check("analyse_area", "area", "contains", second)],
                truth=[(cls, m[second][LAND][cls], PCT_TOL)],
                history=history,
            )
        )


def _multilingual_cases(truth: dict) -> Iterator[Case]:
    """Multilingual: the area name is the label, so an answer in any language can be scored."""
    m, p, names, provinces = _views(truth)
    templates = {
        "es": "¿Cuál es la probabilidad media de erosión del suelo en {n}?",
        "gl": "Cal é a probabilidade media de erosión do solo en {n}?",
        "eu": "Zein da lurzoruaren higadura-probabilitate batez bestekoa {n} udalerrian?",
        "pt": "Qual é a probabilidade média de erosão do solo em {n}?",
    }
    for j, (lang, text) in enumerate(templates.items()):
        for k in range(4):
            name = names[(3 * j + k) % len(names)]
            yield (
                _case(
                    f"multilingual-{lang}-{k}",
                    text.format(n=name),
                    f"multilingual_{lang}",
                    "medium",
                    [_call("analyse_area", layer=EROSION, area=name, level="municipality")],
                    checks=[_check("analyse_area", "layer", "equals", EROSION)],
                    truth=[(name, m[name][EROSION]["mean"], MEAN_TOL)],
                )
            )


def _spatial_and_catalogue_cases(truth: dict) -> Iterator[Case]:
    """Spatial relations and catalogue questions."""
    m, p, names, provinces = _views(truth)
    pairs = _pairs(names)
    for i, name in enumerate(names[::3]):
        yield (
            _case(
                f"province-of-{i}",
                f"Which province is {name} in?",
                "spatial",
                "easy",
                [_call("lookup_area", name=name)],
                contain=[next(pn for pn in provinces if pn == _parent(truth, name))],
            )
        )
    for i, name in enumerate(provinces):
        inside = [n for n in names if _parent(truth, n) == name]
        yield (
            _case(
                f"municipalities-of-{i}",
                f"Which municipalities lie within {name}?",
                "spatial",
                "medium",
                [_call("select_features", area=name, level="province", target_level="municipality", relation="within")],
                contain=inside,
            )
        )
    yield (
        _case(
            "layers",
            "Which indicator layers can you analyse?",
            "catalogue",
            "easy",
            [_call("list_layers")],
            contain=["land_cover", "erosion_probability", "co2_suitability"],
        )
    )
    yield (
        _case(
            "legend-land",
            "What classes does the land cover layer distinguish?",
            "catalogue",
            "easy",
            [_call("get_legend", layer=LAND)],
            contain=CLASSES,
        )
    )
    yield (
        _case(
            "legend-co2",
            "What are the categories of the CO2 suitability layer?",
            "catalogue",
            "easy",
            [_call("get_legend", layer=CO2)],
            contain=["eligible", "not eligible"],
        )
    )
    for i, (a, b) in enumerate(pairs[:3]):
        yield (
            _case(
                f"chart-{i}",
                f"Make a bar chart comparing the forest share of {a} and {b}.",
                "chart",
                "medium",
                [_call("generate_chart", layer=LAND, areas=[a, b], level="municipality", metric="forest")],
                checks=[_check("generate_chart", "areas", "nonempty")],
            )
        )
    for i, name in enumerate(names[2:4]):
        yield (
            _case(
                f"buffer-{i}",
                f"How large would {name} be, in square kilometres, with a 2 km buffer around it?",
                "spatial",
                "medium",
                [_call("buffer_area", area=name, level="municipality", distance_m=2000.0)],
                checks=[_check("buffer_area", "distance_m", "equals", 2000.0)],
                contain=[["km2", "km²", "square kilometres", "square kilometers", "km"]],
            )
        )


def _error_and_refusal_cases(truth: dict) -> Iterator[Case]:
    """Error handling and refusal."""
    m, p, names, provinces = _views(truth)
    for i, ghost in enumerate(["Villarriba del Monte", "Santa Comba de Xallas", "Atlantis", "Porto Novo da Ria"]):
        yield (
            _case(
                f"missing-area-{i}",
                f"What percentage of {ghost} is forest?",
                "error_handling",
                "hard",
                [_call("analyse_area", layer=LAND, area=ghost, level="municipality")],
                contain=[NOT_FOUND],
                forbid=["%"],
                rounds=3,
                tool_errors=True,
            )
        )
    for i, name in enumerate(names[::4]):
        yield (
            _case(
                f"display-only-{i}",
                f"What is the average hillshade value in {name}?",
                "error_handling",
                "hard",
                [_call("analyse_area", layer="hillshade", area=name, level="municipality")],
                contain=[DISPLAY_ONLY],
                rounds=3,
                tool_errors=True,
            )
        )
    for i, query in enumerate(
        [
            "What will the weather be in Braçal tomorrow?",
            "Book me a hotel in Évora Nova.",
            "Translate this sentence into French: the river is high.",
            "Who won the football league in Valdoria last year?",
            "Write a poem about Ribera Baja.",
            "What is the population of Lusavia?",
        ]
    ):
        yield (
            _case(
                f"refuse-{i}",
                query,
                "refusal",
                "medium",
                [_call("reject_task", reason="outside the indicator tools")],
                rounds=2,
            )
        )


CATEGORY_BUILDERS = (
    _tool_selection_cases,
    _statistics_cases,
    _comparison_cases,
    _ranking_cases,
    _threshold_cases,
    _time_series_cases,
    _cross_indicator_cases,
    _memory_cases,
    _multilingual_cases,
    _spatial_and_catalogue_cases,
    _error_and_refusal_cases,
)


def _parent(truth: dict, municipality: str) -> str:
    code = truth["municipality"][municipality]["id"].rsplit("-", 1)[0]
    return next(name for name, entry in truth["province"].items() if entry["id"] == code)


def write_suite(region: Path, out: Path) -> int:
    truth = json.loads((region / "truth.json").read_text(encoding="utf-8"))
    cases = build_cases(truth)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(c.model_dump_json() + "\n" for c in cases), encoding="utf-8")
    return len(cases)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--region", required=True, help="a folder written by `geopilot synth-region`")
    parser.add_argument("--out", required=True, help="case file (JSONL) to write")


def run(args: argparse.Namespace) -> int:
    count = write_suite(Path(args.region), Path(args.out))
    print(f"wrote {count} cases to {args.out}")
    return 0
