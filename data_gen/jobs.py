"""What a generation run will do, before any LLM request: the sources read (`read_sources`), and per record and
ability the jobs of the run, in a stable order with their seeds (`plan_jobs`, `Plan`); two-step chain jobs are a
seeded share of each stage. `geopilot generate check` plans the same way without generating."""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from geopilot.data_gen.abilities import (
    GENERAL,
    is_counting_centred,
    is_grounding_centred,
    supports,
)
from geopilot.data_gen.chains import (
    CHAIN_KINDS,
    CHAIN_PREFIX,
    assign,
    chain_candidates,
    chain_targets,
)
from geopilot.data_gen.generate_config import GenerateConfig, SourceConfig
from geopilot.data_gen.sources import SourceRead, read_source
from geopilot.errors import ConfigError
from geopilot.records import AnnotationRecord, Dialogue


@dataclass(frozen=True)
class Job:
    index: int  # position in the run's job order (decides the shard and the order within it)
    sample_id: str  # "<source>/<record_id>/<ability>/<k>"
    record: AnnotationRecord
    root: Path
    ability: str
    k: int


@dataclass
class Plan:
    jobs: list[Job]
    read_reports: dict[str, dict]  # source name -> {"records": n, "skipped": {cause: n}, "repaired": {fix: n}}
    skips: Counter = field(default_factory=Counter)  # generator-side skips by cause


def source_slug(source: str) -> str:
    return "-".join(source.lower().split())


def dialogue_kind(dialogue: Dialogue) -> str:
    """Is this a caption to turn into an instruction dialogue ("caption"), or Q/A turns to reason about ("dialogue")?"""
    has_user = any(role == "user" for role, _ in dialogue.turns)
    return "caption" if dialogue.task.lower() == "caption" or not has_user else "dialogue"


def read_sources(config: GenerateConfig, readers: dict | None = None) -> list[SourceRead]:
    """Every source of the config through `read_source`: the first one that would give nothing is a SourceError."""
    from geopilot.data_gen.readers import LAYOUTS
    from geopilot.data_gen.readers import READERS as default_readers

    readers = default_readers if readers is None else readers
    reads = []
    for source in config.sources:
        if source.reader not in readers:
            raise ConfigError(f"unknown reader {source.reader!r}; available: {', '.join(readers)}")
        limit = config.max_skip_fraction if source.max_skip_fraction is None else source.max_skip_fraction
        reads.append(read_source(source.reader, source.root, source.options, readers, LAYOUTS, limit))
    return reads


def source_key(read: SourceRead, taken: dict) -> str:
    return read.reader if read.reader not in taken else f"{read.reader}:{read.root}"


def plan_jobs(config: GenerateConfig, readers: dict | None = None, reads: list[SourceRead] | None = None) -> Plan:
    """The run's jobs in their fixed order; `reads` (one per source, as `read_sources` returns) skips re-reading."""
    plan = Plan(jobs=[], read_reports={})
    seen: set[str] = set()
    for source, read in zip(config.sources, reads or read_sources(config, readers), strict=True):
        report = read.report
        plan.read_reports[source_key(read, plan.read_reports)] = {
            "records": report.records,
            "skipped": dict(report.skipped),
            "repaired": dict(report.repaired),
        }
        plan_source(plan, config, source, read, seen)
    if config.chains.share:
        plan_chains(plan, config)
    return plan


def plan_chains(plan: Plan, config: GenerateConfig) -> None:
    """Append the chain jobs: per stage (modality) `chains.share` of its samples, round-robin over the chain kinds
    whose records the sources hold (geopilot.data_gen.chains)."""
    from geopilot.data_gen.chains import _absolute

    records = {(j.record.source, j.record.record_id): _absolute(j.record, j.root) for j in plan.jobs}
    candidates = chain_candidates(list(records.values()), config.chains.kinds)
    for modality, target in chain_targets(Counter(j.record.modality for j in plan.jobs), config.chains.share).items():
        mine = {k: c for k, c in candidates.items() if CHAIN_KINDS[k].modality == modality}
        for kind, record, k in assign(mine, target, config.samples_per_record):
            sample_id = f"{source_slug(record.source)}/{record.record_id}/{CHAIN_PREFIX}{kind}/{k}"
            plan.jobs.append(Job(len(plan.jobs), sample_id, record, Path(record.image).parent, CHAIN_PREFIX + kind, k))


def plan_source(plan: Plan, config: GenerateConfig, source: SourceConfig, read: SourceRead, seen: set[str]) -> None:
    """Append one source's jobs to `plan` (ids in `seen` are duplicates and skipped)."""
    records = sorted(read.records, key=lambda r: r.record_id)[: source.limit]
    abilities = [a for a in config.abilities if source.abilities is None or a in source.abilities]
    for record in records:
        used = 0
        for ability in abilities:
            if not supports(ability, record):
                continue
            if ability == GENERAL:
                ks = []
                for k, dialogue in enumerate(record.dialogues):
                    if (
                        record.modality == "optical"
                        and dialogue_kind(dialogue) == "dialogue"
                        and is_grounding_centred(dialogue)
                    ):
                        plan.skips["grounding_centred"] += 1
                    elif is_counting_centred(dialogue):
                        plan.skips["counting_centred"] += 1
                    else:
                        ks.append(k)
            else:
                ks = list(range(config.samples_per_record))
            for k in ks:
                sample_id = f"{source_slug(record.source)}/{record.record_id}/{ability}/{k}"
                if sample_id in seen:
                    plan.skips["duplicate_record_id"] += 1
                    continue
                seen.add(sample_id)
                plan.jobs.append(Job(len(plan.jobs), sample_id, record, Path(source.root), ability, k))
                used += 1
        if not used:
            plan.skips["no_usable_annotation"] += 1


# ---- one sample ---------------------------------------------------------------------------------------------------


def derive_seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()[:4], "big")
