"""`geopilot generate check`: read every source of a generation config the way `generate` does, without generating.

Per source (and its split): the layout the reader recognised, records, objects / questions / graphs / pairs,
skips by cause with examples, class names outside the vocabulary, the image size range, and the samples each
ability would get; `ok` is False (exit 2) for a source `generate` would fail on (`geopilot.data_gen.sources`).
"""

from __future__ import annotations

import inspect
from collections import Counter

from geopilot.data_gen.abilities import class_names
from geopilot.data_gen.generate_config import GenerateConfig
from geopilot.data_gen.jobs import Plan, plan_source
from geopilot.data_gen.readers.common import CHANGE_CAPTION
from geopilot.data_gen.sources import SourceError, SourceRead, read_source, skips_line
from geopilot.errors import ConfigError
from geopilot.records import ReadReport
from geopilot.vocabulary import is_known_class


def _split(reader, options: dict) -> str:
    if "split" in options:
        return str(options["split"])
    default = inspect.signature(reader).parameters.get("split")
    return str(default.default) if default is not None and default.default is not inspect.Parameter.empty else "-"


def _layout_hint(layouts: tuple[str, ...]) -> str:
    """What to show when the reader did not name its layout: its only one, or the ones it accepts."""
    return layouts[0] if len(layouts) == 1 else "one of: " + " | ".join(layouts) if layouts else "-"


def _contents(read: SourceRead) -> dict:
    records = read.records
    sizes = [(r.width, r.height) for r in records]
    unknown = Counter(name for r in records for name in class_names(r) if not is_known_class(name))
    return {
        "records": len(records),
        "objects": sum(len(r.objects) for r in records),
        "referring_expressions": sum(len(r.referring) for r in records),
        "questions": sum(d.task != CHANGE_CAPTION for r in records for d in r.dialogues),
        "graphs": sum(r.roads is not None for r in records),
        "pairs": sum(r.cloud_free_image is not None or r.after_image is not None for r in records),
        "change_labels": sum(r.change_mask is not None for r in records),
        "change_captions": sum(d.task == CHANGE_CAPTION for r in records for d in r.dialogues),
        "semantic_masks": sum(r.semantic is not None for r in records),
        "image_size": {
            "min": [min(w for w, _ in sizes), min(h for _, h in sizes)] if sizes else None,
            "max": [max(w for w, _ in sizes), max(h for _, h in sizes)] if sizes else None,
        },
        "unknown_class_names": dict(unknown.most_common(20)),
    }


def check_sources(config: GenerateConfig, readers: dict | None = None) -> dict:
    """The check of every source; never raises for a bad source (its `error` says why), only for a bad config."""
    from geopilot.data_gen.readers import LAYOUTS
    from geopilot.data_gen.readers import READERS as default_readers

    readers = default_readers if readers is None else readers
    plan, seen, sources = Plan(jobs=[], read_reports={}), set(), []
    for source in config.sources:
        if source.reader not in readers:
            raise ConfigError(f"unknown reader {source.reader!r}; available: {', '.join(readers)}")
        limit = config.max_skip_fraction if source.max_skip_fraction is None else source.max_skip_fraction
        entry = {
            "reader": source.reader,
            "root": str(source.root),
            "split": _split(readers[source.reader], source.options),
        }
        try:
            read = read_source(source.reader, source.root, source.options, readers, LAYOUTS, limit)
        except SourceError as err:
            sources.append({**entry, "ok": False, "error": str(err)})
            continue
        before = len(plan.jobs)
        plan_source(plan, config, source, read, seen)
        samples = Counter(job.ability for job in plan.jobs[before:])
        sources.append(
            {
                **entry,
                "ok": True,
                "error": None,
                "layout": read.report.layout or _layout_hint(LAYOUTS.get(source.reader, ())),
                "detected": read.report.detected or None,
                **_contents(read),
                "skipped": dict(read.report.skipped),
                "skip_examples": {cause: examples[:3] for cause, examples in read.report.examples.items()},
                "repaired": dict(read.report.repaired),
                "repair_examples": {fix: read.report.examples[fix][:3] for fix in read.report.repaired},
                "skip_rate": round(read.skip_rate, 4),
                "max_skip_fraction": limit,
                "samples": {a: samples[a] for a in config.abilities if samples[a]},
            }
        )
    totals = Counter(job.ability for job in plan.jobs)
    return {
        "ok": all(s["ok"] for s in sources),
        "samples": {a: totals[a] for a in config.abilities if totals[a]},
        "jobs": len(plan.jobs),
        "generator_skips": dict(plan.skips.most_common()),
        "sources": sources,
    }


def render_check(check: dict) -> str:
    lines = []
    for s in check["sources"]:
        head = f"{'ok  ' if s['ok'] else 'FAIL'} {s['reader']} split {s['split']} ({s['root']})"
        if not s["ok"]:
            lines += [head, f"     {s['error']}"]
            continue
        size = s["image_size"]
        counts = ", ".join(
            f"{s[key]:,} {key.replace('_', ' ')}"
            for key in (
                "objects",
                "referring_expressions",
                "questions",
                "graphs",
                "pairs",
                "change_labels",
                "change_captions",
                "semantic_masks",
            )
            if s[key]
        )
        lines += [head, f"     layout: {s['layout']}"] + ([f"     detected: {s['detected']}"] if s["detected"] else [])
        lines += [
            f"     {s['records']:,} records{', ' + counts if counts else ''}; images {size['min'][0]}x{size['min'][1]}"
            f" .. {size['max'][0]}x{size['max'][1]} px",
            f"     skipped ({100 * s['skip_rate']:.1f}%, limit {100 * s['max_skip_fraction']:.0f}%): "
            + _counts_line(s["skipped"], s["skip_examples"]),
            *_by_cause(s["skipped"], s["skip_examples"]),
            *(
                ["     repaired and kept: " + _counts_line(s["repaired"], s["repair_examples"])]
                if s["repaired"]
                else []
            ),
            *_by_cause(s["repaired"], s["repair_examples"]),
            "     class names outside the vocabulary: "
            + (", ".join(f"{n!r} {c:,}" for n, c in s["unknown_class_names"].items()) or "none"),
            "     samples: " + (", ".join(f"{a} {n:,}" for a, n in s["samples"].items()) or "none"),
        ]
    lines.append(
        f"{'OK' if check['ok'] else 'FAILED'}: {check['jobs']:,} jobs "
        f"({', '.join(f'{a} {n:,}' for a, n in check['samples'].items()) or 'none'})"
        + ("" if check["ok"] else f"; {sum(not s['ok'] for s in check['sources'])} source(s) would fail generate")
    )
    return "\n".join(lines)


def _by_cause(counts: dict[str, int], examples: dict[str, list[str]]) -> list[str]:
    """With two causes or more, one line per cause with its first example (the summary line shows one only)."""
    if len(counts) < 2:
        return []
    return [f"       {cause} {n:,}: e.g. {(examples.get(cause) or ['-'])[0][:160]}" for cause, n in counts.items()]


def _counts_line(counts: dict[str, int], examples: dict[str, list[str]]) -> str:
    """`bad_polygon 2, empty_file 1`, with the first example when there is one cause (several: `_by_cause` lines)."""
    return skips_line(ReadReport(skipped=counts, examples=examples if len(counts) == 1 else {}))


def first_failure(check: dict) -> str | None:
    failed = [s for s in check["sources"] if not s["ok"]]
    return failed[0]["error"] if failed else None
