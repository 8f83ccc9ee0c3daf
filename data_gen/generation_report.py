"""The statistics of a generation run, in the paper's terms: `report.json` and a readable `report.md`.

Per-source and per-ability counts in the layout of Table 2, the optical/SAR split, the regeneration rate by
cause (paper §2.3.4: "approximately 1.2% of samples required at least one regeneration"), first-pass validity per
semantic dimension, drops by reason, HTTP retries by cause, reader / generator skips by cause, and the class names
in no vocabulary (`geopilot.vocabulary`): readers keep such names verbatim, and this report counts them per source.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from geopilot.data_gen.abilities import ABILITIES, GENERAL, class_names
from geopilot.data_gen.chains import CHAIN_KINDS, CHAIN_PREFIX
from geopilot.data_gen.validate import SEMANTIC
from geopilot.fileio import atomic_write
from geopilot.vocabulary import is_known_class

MODALITY_TITLES = {"optical": "Optical Imagery Tasks", "sar": "SAR Tasks"}


def _pct(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 2) if whole else 0.0


def unknown_class_names(plan) -> dict[str, dict[str, int]]:
    """Per source: class names (objects, semantic classes) on the planned records that no vocabulary knows, with
    how often each occurs. Records planned only for tool-free dialogues are left out (their labels are phrases)."""
    records = {}
    for job in plan.jobs:
        if job.ability != GENERAL:
            records[(job.record.source, job.record.record_id)] = job.record
    found: dict[str, Counter] = defaultdict(Counter)
    for (source, _), record in sorted(records.items()):
        found[source].update(name for name in class_names(record) if not is_known_class(name))
    return {source: dict(counts.most_common()) for source, counts in sorted(found.items()) if counts}


def plan_facts(plan) -> dict:
    """What the report needs of the whole plan, beyond the jobs' own entries: every shard of a run computes the same
    facts (each plans the whole run), stores them in `plan.json`, and `geopilot generate merge` reports them once."""
    return {
        "jobs_total": len(plan.jobs),
        "read_reports": plan.read_reports,
        "generator_skips": dict(plan.skips.most_common()),
        "unknown_class_names": unknown_class_names(plan),
    }


def build_report(
    facts: dict,
    job_ids: list[str],
    entries: dict[str, dict],
    config,
    manifest: dict,
    torn_lines: int = 0,
    corrupt_lines: int = 0,
) -> dict:
    """`facts`: `plan_facts(plan)`; `job_ids`: the jobs this report covers, in job order; `entries`: journal
    summaries by sample id (`geopilot.data_gen.journal.summary`)."""
    done = [entries[sample_id] for sample_id in job_ids if sample_id in entries]
    kept = [e for e in done if e["status"] == "kept"]

    cells: dict[tuple[str, str], dict] = defaultdict(lambda: {"size": 0, "sources": set(), "tools": set()})
    per_source: dict[str, Counter] = defaultdict(Counter)
    modality = Counter()
    chains: dict[str, Counter] = defaultdict(Counter)  # chain kind -> modality -> samples
    for entry in kept:
        per_source[entry["source"]][entry["ability"]] += 1
        modality[entry["modality"]] += 1
        if entry["ability"].startswith(CHAIN_PREFIX):
            chains[entry["ability"][len(CHAIN_PREFIX) :]][entry["modality"]] += 1
            continue
        cell = cells[(entry["modality"], entry["ability"])]
        cell["size"] += 1
        cell["sources"].add(entry["source"])
        cell["tools"] |= set(entry["tools"])
    ability_order = list(ABILITIES)
    table2 = [
        {
            "modality": mod,
            "ability": ABILITIES[ability].title,
            "tools": sorted(cell["tools"]) or ["-"],
            "sources": sorted(cell["sources"]),
            "size": cell["size"],
        }
        for (mod, ability), cell in sorted(
            cells.items(), key=lambda kv: (kv[0][0] != "optical", ability_order.index(kv[0][1]))
        )
    ]

    regenerated = Counter()  # cause -> regenerations
    samples_by_cause = Counter()  # cause -> samples regenerated at least once for it
    for entry in done:
        for cause, n in entry["meta"]["regenerations"].items():
            regenerated[cause] += n
            samples_by_cause[cause] += 1
    any_regen = sum(1 for e in done if e["meta"]["regenerations"])
    structural_regen = sum(1 for e in done if any(c not in SEMANTIC for c in e["meta"]["regenerations"]))

    validity = {}
    for dim in SEMANTIC:
        judged = [e["meta"]["first_pass"][dim] for e in done if dim in e["meta"]["first_pass"]]
        validity[dim] = {"passed": sum(judged), "judged": len(judged), "pct": _pct(sum(judged), len(judged))}
    full = [e for e in done if all(d in e["meta"]["first_pass"] for d in SEMANTIC)]
    overall = sum(1 for e in full if all(e["meta"]["first_pass"][d] for d in SEMANTIC))
    validity["overall"] = {"passed": overall, "judged": len(full), "pct": _pct(overall, len(full))}

    retries = Counter()
    for entry in done:
        retries.update(entry["meta"].get("retries", {}))
    reader_skips = {name: r["skipped"] for name, r in facts["read_reports"].items()}
    return {
        "jobs": len(job_ids),
        "finished": len(done),
        "kept": len(kept),
        "dropped": len(done) - len(kept),
        "pending": len(job_ids) - len(done),
        "complete": len(done) == len(job_ids),
        "schema_invalid_kept": manifest["schema_invalid"],
        "backend": {
            "kind": config.backend.kind,
            "model": config.backend.model if config.backend.kind == "openai" else "templates",
        },
        "table2": table2,
        "total": len(kept),
        "per_source": {source: dict(counts) for source, counts in sorted(per_source.items())},
        "per_ability": dict(
            sorted(
                Counter(e["ability"] for e in kept if e["ability"] in ABILITIES).items(),
                key=lambda kv: ability_order.index(kv[0]),
            )
        ),
        "chains": {
            "by_kind": {kind: dict(chains[kind]) for kind in CHAIN_KINDS if kind in chains},
            "share_pct": {mod: _pct(sum(c[mod] for c in chains.values()), modality[mod]) for mod in ("optical", "sar")},
            "configured_share_pct": round(100 * config.chains.share, 2),
        },
        "modality_split": {
            mod: {"samples": modality[mod], "pct": _pct(modality[mod], len(kept))} for mod in ("optical", "sar")
        },
        "regeneration": {
            "samples_regenerated": any_regen,
            "rate_pct": _pct(any_regen, len(done)),
            "structural_rate_pct": _pct(structural_regen, len(done)),
            "regenerations_by_cause": dict(regenerated.most_common()),
            "samples_by_cause": dict(samples_by_cause.most_common()),
        },
        "first_pass_validity": validity,
        "dropped_by_reason": dict(
            Counter(e["meta"]["drop_reason"] for e in done if e["status"] == "dropped").most_common()
        ),
        "http_retries_by_cause": dict(retries.most_common()),
        "cache_hits": sum(e["meta"].get("cache_hits", 0) for e in done),
        "reader_records": {name: r["records"] for name, r in facts["read_reports"].items()},
        "reader_skips_by_cause": reader_skips,
        "reader_repairs": {name: r.get("repaired", {}) for name, r in facts["read_reports"].items()},
        "generator_skips_by_cause": facts["generator_skips"],
        "unknown_class_names": facts["unknown_class_names"],
        "journal_torn_lines_repaired": torn_lines,
        "journal_corrupt_lines_skipped": corrupt_lines,
    }


def render_markdown(report: dict) -> str:
    lines = ["# Generation report", ""]
    state = (
        "complete" if report["complete"] else f"INCOMPLETE: {report['pending']} jobs pending (rerun the same command)"
    )
    lines += [
        f"{report['kept']} samples kept, {report['dropped']} dropped, of {report['jobs']} jobs ({state}); "
        f"backend: {report['backend']['kind']} ({report['backend']['model']}); kept samples failing the schema: {report['schema_invalid_kept']}.",
        "",
        "## Abilities and sources (layout of Table 2)",
        "",
        "| | Abilities | Tools | Source | Size |",
        "|---|---|---|---|---:|",
    ]
    previous = None
    for row in report["table2"]:
        group = MODALITY_TITLES[row["modality"]] if row["modality"] != previous else ""
        previous = row["modality"]
        lines.append(
            f"| {group} | {row['ability']} | {', '.join(row['tools'])} | {', '.join(row['sources'])} | {row['size']:,} |"
        )
    lines += [f"| Total | - | - | - | {report['total']:,} |", ""]
    split = report["modality_split"]
    chains = report["chains"]
    lines += [
        f"Optical: {split['optical']['samples']:,} ({split['optical']['pct']}%); SAR: {split['sar']['samples']:,} ({split['sar']['pct']}%).",
        "",
        f"Two-step tool chains (configured share {chains['configured_share_pct']}% of each stage): "
        + (
            "; ".join(
                f"{kind} " + ", ".join(f"{mod} {n:,}" for mod, n in counts.items())
                for kind, counts in chains["by_kind"].items()
            )
            or "none"
        )
        + f" (share: optical {chains['share_pct']['optical']}%, SAR {chains['share_pct']['sar']}%).",
        "",
        "## Per source",
        "",
        "| Source | Ability | Samples |",
        "|---|---|---:|",
    ]
    for source, counts in report["per_source"].items():
        for ability, n in counts.items():
            lines.append(f"| {source} | {ability} | {n:,} |")
    regen = report["regeneration"]
    lines += [
        "",
        "## Quality control",
        "",
        f"Samples regenerated at least once: {regen['samples_regenerated']:,} ({regen['rate_pct']}%); "
        f"for a structural cause: {regen['structural_rate_pct']}%.",
        "",
        "| Regeneration cause | Regenerations | Samples |",
        "|---|---:|---:|",
    ]
    for cause, n in regen["regenerations_by_cause"].items():
        lines.append(f"| {cause} | {n:,} | {regen['samples_by_cause'][cause]:,} |")
    lines += ["", "| First-pass validity | Passed | Judged | % |", "|---|---:|---:|---:|"]
    for dim, v in report["first_pass_validity"].items():
        lines.append(f"| {dim} | {v['passed']:,} | {v['judged']:,} | {v['pct']} |")
    lines += ["", "## Drops, retries and skips", ""]
    lines += [_counts_line("Dropped by reason", report["dropped_by_reason"])]
    lines += [
        _counts_line("HTTP retries by cause", report["http_retries_by_cause"])
        + f"; cache hits: {report['cache_hits']:,}"
    ]
    for name, skips in report["reader_skips_by_cause"].items():
        lines.append(_counts_line(f"Reader `{name}` ({report['reader_records'][name]:,} records) skipped", skips))
        if report.get("reader_repairs", {}).get(name):
            lines.append(_counts_line(f"Reader `{name}` repaired and kept", report["reader_repairs"][name]))
    lines.append(_counts_line("Generator skipped", report["generator_skips_by_cause"]))
    unknown = report["unknown_class_names"]
    lines.append(
        "- Class names in no vocabulary (kept verbatim): "
        + (
            "; ".join(
                f"`{source}` " + ", ".join(f"{name!r} {n:,}" for name, n in names.items())
                for source, names in unknown.items()
            )
            or "none"
        )
    )
    return "\n".join(lines) + "\n"


def _counts_line(title: str, counts: dict) -> str:
    body = ", ".join(f"{cause} {n:,}" for cause, n in counts.items()) or "none"
    return f"- {title}: {body}"


def write_report(out_dir: Path, report: dict) -> None:
    atomic_write(Path(out_dir) / "report.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    atomic_write(Path(out_dir) / "report.md", render_markdown(report))
