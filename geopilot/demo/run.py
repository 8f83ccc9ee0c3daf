"""Run the demo phase by phase into one out folder: refuse to mix runs, resume after Ctrl-C, reuse a finished one.

The folder remembers its settings (`demo.json`, a `geopilot.run_dir.RunDir` record); each finished phase leaves `phases/<phase>.done` (written
atomically, holding the phase's result), so the next run starts at the first phase without a marker.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from geopilot.demo import pipeline
from geopilot.demo.settings import PHASES, DemoSettings, Layout
from geopilot.errors import GeoPilotInputError
from geopilot.run_dir import RunDir

# Seconds per unit of work, for the up-front estimate, measured on the 2-core development machine (docs/demo.md);
# training per sample-epoch of a width-96 3-layer text model (scaled by width x layers), by torch threads.
SECONDS_PER_SCENE = 0.15
SECONDS_PER_TRAIN_SAMPLE_EPOCH = {
    1: 0.025,
    2: 0.0122,
}  # default runs: 1112 s (1 thread, before the image cache), 542 s (2)
SECONDS_PER_EVAL_CASE = 0.3
SECONDS_PER_CHAIN_CASE = 0.3  # 124 chain cases: 27-33 s
SECONDS_FOR_EXAMPLES = 15  # the worked examples: ten chats with the example tools
# base smollm2 (docs/demo.md, "SmolLM2"), 2 idle cores: converting the GGUF file; a training sample (bf16, 70 % of
# the tool samples ending at their plan); a planning or chain case in batches of 16, and one at a time
SMOLLM2_CONVERT_SECONDS = 20
SMOLLM2_SECONDS_PER_STEP_SAMPLE = 0.65
SMOLLM2_SECONDS_PER_CASE = {"batched": 2.2, "one": 6.4}
# the largest resident memory of a default run's training, measured (docs/demo.md): SmolLM2's activations over
# 8 x 640 tokens through 30 layers, against the tiny model's 16 x 512 through 4
TRAINING_PEAK_BYTES = {"scratch": 1.6e9, "smollm2": 13.4e9}


def estimate_seconds(settings: DemoSettings) -> float:
    if settings.base == "smollm2":
        steps = (settings.stage1_steps or 0) + (settings.stage2_steps or 0)
        return (
            SECONDS_PER_SCENE * (settings.optical + settings.sar)
            + SMOLLM2_CONVERT_SECONDS
            + SMOLLM2_SECONDS_PER_STEP_SAMPLE * settings.batch_size * steps
            + SMOLLM2_SECONDS_PER_CASE["batched" if settings.eval_batch_size > 1 else "one"]
            * (settings.eval_cases + settings.chain_cases + 10)  # + the worked examples
            + 90  # process start-ups (each loads the 135 M model), tokenisation, the three chats, plots
        )
    # samples generate makes of the scenes: per scene 7.74 optical and 1.92 SAR tool samples per samples_per_record,
    # plus 9 optical (GeoChat-Instruct) and 4 SAR (SARLANG-1M) tool-free ones (measured: 4434 of 80, 930 of 60)
    # and the chain traces on top, `chain_share` of each stage's samples
    chains = 1.0 / (1.0 - settings.chain_share)
    optical = (7.74 * settings.samples_per_record + 9) * settings.optical * chains
    sar = (1.92 * settings.samples_per_record + 4) * settings.sar * chains
    sample_epochs = optical * settings.stage1_epochs + (sar + settings.alpha * optical) * settings.stage2_epochs
    size = (settings.model.text_hidden / 96) * (settings.model.text_layers / 3)
    return (
        SECONDS_PER_SCENE * (settings.optical + settings.sar)
        + SECONDS_PER_TRAIN_SAMPLE_EPOCH[min(settings.threads, 2)] * size * sample_epochs
        + SECONDS_PER_EVAL_CASE * settings.eval_cases
        + SECONDS_PER_CHAIN_CASE * settings.chain_cases
        + SECONDS_FOR_EXAMPLES
        + 60  # process start-ups, tokenisation, plots
    )


def memory_warning(settings: DemoSettings, available: float | None = None) -> str | None:
    """A line when the memory available now is below what training peaks at (the kernel would kill it)."""
    import psutil

    needed = TRAINING_PEAK_BYTES[settings.base]
    available = psutil.virtual_memory().available if available is None else available
    if available >= needed:
        return None
    return (
        f"training peaks at about {needed / 1e9:.1f} GB of memory and {available / 1e9:.1f} GB is available: it may "
        "be killed; close other programs (a rerun resumes from the last finished phase)"
    )


def run_dir(layout: Layout, settings: DemoSettings) -> RunDir:
    return RunDir(layout.out, settings.model_dump(mode="json"), layout.settings.name, "demo run")


def check_base(layout: Layout, settings: DemoSettings) -> None:
    """A folder started on the other language-model base is refused naming the setting (folders from before the
    setting existed are `scratch`'s); anything else about the record is RunDir's to judge."""
    try:
        started = json.loads(layout.settings.read_text(encoding="utf-8"))["settings"].get("base", "scratch")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return
    if started != settings.base:
        raise GeoPilotInputError(
            f"{str(layout.out)!r} holds a demo made with --base {started}, not --base {settings.base}: rerun with "
            f"--base {started} to resume it, or use a new --out folder"
        )


def check_out_dir(layout: Layout, settings: DemoSettings) -> bool:
    """True when the folder holds this very demo, finished. Raises GeoPilotInputError when it must not be used."""
    check_base(layout, settings)
    if not run_dir(layout, settings).check():
        return False
    read_results(layout)  # every phase marker readable, before any phase runs
    needs_data = not layout.marker("stage2").is_file()  # training still reads the generated traces
    if needs_data and layout.marker("data").is_file() and not layout.train_file.is_file():
        raise GeoPilotInputError(
            f"{str(layout.marker('data'))!r} says the data phase finished, but {str(layout.train_file)!r} is "
            "gone; use a new --out folder (or delete the phases/ markers to redo every phase)"
        )
    return layout.marker("report").is_file()


def check_disk(path: Path, needed: int) -> None:
    existing = path
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if free < needed:
        raise GeoPilotInputError(
            f"not enough free disk space under {str(existing)!r}: {free / 1e9:.2f} GB free, the demo needs about "
            f"{needed / 1e9:.2f} GB"
        )


def read_results(layout: Layout) -> dict:
    results, seconds = {}, {}
    for phase in PHASES:
        if layout.marker(phase).is_file():
            done = _read_record(layout.marker(phase), f"the {phase} phase's marker")
            if not {"result", "seconds"} <= done.keys():
                raise GeoPilotInputError(f"{str(layout.marker(phase))!r} is not a phase marker GeoPilot wrote")
            results[phase], seconds[phase] = done["result"], done["seconds"]
    results["seconds"] = seconds
    return results


def _read_record(path: Path, what: str) -> dict:
    """A JSON object GeoPilot wrote atomically; anything else was damaged from outside: one line, never a guess."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise GeoPilotInputError(
            f"{str(path)!r} ({what}) cannot be read ({type(err).__name__}); it was changed outside the demo: "
            "use a new --out folder"
        ) from None
    if not isinstance(record, dict):
        raise GeoPilotInputError(f"{str(path)!r} ({what}) is not a JSON object; use a new --out folder")
    return record


def run_demo(out: str | Path, settings: DemoSettings, console=None, until: str = "report") -> Path:
    """Run (or resume, or reuse) the demo in `out` up to and including phase `until`; returns DIR/report.md."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = console or Console(stderr=True)
    layout = Layout(out)
    if check_out_dir(layout, settings):
        console.print(f"{layout.out} already holds this finished demo; report: {layout.report}")
        return layout.report
    wanted = PHASES[: PHASES.index(until) + 1]
    remaining = [phase for phase in wanted if not layout.marker(phase).is_file()]
    if "data" in remaining:
        check_disk(layout.out, settings.needed_bytes())
    run_dir(layout, settings).claim()
    done = [phase for phase in wanted if phase not in remaining]
    console.print(
        f"geopilot demo -> {layout.out}: about {estimate_seconds(settings) / 60:.0f} min with {settings.threads} "
        f"torch thread{'s' if settings.threads > 1 else ''}" + (f"; resuming after {', '.join(done)}" if done else "")
    )
    busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if settings.threads > 1 and busy >= 0.8:  # OpenMP threads that wait on a busy core slow every step down
        console.print(
            f"[yellow]the CPUs are already busy (load average {busy:.1f}): expect a slower run, or stop "
            "and rerun with --threads 1 in a new --out folder[/yellow]"
        )
    if {"stage1", "stage2"} & set(remaining):
        warning = memory_warning(settings)
        if warning:
            console.print(f"[yellow]{warning}[/yellow]")
    columns = (
        TextColumn("{task.description:<9}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as bars:
        for phase in remaining:
            task = bars.add_task(phase, total=None)

            def progress(current: int, total: int, task=task) -> None:
                bars.update(task, completed=current, total=total)

            started = time.perf_counter()
            result = _run_phase(phase, layout, settings, progress)
            seconds = round(time.perf_counter() - started, 1)
            if bars.tasks[task].total is None:  # a phase that reported no progress
                bars.update(task, completed=1, total=1)
            pipeline._json(layout.marker(phase), {"result": result, "seconds": seconds})
    if until != "report":
        console.print(f"stopped after {until} (rerun without --until to finish)")
        return layout.report
    results = read_results(layout)
    console.print(_summary(results, settings), highlight=False)
    console.print(f"report: {layout.report}")
    return layout.report


def _run_phase(phase: str, layout: Layout, settings: DemoSettings, progress) -> dict:
    if phase == "data":
        return pipeline.run_data(layout, settings, progress)
    if phase in ("stage1", "stage2"):
        counts = read_results(layout)["data"]
        stage = int(phase[-1])
        result = pipeline.run_stage(layout, settings, stage, counts, progress)
        if stage == 2:
            pipeline.publish_model(layout, settings)
        return result
    if phase == "evaluate":
        return pipeline.run_evaluate(layout, settings, progress)
    if phase == "chain_eval":
        return pipeline.run_chain_eval(layout, settings, progress)
    if phase == "chats":
        return pipeline.run_chats(layout, settings, progress)
    if phase == "examples":
        return pipeline.run_examples(layout, settings, progress)
    from geopilot.demo.report import write_report

    results = read_results(layout)
    write_report(layout, settings, results)
    progress(1, 1)
    return {"report": str(layout.report)}


def _summary(results: dict, settings: DemoSettings) -> str:
    """The console's last words: the preset and what its numbers mean first, then the numbers."""
    from geopilot.demo.report import CHAIN_STEPS, METRICS, percent, preset_line

    evaluation, chains = results["evaluate"], results["chain_eval"]
    parts = [f"{m} {100 * evaluation[m]:.1f}%" for m in METRICS if evaluation[m] is not None]
    parts.append(f"SAR/optical routing {100 * evaluation['routing']['accuracy']:.1f}%")
    steps = "  ".join(f"{meaning.split(':')[0]} {percent(chains[key])}" for key, meaning in CHAIN_STEPS.items())
    total = sum(results["seconds"].values())
    legend = ", ".join(f"{name} = {meaning.split(':')[0]}" for name, meaning in METRICS.items())
    return "\n".join(
        [
            preset_line(settings),
            f"planning on {evaluation['cases']} held-out cases: " + "  ".join(parts) + f"  ({total / 60:.1f} min)",
            f"two-step chains on {chains['cases']} chain-suite cases: chain accuracy {percent(chains['chain'])}  "
            f"(OPA {percent(chains['OPA'])}; {steps})",
            f"({legend}; the report spells them out)",
        ]
    )
