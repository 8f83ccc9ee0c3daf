"""`geopilot generate merge D1 D2 ... --out D`: the N shard folders of one run, written as one dataset.

Every shard planned the whole run and journalled its jobs with their global index, so the merged folder is what the
single-process run writes, byte for byte: `shard-NNNNN.jsonl` and `provenance/` in job order (`shard_size`
consecutive job indices per file), `manifest.json`, `report.json` / `report.md` (statistics summed, Table-2
counts), plus `journal/`, `run.json` and `plan.json`, so `geopilot generate --out D` on it has nothing left to do.
Only the journal-repair counters of the report are the shards' sums (a resumed shard may have repaired a line).

Refused, with what differs: shards of different configs (seed included), code versions or shard counts, a shard
missing or given twice, a shard not finished, an output folder that is not empty.
"""

from __future__ import annotations

import json
from pathlib import Path

from geopilot.data_gen.generate import write_shards
from geopilot.data_gen.generate_config import GenerateConfig
from geopilot.data_gen.generation_report import build_report, write_report
from geopilot.data_gen.journal import Journal
from geopilot.data_gen.shards import RunLock, parse_shard, recorded_settings, run_dir
from geopilot.errors import GeoPilotInputError
from geopilot.fileio import atomic_write


class MergeError(GeoPilotInputError):
    """Shard folders that are not the complete shards of one run."""


def _read(folder: Path, name: str) -> dict:
    try:
        return json.loads((folder / name).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise MergeError(f"{folder} is not a finished generate shard ({name}: {err})") from None


def _config_difference(a: dict, b: dict) -> str:
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return ", ".join(f"{k}: {json.dumps(a.get(k))[:60]} vs {json.dumps(b.get(k))[:60]}" for k in keys)


def check_shards(folders: list[Path]) -> list[dict]:
    """Each folder's run.json + manifest.json + plan.json, once they are known to be the N shards of one run."""
    shards = [{"dir": f, "run": _read(f, "run.json"), "manifest": _read(f, "manifest.json")} for f in folders]
    first = shards[0]
    for shard in shards:
        shard["plan"] = _read(shard["dir"], "plan.json")
        run, where = shard["run"], f"{first['dir']} and {shard['dir']}"
        shard["identity"] = recorded_settings(run)
        if shard["identity"]["config"] != first["identity"]["config"]:
            raise MergeError(
                f"{where} were made from different configs ({_config_difference(first['run']['config'], run['config'])})"
            )
        if shard["identity"]["code_version"] != first["identity"]["code_version"]:
            raise MergeError(
                f"{where} were made by different code versions ({first['identity']['code_version']} vs "
                f"{shard['identity']['code_version']})"
            )
        if shard["identity"]["shard"] is None:
            raise MergeError(f"{shard['dir']} is a whole run, not a shard (made without --shard)")
        if not shard["manifest"].get("complete"):
            raise MergeError(
                f"{shard['dir']} (shard {shard['identity']['shard']}) is not finished: {shard['manifest'].get('pending')} jobs pending; "
                "rerun its generate command"
            )
        if shard["plan"] != first["plan"]:
            raise MergeError(f"{where} planned different jobs (sources changed on disk between the shards)")
    specs = [parse_shard(s["identity"]["shard"]) for s in shards]
    counts = sorted({spec.count for spec in specs})
    if len(counts) > 1:
        raise MergeError(f"the shards split the run {' and '.join(map(str, counts))} ways")
    seen = [spec.index for spec in specs]
    missing = sorted(set(range(counts[0])) - set(seen))
    twice = sorted({i for i in seen if seen.count(i) > 1})
    if missing or twice:
        raise MergeError(
            f"shards of {counts[0]}: "
            + "; ".join(filter(None, [missing and f"missing {missing}", twice and f"given twice {twice}"]))
        )
    return shards


def merge_shards(folders: list[Path], out_dir: Path) -> dict:
    """Write the merged dataset to `out_dir`; returns its report."""
    folders, out_dir = [Path(f) for f in folders], Path(out_dir)
    if not folders:
        raise MergeError("give the shard folders to merge")
    if out_dir.resolve() in {f.resolve() for f in folders}:
        raise MergeError(f"--out {out_dir} is one of the shards; merge into a new folder")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise MergeError(f"--out {out_dir} is not empty")
    shards = check_shards(folders)
    first = shards[0]
    config = GenerateConfig.model_validate(first["run"]["config"])
    facts = first["plan"]
    journals = [Journal(s["dir"] / "journal") for s in shards]
    for journal in journals:
        journal.recover()  # counts lines a reader would skip; a finished shard has no torn tail to cut
    index_of: dict[str, int] = {}
    for journal in journals:
        for bucket_file in sorted(journal.directory.glob("shard-*.jsonl")):
            for entry in journal.read_shard(int(bucket_file.stem.split("-")[1])).values():
                index_of[entry["id"]] = entry["index"]
    placed = sorted((index, sample_id) for sample_id, index in index_of.items())
    if [i for i, _ in placed] != list(range(facts["jobs_total"])):
        raise MergeError(f"the shards hold {len(placed)} distinct jobs, the run has {facts['jobs_total']}")
    out_dir.mkdir(parents=True, exist_ok=True)
    with RunLock(out_dir):
        merged = Journal(out_dir / "journal")

        def read_bucket(bucket: int) -> dict:
            entries = {}
            for journal in journals:
                entries.update(journal.read_shard(bucket))
            ordered = dict(sorted(entries.items(), key=lambda kv: kv[1]["index"]))
            for entry in ordered.values():
                merged.write(bucket, entry)
            return ordered

        manifest = write_shards(
            out_dir,
            config,
            placed,
            read_bucket,
            first["manifest"]["backend"],
            first["manifest"]["prompt_versions"],
            None,
            facts,
        )
        merged.close()
        entries = merged.recover()
        torn = sum(_read(s["dir"], "report.json").get("journal_torn_lines_repaired", 0) for s in shards)
        corrupt = sum(_read(s["dir"], "report.json").get("journal_corrupt_lines_skipped", 0) for s in shards)
        report = build_report(facts, [i for _, i in placed], entries, config, manifest, torn, corrupt)
        write_report(out_dir, report)
        run_dir(out_dir, config, None, first["identity"]["code_version"]).write()  # the single-process run it equals
        atomic_write(out_dir / "plan.json", json.dumps(facts, indent=2, ensure_ascii=False) + "\n")
        merge_record = {"merged_from": [{"dir": str(s["dir"]), "shard": s["identity"]["shard"]} for s in shards]}
        atomic_write(out_dir / "merge.json", json.dumps(merge_record, indent=2) + "\n")
    return report
