"""A generation run: the jobs planned (geopilot.data_gen.jobs), each generated (geopilot.data_gen.sample_generator)
through the LLM client, resumable from its journal, written as JSONL shards with a manifest and a report.

Run it with `geopilot generate --config configs/data_gen/<name>.yaml --out DIR`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from geopilot.data_gen.generate_config import GenerateConfig
from geopilot.data_gen.jobs import Job, plan_jobs
from geopilot.data_gen.journal import Journal, summary
from geopilot.data_gen.llm import LLMClient, LLMClientConfig, OpenAIClient, load_prompts
from geopilot.data_gen.sample_generator import Outcome, SampleGenerator
from geopilot.data_gen.shards import RunLock, Shard, run_dir
from geopilot.errors import ConfigError
from geopilot.fileio import atomic_write
from geopilot.sample import Sample


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
    from geopilot.data_gen.generation_report import build_report, plan_facts, write_report

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
