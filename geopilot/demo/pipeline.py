"""The demo's phases, each a function of (layout, settings, progress) that finishes by writing its marker.

    data      geopilot synth -> geopilot generate (template backend, configs/data_gen/demo.yaml) -> the model's BPE
    stage1    train.py: optical samples, from a random tiny model (vision tower trainable)
    stage2    train.py: SAR + alpha * |optical| replayed optical samples, from the stage-1 export -> DIR/model
    evaluate  the planning set rebuilt over the same synthetic images (eval/planning_set.py, templates disjoint
              from data_gen's), a stratified held-out subset, scored by the deterministic scorer
    chain_eval  the frozen chain suite chains_v1 (two-step plans, its tools answering from its annotations), a
              stratified subset, scored by the same scorer with the chain breakdowns
    chats     two chats (optical, SAR) with the annotation-backed tools, tool outputs drawn, and one chain drawn
              input -> intermediate result -> final result
    examples  the worked examples: one chat per example image (examples/images/) with the example tools
              (configs/tools_examples.yaml), each call's output drawn, each answer marked right or wrong
    report    plots + DIR/report.md
Every phase is safe to rerun after an interruption: generate, train.py and the benchmark runner resume on their own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from geopilot.demo.settings import DemoSettings, Layout
from geopilot.fileio import atomic_write

Progress = Callable[[int, int], None]  # (done, total)
DETECTION_TOOLS = {"optical": {"detect_objects", "detect_all", "ground"}, "sar": {"sar_detect_all", "sar_ground"}}
TRAIN_MODULE = "geopilot.commands.train"  # train.py's command, run as a module: no checkout path needed


def _json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


# ---- data ---------------------------------------------------------------------------------------------------------


def generate_config(layout: Layout, settings: DemoSettings):
    """configs/data_gen/demo.yaml with its source roots moved under DIR/data/synth."""
    from geopilot.config import load_config
    from geopilot.data_gen.generate_config import GenerateConfig

    path = resources.files("geopilot.configs") / "data_gen" / "demo.yaml"
    with resources.as_file(path) as file:
        config = load_config(GenerateConfig, file)
    sources = [s.model_copy(update={"root": layout.synth / Path(s.root).name}) for s in config.sources]
    chains = config.chains.model_copy(update={"share": settings.chain_share})
    update = {"sources": sources, "seed": settings.seed, "samples_per_record": settings.samples_per_record}
    return config.model_copy(update={**update, "chains": chains})


def run_data(layout: Layout, settings: DemoSettings, progress: Progress) -> dict:
    from geopilot.data_gen.generate import generate_dataset
    from geopilot.data_gen.synthetic.datasets import write_synthetic
    from geopilot.render import wire_segments
    from geopilot.sample import IMAGE_PLACEHOLDER, load_samples
    from geopilot.tokenizer import tiny_tokenizer
    from geopilot.wire import chat_turns

    write_synthetic(layout.synth, seed=settings.seed, optical=settings.optical, sar=settings.sar)
    result = generate_dataset(generate_config(layout, settings), layout.traces, progress=progress)
    samples = list(load_samples(layout.train_file))
    if settings.base == "smollm2":  # its own tokenizer, converted with the model
        from geopilot.demo.base_model import convert
        from geopilot.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(convert(layout.base))
    else:
        corpus = [
            text.replace(IMAGE_PLACEHOLDER, " ")
            for sample in samples
            for _, text in wire_segments(chat_turns(sample.messages))
        ]
        tokenizer = tiny_tokenizer(settings.vocab_size, corpus)
        staging = layout.tokenizer.with_name(".tokenizer.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        tokenizer.save_pretrained(staging)
        shutil.rmtree(layout.tokenizer, ignore_errors=True)
        os.replace(staging, layout.tokenizer)
    counts = {m: sum(1 for s in samples if s.modality == m) for m in ("optical", "sar")}
    chains = result.report["chains"]
    return {
        "samples": len(samples),
        "dropped": result.report["dropped"],
        **counts,
        "vocab": len(tokenizer),
        "chains": {"by_kind": chains["by_kind"], "share_pct": chains["share_pct"]},
    }


# ---- training -----------------------------------------------------------------------------------------------------


def _absolute(path: Path) -> str:
    return os.path.abspath(path)  # not resolve(): a symlinked out folder keeps the name it was given


def llava_model(layout: Layout, settings: DemoSettings, stage: int) -> dict:
    """Stage 1: a random tiny LLaVA on the demo's own BPE, or a random tiny vision tower + projector in front of the
    converted SmolLM2 (base smollm2); stage 2: the stage-1 export (llava-hf layout)."""
    if stage == 1 and settings.base == "smollm2":
        return {"init": "tiny_vision", "llm_path": _absolute(layout.base), "tiny": settings.model.model_dump()}
    if stage == 1:
        return {"init": "tiny", "tokenizer_path": _absolute(layout.tokenizer), "tiny": settings.model.model_dump()}
    return {"init": "llava_hf", "llava_path": _absolute(layout.stage1 / "export")}


def qwen2_5_vl_model(layout: Layout, settings: DemoSettings, stage: int) -> dict:
    """Stage 1: a random tiny Qwen2.5-VL (its own BPE with Qwen's special tokens); stage 2: the stage-1 export."""
    family = {"family": "qwen2_5_vl", "max_pixels": settings.qwen_max_pixels}
    if stage == 1:
        return {**family, "init": "tiny", "tiny_qwen": settings.qwen_model.model_dump()}
    return {**family, "init": "pretrained", "path": _absolute(layout.stage1 / "export")}


MODEL_CONFIGS = {"llava": llava_model, "qwen2_5_vl": qwen2_5_vl_model}  # DemoSettings.model_family -> model config


def train_config(layout: Layout, settings: DemoSettings, stage: int) -> dict:
    """The train.py config of one stage (written to DIR/configs/stage<n>.yaml, so it can be rerun by hand). Its paths
    are absolute: they are part of a training run's identity, so a demo resumed from another working directory (--out
    typed another way) resumes its training instead of being refused as another run."""
    steps = settings.stage1_steps if stage == 1 else settings.stage2_steps
    config = {
        "stage": stage,
        "output_dir": _absolute(layout.stage1 if stage == 1 else layout.stage2),
        "model": MODEL_CONFIGS[settings.model_family](layout, settings, stage),
        "data": {
            "files": [_absolute(layout.train_file)],
            "replay_alpha": settings.alpha,
            "mixture_seed": settings.seed,
            "max_length": settings.max_length,
            "plans_only_share": settings.plans_only_share,
            "cache_dir": _absolute(layout.out / ".cache" / "tokenised"),
            # every image stays decoded: each source ships its own copy of a scene (659 files for 140 scenes)
            "image_cache": 8 * (settings.optical + settings.sar),
        },
        "optim": {
            "epochs": settings.stage1_epochs if stage == 1 else settings.stage2_epochs,
            "global_batch_size": settings.batch_size,
            "per_device_batch_size": settings.batch_size,
            "lr": settings.stage1_lr if stage == 1 else settings.stage2_lr,
            "weight_decay": 0.0,
            "warmup_ratio": 0.05,
            "seed": settings.seed,
            "max_steps": steps,
            "mixed_precision": settings.mixed_precision,
        },
        "freeze": {"vision_tower": False},  # from scratch: the vision tower must learn SAR vs optical vs clouds
        "checkpoint": {"save_steps": 100, "keep_last": 1},
        "logging": {"logging_steps": 1, "tensorboard": True, "progress_bar": False},
    }
    if settings.lora_rank:  # adapters on the pretrained LM; the random vision tower and projector train whole
        rank = settings.lora_rank
        saved = ["multi_modal_projector", "vision_tower"]
        config["lora"] = {"enabled": True, "r": rank, "alpha": 2 * rank, "dropout": 0.0, "modules_to_save": saved}
    return config


def expected_steps(settings: DemoSettings, counts: dict, stage: int) -> int:
    samples = counts["optical"] if stage == 1 else counts["sar"] + round(settings.alpha * counts["optical"])
    epochs = settings.stage1_epochs if stage == 1 else settings.stage2_epochs
    steps = settings.stage1_steps if stage == 1 else settings.stage2_steps
    by_epochs = max(1, samples // settings.batch_size) * epochs
    return min(by_epochs, steps) if steps else by_epochs


def deterministic_env(settings: DemoSettings) -> dict:
    threads = str(settings.threads)
    return {
        **os.environ,
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "PYTHONHASHSEED": "0",
        "TOKENIZERS_PARALLELISM": "false",
    }


def run_stage(layout: Layout, settings: DemoSettings, stage: int, counts: dict, progress: Progress) -> dict:
    """The training recipe as a subprocess (resumes from its own checkpoints); progress from its per-step sample log."""
    import yaml

    from geopilot.training.config import TrainConfig

    config = train_config(layout, settings, stage)
    TrainConfig.model_validate(config)  # a bad setting fails here, with its dotted key
    config_path = layout.configs / f"stage{stage}.yaml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(config_path, yaml.safe_dump(config, sort_keys=False))
    out = Path(config["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    total = expected_steps(settings, counts, stage)
    steps_log = out / "logs" / "samples.rank0.jsonl"
    with (out / "train.log").open("a", encoding="utf-8") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", TRAIN_MODULE, "--config", str(config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=deterministic_env(settings),
        )
        try:
            while child.poll() is None:
                time.sleep(1.0)
                progress(min(_last_step(steps_log), total), total)
        except BaseException:  # Ctrl-C: stop the trainer too; its last complete checkpoint is where the rerun resumes
            child.terminate()
            child.wait()
            raise
    if child.returncode != 0:
        raise RuntimeError(f"stage {stage} training failed (exit {child.returncode}); see {out / 'train.log'}")
    info = json.loads((out / "export" / "geopilot_train.json").read_text(encoding="utf-8"))
    progress(total, total)
    return {
        "steps": info["steps"],
        "final_loss": info["final_loss"],
        "trained": info["data"]["trained"],
        "losses": read_losses(out),
    }


def _last_step(path: Path) -> int:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        return int(json.loads(lines[-1])["step"]) if lines else 0
    except (OSError, ValueError, KeyError):
        return 0


def read_losses(out: Path) -> list[list[float]]:
    """[[step, loss], ...] from the run's TensorBoard events (train.py logs train/loss every logging step)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    losses: dict[int, float] = {}
    for events in sorted((out / "tensorboard").rglob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events.parent), size_guidance={"scalars": 0})
        accumulator.Reload()
        if "train/loss" in accumulator.Tags().get("scalars", []):
            losses.update({e.step: e.value for e in accumulator.Scalars("train/loss")})
    return [[step, round(loss, 6)] for step, loss in sorted(losses.items())]


def publish_model(layout: Layout, settings: DemoSettings) -> None:
    """DIR/model: the stage-2 export, a plain GeoPilot / llava-hf checkpoint (copied atomically), with the demo's
    note on it (a quick-preset model says it learned nothing; geopilot.demo.model_note)."""
    from geopilot.demo.model_note import write_model_note
    from geopilot.demo.report import QUICK_NOTICE

    staging = layout.out / ".model.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(layout.stage2 / "export", staging)
    preset = settings.preset_name()
    write_model_note(staging, preset, QUICK_NOTICE if preset == "quick" else None, settings.max_new_tokens)
    shutil.rmtree(layout.model, ignore_errors=True)
    os.replace(staging, layout.model)


# ---- evaluation ---------------------------------------------------------------------------------------------------


def _shares(sizes: dict, n: int, floors: dict | None = None) -> dict:
    """Split n over groups in proportion to their sizes (largest remainder), each at least its floor (default 1).
    When the floors push the sum over n, the group furthest above its exact share gives one back, until it is n."""
    total = sum(sizes.values())
    exact = {key: size * n / total for key, size in sizes.items()}
    counts = {key: max(1, int(value)) for key, value in exact.items()}
    for key in sorted(exact, key=lambda k: exact[k] - int(exact[k]), reverse=True)[: max(0, n - sum(counts.values()))]:
        counts[key] += 1
    floors = floors or dict.fromkeys(sizes, 1)
    counts = {key: max(floors[key], count) for key, count in counts.items()}
    while sum(counts.values()) > n and (above := [key for key in counts if counts[key] > floors[key]]):
        counts[max(above, key=lambda k: counts[k] - exact[k])] -= 1
    return counts


def held_out_subset(cases: list[dict], n: int) -> list[dict]:
    """Exactly n of the planning cases (n >= the number of (category, difficulty) groups), stratified: each category,
    and each difficulty within it, keeps its share and at least one case; within a group the picks are spread evenly
    over its list (SAR cases first, then optical), so modality keeps its share."""
    if n >= len(cases):
        return cases
    groups: dict[tuple, list[dict]] = {}
    for case in cases:
        groups.setdefault((case["category"], case["difficulty"]), []).append(case)
    categories = list(dict.fromkeys(category for category, _ in groups))
    per_category = _shares(
        {c: sum(len(g) for (cat, _), g in groups.items() if cat == c) for c in categories},
        n,
        floors={c: sum(cat == c for cat, _ in groups) for c in categories},  # one case per difficulty
    )
    chosen = []
    for category, k in per_category.items():
        mine = {key: group for key, group in groups.items() if key[0] == category}
        for key, count in _shares({key: len(group) for key, group in mine.items()}, k).items():
            group = mine[key]
            chosen += [group[int((i + 0.5) * len(group) / count)] for i in range(min(count, len(group)))]
    return chosen


def run_evaluate(layout: Layout, settings: DemoSettings, progress: Progress) -> dict:
    import torch

    from geopilot.eval.agents import GeoPilotAgent
    from geopilot.eval.cases import load_cases
    from geopilot.eval.planning_set import CATEGORY_ORDER, build_planning_cases
    from geopilot.eval.results_log import read_rows
    from geopilot.eval.runner import run_benchmark
    from geopilot.eval.toolkit import build_tool_layer

    torch.set_num_threads(settings.threads)
    cases_file = layout.eval / "planning_heldout.jsonl"
    cases = held_out_subset(build_planning_cases(layout.synth, cases_file), settings.eval_cases)
    layout.eval.mkdir(parents=True, exist_ok=True)
    atomic_write(cases_file, "".join(json.dumps(case, ensure_ascii=False) + "\n" for case in cases))
    case_set = load_cases(cases_file)
    registry, layer = build_tool_layer(None)
    agent = GeoPilotAgent(str(layout.model), registry, {"max_new_tokens": settings.max_new_tokens}, device="cpu")
    run_dir = layout.eval / "run"
    summary = run_benchmark(
        agent,
        case_set,
        [settings.seed],
        run_dir,
        layer,
        "geopilot-demo",
        CATEGORY_ORDER,
        progress,
        settings.eval_batch_size,
    )
    rows = read_rows(run_dir / "results.jsonl")
    by_id = case_set.by_id()
    return {
        "cases": len(case_set.cases),
        "cases_sha256": case_set.sha256,
        **{metric: summary[metric] for metric in ("TSA", "PA", "NTA", "OPA")},
        "by_difficulty": {name: group["OPA"] for name, group in summary["by_difficulty"].items()},
        "by_category": {name: group["OPA"] for name, group in summary["by_category"].items()},
        "tsa_by_tool": tsa_by_tool(rows, by_id),
        "routing": routing(rows, by_id),
        "failures": summary["failures"],
    }


def chain_subset(layout: Layout, settings: DemoSettings) -> Path:
    """DIR/eval/chains_heldout.jsonl: `chain_cases` of the frozen chain suite, stratified by chain kind, their images
    the suite's own (absolute paths, so the file can live in the out folder)."""
    from geopilot.eval.chain_set import CHAINS_FILE

    cases = [json.loads(line) for line in CHAINS_FILE.read_text(encoding="utf-8").splitlines() if line.strip()]
    chosen = held_out_subset(cases, settings.chain_cases)
    for case in chosen:
        case["image"] = _absolute(CHAINS_FILE.parent / case["image"])
    path = layout.eval / "chains_heldout.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, "".join(json.dumps(case, ensure_ascii=False) + "\n" for case in chosen))
    return path


def chain_tool_layer():
    """The ten tools answering from the chain suite's annotations: a chain's second step reads the first's output."""
    from geopilot.eval.chain_set import CHAINS_FILE
    from geopilot.eval.toolkit import annotation_layer, suite_annotations

    return annotation_layer(suite_annotations(CHAINS_FILE))


def run_chain_eval(layout: Layout, settings: DemoSettings, progress: Progress) -> dict:
    """The chain suite's subset through the demo model, each case with its own max_rounds, scored by the same
    scorer: OPA and the chain breakdowns (first step, second step, both, answer, the whole chain)."""
    import torch

    from geopilot.eval.agents import GeoPilotAgent
    from geopilot.eval.cases import load_cases
    from geopilot.eval.metrics import CHAIN_METRICS
    from geopilot.eval.runner import run_benchmark

    torch.set_num_threads(settings.threads)
    case_set = load_cases(chain_subset(layout, settings))
    registry, layer = chain_tool_layer()
    agent = GeoPilotAgent(str(layout.model), registry, {"max_new_tokens": settings.max_new_tokens}, device="cpu")
    summary = run_benchmark(
        agent,
        case_set,
        [settings.seed],
        layout.eval / "chains_run",
        layer,
        "geopilot-demo",
        None,
        progress,
        settings.eval_batch_size,
    )
    chains = summary["chains"]
    return {
        "cases": len(case_set.cases),
        "cases_sha256": case_set.sha256,
        **{metric: summary[metric] for metric in ("TSA", "PA", "OPA")},
        **{metric: chains[metric] for metric in CHAIN_METRICS},
        "by_kind": {kind.removeprefix("chain_"): group for kind, group in chains["by_kind"].items()},
        "failures": summary["failures"],
    }


def tsa_by_tool(rows: list[dict], cases: dict) -> dict[str, float]:
    """TSA per expected tool (its first expected tool; "no tool" for the abstention cases)."""
    groups: dict[str, list[bool]] = {}
    for row in rows:
        case = cases[row["case_id"]]
        key = case.expected_tools[0] if case.expected_tools else "no tool"
        groups.setdefault(key, []).append(bool(row["score"]["tsa"]))
    return {tool: sum(hits) / len(hits) for tool, hits in sorted(groups.items())}


def routing(rows: list[dict], cases: dict) -> dict:
    """SAR vs optical routing of detection/grounding: over the cases that expect a detection or grounding tool,
    the share whose calls include one of the image's modality and none of the other's."""
    correct, total = {"optical": 0, "sar": 0}, {"optical": 0, "sar": 0}
    for row in rows:
        case = cases[row["case_id"]]
        if not set(case.expected_tools) & (DETECTION_TOOLS["optical"] | DETECTION_TOOLS["sar"]):
            continue
        own, other = DETECTION_TOOLS[case.modality], DETECTION_TOOLS["sar" if case.modality == "optical" else "optical"]
        called = {call["tool"] for call in row["run"]["calls"]}
        total[case.modality] += 1
        correct[case.modality] += bool(called & own) and not called & other
    overall = sum(correct.values()) / max(1, sum(total.values()))
    return {"accuracy": overall, "correct": correct, "total": total}


# ---- sample chats -------------------------------------------------------------------------------------------------


def chat_examples(layout: Layout) -> list[dict]:
    """One optical (DOTA) and one SAR (SARDet-100K) scene with their annotation records and a question for each."""
    from collections import Counter

    from geopilot.data_gen.readers import READERS

    examples = []
    for reader, root, modality in (("dota", "DOTA", "optical"), ("sardet", "SARDet-100K", "sar")):
        records, _ = READERS[reader](layout.synth / root)
        record = sorted(records, key=lambda r: (-len(r.objects), r.record_id))[0]
        label = Counter(o.label for o in record.objects).most_common(1)[0][0]
        query = (
            f"How many {label}s can you find in this image, and where are they?"
            if modality == "optical"
            else "Detect all targets in this SAR image."
        )
        examples.append(
            {"reader": reader, "root": layout.synth / root, "record": record, "query": query, "modality": modality}
        )
    return examples


def _inside(path: Path, folder: Path) -> str | None:
    try:
        return str(Path(os.path.abspath(path)).relative_to(os.path.abspath(folder)))
    except ValueError:
        return None


def run_chats(layout: Layout, settings: DemoSettings, progress: Progress) -> dict:
    import torch

    from geopilot.agent import GeoPilot
    from geopilot.image import load_image
    from geopilot.tools.registry import build_registry
    from geopilot.visualize import draw_outputs

    torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    layout.chats.mkdir(parents=True, exist_ok=True)
    chats = []
    examples = chat_examples(layout)
    for index, example in enumerate(examples):
        record = example["record"]
        image_path = Path(record.image) if Path(record.image).is_absolute() else example["root"] / record.image
        tools = build_registry(annotations=record, annotations_root=example["root"])  # ground truth, labelled so
        pilot = GeoPilot.from_pretrained(layout.model, tools=tools, device="cpu")
        result = pilot.chat(str(image_path), example["query"], generation={"max_new_tokens": settings.max_new_tokens})
        outputs = [call.output for call in result.tool_calls if call.output is not None]
        picture = layout.chats / f"{example['modality']}.png"
        drawn = draw_outputs(load_image(image_path).image, outputs)
        drawn.save(picture)
        chats.append(
            {
                "modality": example["modality"],
                "image": str(image_path),
                "image_in_out": _inside(image_path, layout.out),  # the report words it with --out as typed
                "query": example["query"],
                "plan": result.turns[0].text if result.turns else "",
                "answer": result.answer,
                "outcome": result.outcome,
                "tool_calls": [{"tool": c.tool, "params": c.params, "error": c.error} for c in result.tool_calls],
                "picture": picture.name,
            }
        )
        progress(index + 1, len(examples))
    return {"chats": chats, "chain": run_chain_chat(layout, settings)}


def chain_example(layout: Layout) -> dict:
    """The chain case the report draws: from the scored subset, a cloud chain (its intermediate result is an image)
    the model got right, else any chain it got right, else the first cloud chain."""
    from geopilot.eval.results_log import read_rows

    cases = [json.loads(line) for line in (layout.eval / "chains_heldout.jsonl").read_text().splitlines() if line]
    rows = read_rows(layout.eval / "chains_run" / "results.jsonl")
    right = {row["case_id"] for row in rows if (row["score"].get("chain") or {}).get("chain")}
    cloud = [case for case in cases if case["category"] == "chain_cloud_detection"] or cases
    preferred = [case for case in cloud if case["id"] in right] + [case for case in cases if case["id"] in right]
    return (preferred or cloud)[0]


def run_chain_chat(layout: Layout, settings: DemoSettings) -> dict:
    """One chain of the suite chatted again with the demo model and the suite's annotation-backed tools, drawn as
    input -> intermediate result -> final result (chats/chain.png)."""
    import torch

    from geopilot.agent import GeoPilot
    from geopilot.image import load_image
    from geopilot.visualize import draw_chain

    torch.manual_seed(settings.seed)
    case = chain_example(layout)
    registry, _ = chain_tool_layer()
    pilot = GeoPilot.from_pretrained(layout.model, tools=registry, device="cpu")
    result = pilot.chat(
        case["image"],
        case["query"],
        max_rounds=case["max_rounds"],
        generation={"max_new_tokens": settings.max_new_tokens},
        modality=case["modality"],
    )
    picture = layout.chats / "chain.png"
    draw_chain(load_image(case["image"]).image, result.tool_calls).save(picture)
    return {
        "case_id": case["id"],
        "query": case["query"],
        "expected": case["reference_calls"],
        "tool_calls": [
            {"round": c.round, "tool": c.tool, "params": c.params, "error": c.error} for c in result.tool_calls
        ],
        "answer": result.answer,
        "outcome": result.outcome,
        "picture": picture.name,
    }


# ---- worked examples -----------------------------------------------------------------------------------------------


def example_right(example: dict, calls: list[dict], answer: str) -> bool:
    """Right: the expected tool answered and, when the question has a checkable answer, the answer says it."""
    import re

    called = any(c["tool"] == example["tool"] and c["error"] is None for c in calls)
    wanted = example.get("answer_contains")
    said = re.search(rf"(?<![\w.]){re.escape(wanted)}(?![\w.])", answer) if wanted else answer.strip()
    return bool(called and said)


def run_examples(layout: Layout, settings: DemoSettings, progress: Progress) -> dict:
    """Each example image's question through the agent loop with the example tools; outputs drawn on the image."""
    import torch

    from geopilot.agent import GeoPilot
    from geopilot.tools.adapters import ExampleAnnotationsOptions
    from geopilot.tools.example_images import QUESTIONS, annotations_file
    from geopilot.tools.registry import EXAMPLES_CONFIG, build_registry, load_tools_config

    torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    config = load_tools_config(EXAMPLES_CONFIG)
    options = ExampleAnnotationsOptions.model_validate(config.tools["detect_all"].options)
    folder = annotations_file(options.annotations).parent
    if not (folder / QUESTIONS).is_file():
        return {"examples": [], "missing": f"{folder / QUESTIONS} not found (run the demo from a GeoPilot checkout)"}
    questions = json.loads((folder / QUESTIONS).read_text(encoding="utf-8"))
    pilot = GeoPilot.from_pretrained(layout.model, tools=build_registry(config=config), device="cpu")
    layout.examples.mkdir(parents=True, exist_ok=True)
    worked = []
    generation = {"max_new_tokens": settings.max_new_tokens}
    for start in range(0, len(questions), settings.eval_batch_size):  # a chunk is one chat_batch (1: one chat)
        chunk = questions[start : start + settings.eval_batch_size]
        requests = [{"image": str(folder / example["image"]), "query": example["question"]} for example in chunk]
        for example, result in zip(chunk, pilot.chat_batch(requests, generation=generation), strict=True):
            worked.append(worked_example(layout, folder / example["image"], example, result))
            progress(len(worked), len(questions))
    return {"examples": worked, "right": sum(w["right"] for w in worked), "tools_config": _shown_path(EXAMPLES_CONFIG)}


def worked_example(layout: Layout, image_path: Path, example: dict, result) -> dict:
    """One worked example's chat as the report shows it, its picture drawn into DIR/examples."""
    from geopilot.image import load_image
    from geopilot.visualize import chain_panels

    picture = layout.examples / example["image"]
    # the last call's result: its output drawn on the image it read, or the restored image itself
    chain_panels(load_image(image_path).image, result.tool_calls)[-1][1].save(picture)
    calls = [
        {
            "tool": c.tool,
            "params": c.params,
            "error": c.error,
            "provenance": c.output.provenance if c.output is not None else None,
        }
        for c in result.tool_calls
    ]
    return {
        "image": _shown_path(image_path),
        "question": example["question"],
        "expected_tool": example["tool"],
        "plan": result.turns[0].text if result.turns else "",
        "tool_calls": calls,
        "answer": result.answer,
        "outcome": result.outcome,
        "right": example_right(example, calls, result.answer),
        "picture": picture.name,
    }


def _shown_path(path: Path) -> str:
    """The path as a user types it: relative to the current folder when inside it."""
    return _inside(path, Path.cwd()) or str(path)
