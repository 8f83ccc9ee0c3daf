"""The four-stage tool-trace generator (paper §2.3.3) and the run that writes a dataset from it.

Per source annotation record and ability: (1) a natural user query and (2) the think turn (reasoning + the
tool call, params consistent with the annotation) come from one `plan` request; (3) the tool output is the
ground truth, produced by the annotation-backed backend (`geopilot.tools.annotations`), stored canonical in the
sample and rendered for the LLM only by `geopilot.wire.format_tool_turn`; (4) the grounded final answer comes
from one `answer` request. General understanding: GeoChat-Instruct dialogues (grounding-centred ones filtered
out) get a generated reasoning step per answer; SARLANG-1M captions become tool-free instruction dialogues.

Every reply is parsed and validated (`geopilot.data_gen.validate`); a failing reply is regenerated with the
failure named in the prompt, up to `max_regenerations` times, then the sample is dropped with its reason.
Run it with `geopilot generate --config configs/data_gen/<name>.yaml --out DIR`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from PIL import Image
from pydantic import Field, model_validator

from geopilot.config import StrictConfig
from geopilot.data_gen.abilities import (
    ABILITIES,
    GENERAL,
    Target,
    is_counting_centred,
    is_grounding_centred,
    plan_target,
    supports,
    vocabulary,
)
from geopilot.data_gen.chains import (
    CHAIN_KINDS,
    CHAIN_PREFIX,
    ChainsConfig,
    assign,
    chain_candidates,
    chain_messages,
    chain_targets,
    cloudy_record,
)
from geopilot.data_gen.journal import Journal, summary
from geopilot.data_gen.llm import LLMClient, LLMClientConfig, LLMRequest, OpenAIClient, PromptFile, load_prompts
from geopilot.data_gen.shards import RunLock, Shard, run_dir
from geopilot.data_gen.sources import SourceRead, read_source
from geopilot.data_gen.validate import (
    SEMANTIC,
    AnswerReply,
    Failure,
    PlanReply,
    check_answer,
    check_plan,
    first_cause,
    parse_reply,
)
from geopilot.errors import ConfigError
from geopilot.fileio import atomic_write, fingerprint
from geopilot.image import LoadedImage
from geopilot.records import AnnotationRecord, Dialogue
from geopilot.sample import IMAGE_PLACEHOLDER, Action, AssistantMessage, Sample, ToolMessage, UserMessage
from geopilot.tool_output import llm_view
from geopilot.tool_protocol import ToolRegistry
from geopilot.wire import dumps, format_tool_turn

# ---- config -----------------------------------------------------------------------------------------------------


class SourceConfig(StrictConfig):
    reader: str  # a key of geopilot.data_gen.readers.READERS, e.g. "dota"
    root: Path  # the dataset's root folder
    limit: int | None = Field(default=None, ge=1)  # use at most this many records (the first by record id)
    abilities: list[str] | None = None  # restrict this source to these abilities (default: the run's list)
    options: dict[str, Any] = {}  # keyword arguments of the reader, e.g. {split: train}
    max_skip_fraction: float | None = Field(default=None, ge=0, le=1)  # this source's own limit (default: the run's)


class GenerateConfig(StrictConfig):
    sources: list[SourceConfig] = Field(min_length=1)
    abilities: list[str] = Field(default_factory=lambda: list(ABILITIES))
    samples_per_record: int = Field(default=1, ge=1)  # tool samples per (record, ability)
    backend: LLMClientConfig = LLMClientConfig()  # the LLM client (the key keeps its released name)
    seed: int = 0
    shard_size: int = Field(default=1000, ge=1)
    max_regenerations: int = Field(default=3, ge=0)  # per stage; then the sample is dropped with its reason
    # a source skipping more than this fraction of its items is an error (geopilot.data_gen.sources)
    max_skip_fraction: float = Field(default=0.2, ge=0, le=1)
    chains: ChainsConfig = ChainsConfig()  # two-step tool chains, a share of each stage (geopilot.data_gen.chains)

    @model_validator(mode="after")
    def _known_abilities(self) -> GenerateConfig:
        unknown = sorted(
            {a for a in self.abilities + [a for s in self.sources for a in s.abilities or []] if a not in ABILITIES}
        )
        if unknown:
            raise ValueError(f"unknown abilities {unknown}; choose from {', '.join(ABILITIES)}")
        return self

    def content_settings(self) -> dict:
        """What decides the samples: everything but where and how fast they are fetched (the model counts)."""
        data = self.model_dump(mode="json")
        for key in LLMClientConfig.run_only_keys():
            data["backend"].pop(key)
        data.pop("max_skip_fraction")  # gates a run, never changes a sample
        if not self.chains.share:  # runs without chains keep the hash they had before chains existed
            data.pop("chains")
        for source in data["sources"]:
            source.pop("max_skip_fraction")
        return data

    def content_hash(self) -> str:
        return fingerprint(self.content_settings())


def build_llm_client(config: LLMClientConfig, cache_dir: Path) -> LLMClient:
    if config.kind == "template":
        from geopilot.data_gen.templates import TemplateClient

        return TemplateClient()
    api_key = None
    if config.api_key_env:
        api_key = os.environ.get(config.api_key_env)
        if not api_key:
            raise ConfigError(
                f"backend.api_key_env names {config.api_key_env!r}, but that environment variable is not set"
            )
    return OpenAIClient(config, api_key=api_key, cache_dir=cache_dir if config.cache else None)


# ---- jobs: one per sample id, in a fixed order ------------------------------------------------------------------


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


@dataclass
class Outcome:
    job: Job
    sample: Sample | None
    meta: dict

    def entry(self) -> dict:
        return {
            "id": self.job.sample_id,
            "index": self.job.index,
            "status": "kept" if self.sample is not None else "dropped",
            "sample": self.sample.model_dump(mode="json") if self.sample is not None else None,
            "meta": self.meta,
        }


class Dropped(Exception):
    """A sample that failed validation on every attempt (or whose annotation cannot make one)."""

    def __init__(self, cause: str, detail: str):
        self.cause, self.detail = cause, detail
        super().__init__(f"{cause}: {detail}")


class SampleGenerator:
    def __init__(
        self, llm: LLMClient, prompts: dict[str, PromptFile], seed: int, max_regenerations: int, out_dir: Path
    ):
        self.llm, self.prompts, self.seed = llm, prompts, seed
        self.max_attempts = max_regenerations + 1
        self._out_abs = os.path.abspath(out_dir)  # sample images are stored relative to the shards' folder

    async def generate(self, job: Job) -> Outcome:
        meta = {
            "backend": self.llm.name,
            "model": self.llm.model,
            "attempts": {},
            "regenerations": {},
            "first_pass": {},
            "prompt_versions": {},
            "retries": {},
            "cache_hits": 0,
            "drop_reason": None,
            "drop_detail": None,
        }
        try:
            if job.ability == GENERAL:
                sample = await self._general(job, meta)
            elif job.ability.startswith(CHAIN_PREFIX):
                sample = self._chain_sample(job, meta)
            else:
                sample = await self._tool_sample(job, meta)
        except Dropped as drop:
            meta["drop_reason"], meta["drop_detail"] = drop.cause, drop.detail[:500]
            return Outcome(job, None, meta)
        return Outcome(job, sample, meta)

    # -- the ask / validate / regenerate loop ---------------------------------------------------------------------
    async def _ask(self, job: Job, stage: str, facts: dict, values: dict, check, meta: dict):
        prompt = self.prompts[stage]
        meta["prompt_versions"][stage] = prompt.version
        feedback = ""
        failures: list[Failure] = []
        for attempt in range(self.max_attempts):
            messages = prompt.render({**values, "facts": dumps(facts), "feedback": feedback})
            request = LLMRequest(
                stage, messages, facts, derive_seed(self.seed, job.sample_id, stage, attempt), prompt.version
            )
            text, info = await self.llm.complete(request)
            meta["attempts"][stage] = attempt + 1
            meta["cache_hits"] += int(info.cached)
            for cause, n in info.retries.items():
                meta["retries"][cause] = meta["retries"].get(cause, 0) + n
            reply, parse_failure = parse_reply(stage, text)
            failures = [parse_failure] if parse_failure else check(reply)
            if attempt == 0:
                self._first_pass(meta, stage, reply, failures)
            if not failures:
                return reply
            worst = first_cause(failures)
            if attempt + 1 < self.max_attempts:
                meta["regenerations"][worst.cause] = meta["regenerations"].get(worst.cause, 0) + 1
            feedback = f"Your previous reply was rejected ({worst.cause}): {worst.detail[:300]}. Reply again, following every rule."
        worst = first_cause(failures)
        raise Dropped(worst.cause, worst.detail)

    @staticmethod
    def _first_pass(meta: dict, stage: str, reply, failures: list[Failure]) -> None:
        """Record the first attempt's result per semantic dimension this stage checks; a reply that does not even
        parse is a structural failure and is not judged semantically."""
        dims = {"plan": SEMANTIC[:3], "answer": SEMANTIC[3:], "caption_dialogue": SEMANTIC[:1], "reasoning": ()}[stage]
        causes = {f.cause for f in failures}
        for dim in dims if reply is not None else ():
            meta["first_pass"][dim] = dim not in causes
        meta["first_pass"][f"structural_{stage}"] = not (causes - set(SEMANTIC))

    # -- tool-augmented samples -------------------------------------------------------------------------------------
    def _registry(self, record: AnnotationRecord, root: Path) -> ToolRegistry:
        """The ten tools answering from `record` (provenance "annotations"): the same `ToolRegistry` that serves
        inference validates the plan's calls and runs the annotation's call."""
        from geopilot.tools.registry import annotation_registry

        return annotation_registry(record, root)

    async def _tool_sample(self, job: Job, meta: dict) -> Sample:
        record = job.record
        rng = random.Random(derive_seed(self.seed, job.sample_id, "target"))
        target = plan_target(job.ability, record, rng)
        registry = self._registry(target.record, job.root)
        tool = registry.get(target.tool)
        facts = {
            "stage": "plan",
            "sample_id": job.sample_id,
            "ability": job.ability,
            "difficulty": target.difficulty,
            "modality": record.modality,
            "source": record.source,
            "tool": target.tool,
            "params": target.params,
            **target.facts,
        }
        values = {
            "tool": target.tool,
            "tool_description": tool.description,
            "difficulty": target.difficulty,
            "params": dumps(target.params),
            "schema": _schema_text(tool.params_model),
            "modality": record.modality,
            "source": record.source,
            "ability": job.ability,
        }
        plan: PlanReply = await self._ask(
            job, "plan", facts, values, lambda r: check_plan(r, target, record.modality, registry), meta
        )
        action = Action(tool=target.tool, params=target.params)  # the annotation's canonical spelling
        result = registry.call(action, self._image(job), record.modality)
        if not result.ok:
            raise Dropped("annotation_unusable", str(result.error))
        output = result.output
        meta["tool_provenance"] = output.provenance
        query = " ".join(plan.query.replace(IMAGE_PLACEHOLDER, " ").split())  # the sample adds the one placeholder
        answer_facts = {
            "stage": "answer",
            "sample_id": job.sample_id,
            "ability": job.ability,
            "tool": target.tool,
            "params": target.params,
            "query": query,
            "view": llm_view(output),
        }
        answer_values = {
            "tool": target.tool,
            "query": query,
            "tool_turn": format_tool_turn([(target.tool, output)], query),
        }
        names = vocabulary(record)
        answer: AnswerReply = await self._ask(
            job, "answer", answer_facts, answer_values, lambda r: check_answer(r, output, target, names, query), meta
        )
        messages = [
            UserMessage(content=f"{IMAGE_PLACEHOLDER}\n{query}"),
            AssistantMessage(reasoning=plan.reasoning.strip(), actions=[action], value=None),
            ToolMessage(name=target.tool, content=output),
            AssistantMessage(reasoning=answer.reasoning.strip(), actions=[], value=answer.answer.strip()),
        ]
        return self._sample(job, target, messages)

    def _chain_sample(self, job: Job, meta: dict) -> Sample:
        """A two-step chain trace (geopilot.data_gen.chains); a cloud chain's cloudy image is written under the
        output folder (`chain_images/`), its clean original stays the cloud-free image."""
        kind = job.ability[len(CHAIN_PREFIX) :]
        record = job.record
        if kind == "cloud_detection":
            name = job.sample_id.replace("/", "_")
            record = cloudy_record(record, Path(self._out_abs) / "chain_images", name, derive_seed(self.seed, name))
        rng = random.Random(derive_seed(self.seed, job.sample_id, "chain"))
        chain_job = Job(job.index, job.sample_id, record, job.root, job.ability, job.k)
        try:
            messages = chain_messages(kind, record, self._image(chain_job), rng)
        except ValueError as err:  # the annotation cannot make this chain (a tool of it has no ground truth)
            raise Dropped("annotation_unusable", str(err)) from None
        meta["tool_provenance"] = "annotations"
        meta["chain"] = kind
        return self._sample(chain_job, None, messages)

    @staticmethod
    def _image_path(job: Job) -> Path:
        image = Path(job.record.image)
        return image if image.is_absolute() else job.root / image

    def _image(self, job: Job) -> LoadedImage:
        """The record's image for the tool call, its header read and the file closed again: the annotation tools
        read no pixels, only the size the registry checks against `max_pixels` (decoding a large scene per sample
        would stall the event loop)."""
        path = self._image_path(job)
        try:
            with Image.open(path) as header:
                pass
        except OSError as err:
            raise Dropped("annotation_unusable", f"image {path} cannot be opened: {err}") from None
        return LoadedImage(image=header, source_size=header.size)

    def _sample(self, job: Job, target: Target | None, messages: list) -> Sample:
        image = self._image_path(job)
        try:
            return Sample(
                id=job.sample_id,
                image=os.path.relpath(os.path.abspath(image), self._out_abs),
                modality=job.record.modality,
                source=job.record.source,
                ability=job.ability,
                difficulty=target.difficulty if target is not None else None,
                messages=messages,
            )
        except ValueError as err:  # pydantic's ValidationError: a sample that breaks the schema is never kept
            raise Dropped("sample_schema", str(err)) from None

    # -- general understanding (tool-free) --------------------------------------------------------------------------
    async def _general(self, job: Job, meta: dict) -> Sample:
        dialogue = job.record.dialogues[job.k]
        turns = [(role, text.replace(IMAGE_PLACEHOLDER, "").strip()) for role, text in dialogue.turns]
        facts = {"stage": "", "sample_id": job.sample_id, "source": job.record.source}
        values = {"source": job.record.source}
        if dialogue_kind(dialogue) == "caption":
            caption = next((text for role, text in reversed(turns) if role == "assistant"), turns[-1][1])
            facts.update(stage="caption_dialogue", caption=caption)
            reply = await self._ask(job, "caption_dialogue", facts, values, _check_caption_dialogue, meta)
            pairs = [(reply.query.strip(), reply.reasoning.strip(), caption)]
        else:
            while turns and turns[-1][0] != "assistant":
                turns.pop()
            roles = [role for role, _ in turns]
            if not turns or roles != ["user", "assistant"] * (len(turns) // 2):
                raise Dropped("malformed_dialogue", f"turns must alternate user/assistant, got {roles}")
            facts.update(stage="reasoning", turns=[list(t) for t in turns])
            n = len(turns) // 2
            reply = await self._ask(
                job, "reasoning", facts, {**values, "turns": str(n)}, lambda r: _check_reasoning(r, n), meta
            )
            pairs = [(turns[2 * i][1], reply.reasoning[i].strip(), turns[2 * i + 1][1]) for i in range(n)]
        messages = []
        for i, (question, reasoning, answer) in enumerate(pairs):
            messages.append(UserMessage(content=f"{IMAGE_PLACEHOLDER}\n{question}" if i == 0 else question))
            messages.append(AssistantMessage(reasoning=reasoning, actions=[], value=answer))
        return self._sample(job, None, messages)


@cache
def _schema_text(params_model) -> str:
    return dumps(params_model.model_json_schema())


def _check_caption_dialogue(reply) -> list[Failure]:
    words = reply.query.split()
    if not 2 <= len(words) <= 80 or "{" in reply.query:
        return [Failure("query_answerability", f"query {reply.query[:80]!r} is not a short natural request")]
    return []


def _check_reasoning(reply, turns: int) -> list[Failure]:
    if len(reply.reasoning) != turns or not all(r.strip() for r in reply.reasoning):
        return [Failure("reply_schema", f"expected {turns} non-empty reasoning strings, got {len(reply.reasoning)}")]
    return []


# ---- the run ------------------------------------------------------------------------------------------------------


async def run_jobs(jobs: list[Job], generator: SampleGenerator, on_done, workers: int) -> None:
    """Run jobs with `workers` in flight; the first fatal error (endpoint down) cancels the rest and propagates."""
    pending = iter(jobs)

    async def worker() -> None:
        for job in pending:  # one shared iterator: every job is taken exactly once
            await on_done(await generator.generate(job))

    tasks = [asyncio.create_task(worker()) for _ in range(max(1, min(workers, len(jobs))))]
    done, rest = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)
    for task in done:
        if task.exception() is not None:
            raise task.exception()


@dataclass
class RunResult:
    manifest: dict
    report: dict
    new: int  # jobs finished in this invocation
    resumed: int  # jobs found done in the journal
    seconds: float  # wall time of the generation phase (reading sources and writing outputs not included)


def generate_dataset(
    config: GenerateConfig, out_dir: Path, readers: dict | None = None, progress=None, shard: Shard | None = None
) -> RunResult:
    """Plan, generate what the journal lacks, and write shards + manifest + report. Safe to rerun after a kill.
    With `shard`, only the jobs of that shard (`geopilot.data_gen.shards`); `geopilot generate merge` joins them."""
    from geopilot.data_gen.report import build_report, plan_facts, write_report

    out_dir = Path(out_dir)
    identity = run_dir(out_dir, config, shard)
    identity.check()
    prompts = load_prompts()
    plan = plan_jobs(config, readers)  # a source that gives nothing fails here, before anything is written
    facts = plan_facts(plan)
    jobs = plan.jobs if shard is None else [job for job in plan.jobs if shard.holds(job.sample_id)]
    out_dir.mkdir(parents=True, exist_ok=True)
    with RunLock(out_dir):
        identity.claim()
        atomic_write(out_dir / "plan.json", json.dumps(facts, indent=2, ensure_ascii=False) + "\n")
        journal = Journal(out_dir / "journal")
        entries = journal.recover()
        todo = [job for job in jobs if job.sample_id not in entries]
        resumed = len(jobs) - len(todo)
        llm = build_llm_client(config.backend, out_dir / "llm_cache")
        generator = SampleGenerator(llm, prompts, config.seed, config.max_regenerations, out_dir)
        new = 0

        async def on_done(outcome: Outcome) -> None:
            nonlocal new
            entry = outcome.entry()
            await journal.commit(outcome.job.index // config.shard_size, entry)
            entries[entry["id"]] = summary(entry)
            new += 1
            if progress is not None:
                progress(resumed + new, len(jobs))

        async def main() -> None:
            try:
                await run_jobs(todo, generator, on_done, llm.concurrency)
            finally:
                await llm.aclose()

        start = time.perf_counter()
        try:
            asyncio.run(main())
        finally:  # what finished is written out even when the endpoint went down
            seconds = time.perf_counter() - start
            journal.close()
            backend = {"kind": llm.name, "model": llm.model}
            prompt_versions = {name: p.version for name, p in prompts.items()}
            placed = [(job.index, job.sample_id) for job in jobs]
            manifest = write_shards(out_dir, config, placed, journal.read_shard, backend, prompt_versions, shard, facts)
            report = build_report(
                facts,
                [sample_id for _, sample_id in placed],
                entries,
                config,
                manifest,
                torn_lines=journal.torn_lines,
                corrupt_lines=journal.corrupt_lines,
            )
            write_report(out_dir, report)
    return RunResult(manifest, report, new, resumed, seconds)


def write_shards(
    out_dir: Path,
    config: GenerateConfig,
    placed: list[tuple[int, str]],
    read_bucket,
    backend: dict,
    prompt_versions: dict,
    shard: Shard | None,
    facts: dict,
) -> dict:
    """Rebuild `shard-NNNNN.jsonl` (samples) and `provenance/shard-NNNNN.jsonl` (per-sample meta) in job order,
    one file (`shard_size` consecutive job indices) at a time from `read_bucket(n)` (its journal entries by id);
    every kept sample is re-validated against the schema on the way. `placed`: (job index, sample id) in order."""
    (out_dir / "provenance").mkdir(exist_ok=True)
    by_bucket: dict[int, list[str]] = {}
    for index, sample_id in placed:
        by_bucket.setdefault(index // config.shard_size, []).append(sample_id)
    shards, invalid = [], 0
    for bucket, sample_ids in sorted(by_bucket.items()):
        entries = read_bucket(bucket)
        done = [entries[i] for i in sample_ids if i in entries]
        kept = []
        for entry in done:
            if entry["status"] != "kept":
                continue
            try:
                Sample.model_validate(entry["sample"])
            except ValueError:
                invalid += 1
                continue
            kept.append(json.dumps(entry["sample"], ensure_ascii=False) + "\n")
        meta = [
            json.dumps({"id": e["id"], "status": e["status"], **e["meta"]}, ensure_ascii=False) + "\n" for e in done
        ]
        name = f"shard-{bucket:05d}.jsonl"
        text = "".join(kept)
        atomic_write(out_dir / name, text)
        atomic_write(out_dir / "provenance" / name, "".join(meta))
        shards.append(
            {
                "path": name,
                "samples": len(kept),
                "dropped": len(done) - len(kept),
                "pending": len(sample_ids) - len(done),
                "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
            }
        )
    pending = sum(s["pending"] for s in shards)
    manifest = {
        "complete": pending == 0,
        "samples": sum(s["samples"] for s in shards),
        "dropped": sum(s["dropped"] for s in shards),
        "pending": pending,
        "schema_invalid": invalid,  # kept in the journal but failing the schema now: left out of the shards
        "jobs": len(placed),
        "jobs_total": facts["jobs_total"],  # of the whole run (all shards)
        "shard": str(shard) if shard else None,
        "shards": shards,
        "config_hash": config.content_hash(),
        "config": config.model_dump(mode="json"),
        "backend": backend,
        "prompt_versions": prompt_versions,
        "tool_outputs": "ground truth via the annotation-backed backend (geopilot.tools.annotations), provenance 'annotations'",
    }
    atomic_write(out_dir / "manifest.json", json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest
