"""A benchmark run: every case x every seed through one agent, scored, appended to `DIR/results.jsonl`.

The folder is a `geopilot.run_dir.RunDir`: `run.json` records the run's config (agent settings, prompt hash,
case-file hash, tool layer, scorer version), and a different config in the same DIR is refused naming what differs.
The log is append-only and resumable: each row carries the config's fingerprint and the prompt hash; re-running the
same command skips the (case, seed) pairs already there, so a killed run finishes without duplicate rows. After the loop the reports are rewritten from the log: `cases.csv`, `summary.json`,
`leaderboard.md` and `leaderboard.png` (geopilot.eval.benchmark_report). A suite shipping reference captions (change_v1)
also gets its captioning answers' caption metrics per seed in `summary.json["captions"]`.

`batch_size` > 1 with an agent that has `run_batch(cases, images_per_case, seed)` (GeoPilotAgent: one
`GeoPilot.chat_batch`) runs the missing cases in chunks of up to that many sharing (seed, max_rounds); the rows are the
same rows, appended as each chunk finishes. It is then part of the run's config: batched decoding pads rows, so its
floats, and rarely its tokens, can differ from one case at a time, and one folder never mixes the two. At 1 (or with
an agent without `run_batch`) the config, and so the fingerprint of every existing folder, is what it always was.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

from geopilot.errors import GeoPilotInputError
from geopilot.eval.benchmark_report import write_reports
from geopilot.eval.cases import DIFFICULTIES, Case, CaseSet
from geopilot.eval.metrics import summarise
from geopilot.eval.results_log import RESULTS, read_rows
from geopilot.eval.scorer import score
from geopilot.fileio import append_jsonl
from geopilot.run_dir import RunDir

SCORER_VERSION = "1"
RUN_RECORD = "run.json"  # the folder's settings (geopilot.run_dir)


def released_run(out: Path, config: dict) -> dict | None:
    """The config of a folder written before run.json: its rows carry the sha256 of the canonical config JSON, so
    one whose rows all carry this config's is this run; another is named from its summary.json, else refused."""
    rows = read_rows(out / RESULTS)
    if not rows:
        return None
    hashes = {row.get("config_hash") for row in rows}
    if hashes == {_released_hash(config)}:
        return config
    try:
        recorded = json.loads((out / "summary.json").read_text(encoding="utf-8")).get("config")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if isinstance(recorded, dict) and {_released_hash(recorded)} == hashes:
        return recorded
    raise GeoPilotInputError(
        f"{str(out)!r} holds results of another configuration (config hash {sorted(map(str, hashes))[0][:12]}, "
        "written before run folders recorded their settings); use a new --out folder"
    )


def _released_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def run_benchmark(
    agent,
    case_set: CaseSet,
    seeds: list[int],
    out: str | Path,
    tool_layer: str,
    label: str,
    category_order: list[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    batch_size: int = 1,
) -> dict:
    """Run what is missing from DIR/results.jsonl, then write the reports; returns summary.json's content.
    `progress(done, total)` is called once per finished case."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise GeoPilotInputError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
    batched = batch_size > 1 and hasattr(agent, "run_batch")
    out = Path(out)
    results = out / RESULTS
    config = {
        **agent.config,
        "prompt_hash": agent.prompt_hash,
        "cases_sha256": case_set.sha256,
        "tool_layer": tool_layer,
        "scorer": SCORER_VERSION,
        **({"batch_size": batch_size} if batched else {}),
    }
    run_dir = RunDir(out, config, RUN_RECORD, "benchmark run", legacy=lambda folder, _: released_run(folder, config))
    run_dir.claim()
    config_hash = run_dir.fingerprint
    existing = read_rows(results)
    done = {(row["case_id"], row["seed"]) for row in existing}
    todo = [(seed, case) for seed in seeds for case in case_set.cases if (case.id, seed) not in done]
    chunks = batch_chunks(todo, batch_size) if batched else [(seed, [case]) for seed, case in todo]
    finished = 0
    for seed, cases in chunks:
        images = [case_set.image_paths(case) for case in cases]
        runs = agent.run_batch(cases, images, seed) if batched else [agent.run(cases[0], images[0], seed)]
        for case, run in zip(cases, runs, strict=True):
            scored = score(case, run)
            append_jsonl(
                results,
                [
                    {
                        "case_id": case.id,
                        "seed": seed,
                        "category": case.category,
                        "difficulty": case.difficulty,
                        "modality": case.modality,
                        "agent": label,
                        "config_hash": config_hash,
                        "prompt_hash": agent.prompt_hash,
                        "cases_sha256": case_set.sha256,
                        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                        "run": run.model_dump(mode="json"),
                        "score": scored.model_dump(mode="json"),
                    }
                ],
            )
            finished += 1
            if progress is not None:
                progress(finished, len(todo))
    ids = {case.id for case in case_set.cases}
    rows = [row for row in read_rows(results) if row["case_id"] in ids and row["seed"] in seeds]
    order = category_order or list(dict.fromkeys(case.category for case in case_set.cases))
    summary = summarise(rows, order, list(DIFFICULTIES))
    summary.update(
        {
            "agent": label,
            "config": config,
            "config_hash": config_hash,
            "prompt_hash": agent.prompt_hash,
            "cases_file": str(case_set.path),
            "cases_sha256": case_set.sha256,
        }
    )
    captions = caption_scores(case_set, results, seeds)
    if captions is not None:
        summary["captions"] = captions
    write_reports(out, rows, summary)
    return summary


def batch_chunks(todo: list[tuple[int, Case]], size: int) -> list[tuple[int, list[Case]]]:
    """(seed, cases) chunks of up to `size` cases sharing seed and max_rounds (`GeoPilot.chat_batch` takes one
    max_rounds; a chain case carries its own), groups in the order they first appear, cases in their order."""
    groups: dict[tuple[int, int], list[Case]] = {}
    for seed, case in todo:
        groups.setdefault((seed, case.max_rounds), []).append(case)
    return [(seed, cases[i : i + size]) for (seed, _), cases in groups.items() for i in range(0, len(cases), size)]


def caption_scores(case_set: CaseSet, results: Path, seeds: list[int]) -> dict[str, dict] | None:
    """Caption metrics of the answers to a suite's captioning cases, per seed, when the case file ships reference
    captions beside it (`<stem>.captions.jsonl`, change_v1's change captioning); None for any other suite."""
    from geopilot.eval.change_set import change_caption_scores, references_path

    if not references_path(case_set.path).is_file():
        return None
    return {str(seed): change_caption_scores(case_set.path, results, seed) for seed in seeds}
