"""The training recipe: one stage of the two-stage curriculum (docs/design.md §6), resumable, on 1..N processes.

`train(cfg, on_step, planning_probe)` reads top to bottom: config -> engine -> model -> data -> resume -> loop ->
export. Re-running the same command after a crash continues from the latest complete checkpoint with the same
samples in the same order. The command line is geopilot.commands.train (`geopilot train`, `train.py` at the top
of the checkout, `python -m geopilot.commands.train` under torchrun).

`on_step(step, event)` is called during the run: event "checkpoint" on the main process half-way through writing
that step's checkpoint (files saved, not yet committed), event "step" on every process once the optimizer step and
any checkpoint of it are complete. The resume tests kill the process from it, as a pre-emption would; it is not
part of the config.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from geopilot.errors import GeoPilotInputError
from geopilot.run_dir import changed_settings
from geopilot.training.config import EvalConfig, TrainConfig, current_settings, result_settings

log = logging.getLogger("geopilot.train")

StepEvent = Literal["checkpoint", "step"]
StepCallback = Callable[[int, StepEvent], None]


class PlanningProbe(Protocol):
    def scores(self, accelerator, model) -> dict: ...


PlanningProbeFactory = Callable[[EvalConfig, Any], PlanningProbe]  # (cfg.eval, processor) -> probe


def train(
    cfg: TrainConfig, on_step: StepCallback | None = None, planning_probe: PlanningProbeFactory | None = None
) -> int:
    """One stage, start to export. `planning_probe(cfg.eval, processor)` scores planning when
    `eval.planning_cases` is set (geopilot.eval.planning_probe.PlanningProbe; the entry points pass it)."""
    from geopilot.training import tracking
    from geopilot.training.checkpoint import CheckpointStore
    from geopilot.training.nodes import check_same_checkpoint
    from geopilot.training.stage_setup import EXPORT_INFO

    accelerator, world_size, ds_config = _start_engine(cfg)
    out = Path(cfg.output_dir)
    store = CheckpointStore(out / "checkpoints")
    resume = store.find_resumable() if cfg.checkpoint.resume else None
    check_same_checkpoint(accelerator, resume)
    stage = _prepare_stage(cfg, accelerator, world_size, ds_config, planning_probe)
    _log_start(cfg, stage.data, stage.plan, ds_config)

    # --- resume: model, optimizer, scheduler, RNG (accelerate) + data position and best evaluation (our state)
    position = Position()
    if resume is not None:
        path, state = resume
        _check_same_run(state, stage.identity, path)
        accelerator.load_state(str(path))
        position = Position(
            state["step"], state.get("loss", float("nan")), state.get("best"), state.get("last_eval", {})
        )
        log.info("resumed from %s at step %d of %d", path, position.step, stage.plan.total_steps)
    if position.step >= stage.plan.total_steps and (out / "export" / EXPORT_INFO).is_file():
        log.info("this run finished at step %d: %s is kept as it is", position.step, out / "export")
        accelerator.end_training()
        return 0
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(cfg.model_dump_json(indent=1), encoding="utf-8")
    sample_log = SampleLog(
        out / "logs" / f"samples.rank{accelerator.process_index}.jsonl",
        keep_up_to=position.step,
        enabled=cfg.logging.log_sample_ids,
    )
    tracking.start_trackers(accelerator, cfg, position.step, tracking.flat_config(cfg))
    _train_loop(stage, position, store, sample_log, on_step)
    _export(stage, position)
    accelerator.end_training()
    return 0


@dataclass
class Stage:
    """One stage's run once prepared: accelerate has wrapped the model, optimizer, loader and scheduler."""

    cfg: TrainConfig
    accelerator: Any
    world_size: int
    ds_config: dict | None
    model: Any
    processor: Any
    data: Any  # geopilot.training.data.TrainingData
    eval_data: Any
    planning: PlanningProbe | None
    batches: Any  # LengthGroupedBatches | RandomBatches
    plan: Any  # geopilot.training.stage_setup.StepPlan
    collator: Any
    loader: Any
    optimizer: Any
    scheduler: Any
    identity: dict  # what a checkpoint must match to resume: the step plan, the data and the settings


@dataclass
class Position:
    """Where a run is, beside accelerate's own state: what a checkpoint stores and a resume restores."""

    step: int = 0
    last_loss: float = float("nan")
    best: dict | None = None
    last_eval: dict = field(default_factory=dict)


@dataclass
class Window:
    """What the steps since the last logged one add up to (mean loss, grad norms); `non_finite` over the run."""

    loss_sum: float = 0.0
    loss_count: int = 0
    non_finite: float = 0.0
    grad_norms: list[float] = field(default_factory=list)
    steps: int = 0


def _start_engine(cfg: TrainConfig):
    """(accelerator, world size, DeepSpeed config): the DeepSpeed config is checked before any process group
    exists, then accelerate starts; a node with another config or code version is refused before any work."""
    from accelerate.utils import set_seed

    from geopilot.training import tracking
    from geopilot.training.nodes import check_same_job
    from geopilot.training.stage_setup import (
        deepspeed_settings,
        make_accelerator,
        require_distributed_launch,
        world_size_from_env,
    )

    world_size = world_size_from_env()
    ds_config = deepspeed_settings(cfg, world_size)
    require_distributed_launch(ds_config)
    accelerator = make_accelerator(cfg, ds_config, world_size, tracking.tracker_kinds(cfg))
    _setup_logging(accelerator.is_main_process)
    check_same_job(accelerator, cfg)
    set_seed(cfg.optim.seed)
    return accelerator, world_size, ds_config


def _prepare_stage(
    cfg: TrainConfig, accelerator, world_size: int, ds_config: dict | None, planning_probe: PlanningProbeFactory | None
) -> Stage:
    """The model, the data and its batches, the optimizer and schedule, all through `accelerator.prepare`."""
    from torch.utils.data import DataLoader

    from geopilot.training.batching import Collator, LengthGroupedBatches, RandomBatches
    from geopilot.training.data import ImageTokens, build_training_data
    from geopilot.training.stage_setup import build_optimizer_and_schedule, build_stage_model, plan_steps
    from geopilot.training.validation import build_eval_data

    model, processor = build_stage_model(cfg)
    with accelerator.main_process_first():  # the main process fills the tokenisation cache, the others read it
        image_tokens = ImageTokens.of(processor, cfg.data.max_pixels)
        data = build_training_data(cfg.data, cfg.stage, processor.tokenizer, image_tokens, cfg.cache_dir)
        eval_data = None
        if cfg.data.eval_files:
            eval_data = build_eval_data(cfg.data, processor.tokenizer, image_tokens, cfg.cache_dir, data.dataset["id"])
    planning = None
    if cfg.eval.planning_cases:
        if planning_probe is None:
            raise GeoPilotInputError(
                "eval.planning_cases needs the planning probe of geopilot.eval: run `geopilot train` or train.py"
            )
        planning = planning_probe(cfg.eval, processor)
    batching = LengthGroupedBatches if cfg.data.group_by_length else RandomBatches
    batches = batching(
        list(data.dataset["length"]),
        cfg.optim.per_device_batch_size,
        world_size * accelerator.gradient_accumulation_steps,
        cfg.optim.seed,
        **({"megabatch_batches": cfg.data.megabatch_batches} if cfg.data.group_by_length else {}),
    )
    plan = plan_steps(cfg, len(batches), world_size)
    collator = Collator(processor, cfg.data.max_pixels, cfg.data.image_cache)
    loader = DataLoader(data.dataset, batch_sampler=batches, collate_fn=collator, num_workers=cfg.data.num_workers)
    optimizer, scheduler = build_optimizer_and_schedule(model, cfg, plan)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    identity = {
        "stage": cfg.stage,
        "world_size": world_size,
        "global_batch_size": cfg.optim.global_batch_size,
        "total_steps": plan.total_steps,
        "steps_per_epoch": plan.steps_per_epoch,
        "data_fingerprint": hashlib.sha256("\n".join(data.dataset["id"]).encode()).hexdigest(),
        "settings": result_settings(cfg),
    }
    return Stage(
        cfg=cfg,
        accelerator=accelerator,
        world_size=world_size,
        ds_config=ds_config,
        model=model,
        processor=processor,
        data=data,
        eval_data=eval_data,
        planning=planning,
        batches=batches,
        plan=plan,
        collator=collator,
        loader=loader,
        optimizer=optimizer,
        scheduler=scheduler,
        identity=identity,
    )


def _train_loop(stage: Stage, position: Position, store, sample_log: SampleLog, on_step: StepCallback | None) -> None:
    """One optimizer step per `grad_accum` micro-batches per process, until the plan's last step."""
    from geopilot.training import tracking

    cfg, accelerator, plan = stage.cfg, stage.accelerator, stage.plan
    unwrapped = accelerator.unwrap_model(stage.model)
    pixel_dtype = next(unwrapped.parameters()).dtype
    flops = tracking.flops_per_token(unwrapped), tracking.peak_flops(cfg)
    source_of = dict(zip(stage.data.dataset["id"], stage.data.dataset["source"], strict=True))
    grad_accum = accelerator.gradient_accumulation_steps
    progress = ProgressLine(
        plan.total_steps, position.step, cfg.stage, accelerator.is_main_process and cfg.logging.progress_bar
    )
    meter = tracking.StepMeter(accelerator.device.type == "cuda")
    window = Window()
    stage.model.train()
    while position.step < plan.total_steps:
        epoch, done_in_epoch = divmod(position.step, plan.steps_per_epoch)
        stage.batches.use_epoch(epoch)
        loader = stage.loader
        epoch_loader = accelerator.skip_first_batches(loader, done_in_epoch * grad_accum) if done_in_epoch else loader
        meter.lap("data")  # the loader's start (workers, skipping) counts as data time
        for batch in epoch_loader:
            meter.lap("data")
            sample_ids = batch.pop("sample_ids")
            sample_log.write(position.step + 1, epoch, sample_ids)
            per_sample, micro_loss = _micro_step(stage, batch, pixel_dtype, window, meter)
            meter.add_batch(batch, [source_of[i] for i in sample_ids], per_sample)
            window.loss_sum, window.loss_count = window.loss_sum + micro_loss, window.loss_count + 1
            window.non_finite += 0.0 if math.isfinite(micro_loss) else 1.0
            if not accelerator.sync_gradients:
                meter.lap("optimizer")
                continue
            _stop_unless_finite(stage, window, position.step)
            stage.scheduler.step()
            position.step += 1
            window.steps += 1
            meter.lap("optimizer")
            _after_step(stage, position, window, meter, flops, pixel_dtype, progress, store, on_step)
            if position.step >= plan.total_steps or position.step % plan.steps_per_epoch == 0:
                break
    progress.close()


def _micro_step(stage: Stage, batch: dict, pixel_dtype, window: Window, meter) -> tuple[Any, float]:
    """Forward, backward and (on a step's last micro-batch) the clipped optimizer step: (per-sample loss, loss)."""
    from geopilot.training.target_loss import target_loss, target_positions

    accelerator, model, cfg = stage.accelerator, stage.model, stage.cfg
    if "pixel_values" in batch:
        batch["pixel_values"] = batch["pixel_values"].to(pixel_dtype)
    labels = batch.pop("labels")
    positions = target_positions(labels)
    with accelerator.accumulate(model):
        outputs = model(**batch, logits_to_keep=positions)
        loss, per_sample = target_loss(outputs.logits, labels, positions)
        accelerator.backward(loss)
        del outputs
        meter.lap("forward_backward")
        norm = None
        if accelerator.sync_gradients:
            norm = accelerator.clip_grad_norm_(model.parameters(), cfg.optim.max_grad_norm or math.inf)
        stage.optimizer.step()
        stage.optimizer.zero_grad()
        if accelerator.sync_gradients:
            window.grad_norms.append(_grad_norm(norm, model))
    return per_sample, loss.detach().float().item()


def _stop_unless_finite(stage: Stage, window: Window, step: int) -> None:
    """Every process learns whether any diverged (one tiny all-reduce a step), so all stop together."""
    import torch

    from geopilot.training.stage_setup import NonFiniteError

    accelerator = stage.accelerator
    if float(accelerator.reduce(torch.tensor(window.non_finite, device=accelerator.device), "sum")) > 0:
        raise NonFiniteError(
            f"step {step + 1}: the loss is not finite (NaN or inf); stopped with nothing exported, the last "
            f"complete checkpoint is kept; lower optim.lr ({stage.cfg.optim.lr:g}) or check the data"
        )


def _after_step(stage: Stage, position: Position, window: Window, meter, flops, pixel_dtype, progress, store, on_step):
    """A finished optimizer step: its metrics, any evaluation, the progress line, any checkpoint, `on_step`."""
    cfg, accelerator, plan, step = stage.cfg, stage.accelerator, stage.plan, position.step
    metrics = {}
    if step % cfg.logging.logging_steps == 0 or step == plan.total_steps:
        metrics = _window_metrics(stage, position, window, meter, flops)
    evaluate = (stage.eval_data is not None or stage.planning is not None) and (
        step % cfg.eval.every_steps == 0 or step == plan.total_steps
    )
    new_best, paused = False, time.perf_counter()  # evaluation and checkpoints are not training time
    if evaluate:
        position.last_eval = _evaluate(stage, pixel_dtype)
        metrics.update(position.last_eval)
        position.best, new_best = _update_best(cfg.checkpoint.keep_best, position.best, position.last_eval, step)
    if metrics:
        accelerator.log(metrics, step=step)  # before the checkpoint: a resume drops it with the steps after
        progress.show(metrics)
    progress.advance(step)
    if step % cfg.checkpoint.save_steps == 0 or step == plan.total_steps or new_best:
        hook = None if on_step is None else lambda at=step: on_step(at, "checkpoint")
        best = store.name(position.best["step"]) if position.best else None
        store.save(
            accelerator, _checkpoint_state(stage, position), cfg.checkpoint.keep_last, before_commit=hook, best=best
        )
    if on_step is not None:
        on_step(step, "step")
    if metrics:
        meter.reset()
    else:
        meter.pause(time.perf_counter() - paused)


def _window_metrics(stage: Stage, position: Position, window: Window, meter, flops) -> dict:
    """The logged step's metrics: the mean loss since the last logged step (over every process), lr, grad norm,
    throughput and memory; the window starts again."""
    import torch

    from geopilot.training import tracking

    accelerator, plan = stage.accelerator, stage.plan
    mean = accelerator.reduce(torch.tensor(window.loss_sum / window.loss_count, device=accelerator.device), "mean")
    position.last_loss, window.loss_sum, window.loss_count = float(mean), 0.0, 0
    seconds = time.perf_counter() - meter.started
    grad_norms = window.grad_norms
    metrics = {
        "train/loss": position.last_loss,
        "train/lr": stage.scheduler.get_last_lr()[0],
        "train/epoch": position.step / plan.steps_per_epoch,
        "train/grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"),
        **tracking.combine(gather_object([meter.state()]), window.steps, seconds, *flops, stage.world_size),
        **tracking.gpu_memory(),
    }
    window.grad_norms, window.steps = [], 0
    return metrics


def _evaluate(stage: Stage, pixel_dtype) -> dict:
    """The held-out loss and the planning scores of the current weights, and how long they took."""
    from geopilot.training.validation import validation_loss

    started = time.perf_counter()
    evaluated = {}
    if stage.eval_data is not None:
        evaluated.update(
            validation_loss(
                stage.accelerator, stage.model, stage.eval_data, stage.collator, stage.cfg.eval.batch_size, pixel_dtype
            )
        )
    if stage.planning is not None:
        evaluated.update(stage.planning.scores(stage.accelerator, stage.model))
    evaluated["time/eval_s"] = time.perf_counter() - started
    return evaluated


def _checkpoint_state(stage: Stage, position: Position) -> dict:
    return {
        **stage.identity,
        "step": position.step,
        "epoch": position.step // stage.plan.steps_per_epoch,
        "seed": stage.cfg.optim.seed,
        "loss": position.last_loss,
        "best": position.best,
        "last_eval": position.last_eval,
        "data": stage.data.report(),
    }


def _export(stage: Stage, position: Position) -> None:
    """The llava-hf layout + processor + chat template + what this run trained on and how it validated."""
    from geopilot.training import tracking
    from geopilot.training.deepspeed_config import zero_stage
    from geopilot.training.export import export_model, git_revision

    cfg, out = stage.cfg, Path(stage.cfg.output_dir)
    info = {
        "stage": cfg.stage,
        "steps": position.step,
        "final_loss": position.last_loss,
        "seed": cfg.optim.seed,
        "alpha": cfg.data.replay_alpha,
        "mixture_seed": cfg.data.mixture_seed,
        "data": stage.data.report(),
        "validation": {
            "last": position.last_eval,
            "best": position.best,
            "metrics": str(out / tracking.METRICS_FILE),
        },
        "world_size": stage.world_size,
        "engine": f"deepspeed zero-{zero_stage(stage.ds_config)}" if stage.ds_config else "ddp",
        "git_revision": git_revision(Path(__file__).resolve().parent),
        "config": cfg.model_dump(mode="json"),
    }
    exported = export_model(
        stage.accelerator, stage.model, stage.processor, out / "export", info, adapter=cfg.export.adapter
    )
    if exported is not None:
        log.info("exported %s", exported)


def gather_object(items: list) -> list:
    from accelerate.utils import gather_object as gather

    return gather(items)


def _grad_norm(norm, model) -> float:
    """The pre-clip gradient norm: accelerate returns it for DDP; DeepSpeed clips itself and reports it after."""
    if norm is None:
        getter = getattr(model, "get_global_grad_norm", None)
        norm = getter() if getter is not None else None
    return float("nan") if norm is None else float(norm)


def _update_best(keep_best: str | None, best: dict | None, evaluated: dict, step: int) -> tuple[dict | None, bool]:
    """(the best evaluation so far, whether this step is it). val_loss: lower is better; OPA: higher."""
    key = {"val_loss": "val/loss", "OPA": "val/planning/OPA"}.get(keep_best or "")
    value = evaluated.get(key) if key else None
    if value is None or not math.isfinite(value):
        return best, False
    better = best is None or (value < best["value"] if keep_best == "val_loss" else value > best["value"])
    if not better:
        return best, False
    return {"step": step, "metric": keep_best, "value": value}, True


class ProgressLine:
    """Rank 0's progress bar with ETA: step, loss, lr, tokens/s, and the latest validation loss."""

    def __init__(self, total: int, initial: int, stage: int, enabled: bool):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, initial=initial, desc=f"stage {stage}", disable=not enabled)
        self.postfix: dict[str, str] = {}

    def show(self, metrics: dict) -> None:
        shown = {
            "loss": ("train/loss", "{:.4f}"),
            "lr": ("train/lr", "{:.2e}"),
            "gnorm": ("train/grad_norm", "{:.2f}"),
            "tok/s": ("perf/tokens_per_s", "{:.0f}"),
            "val": ("val/loss", "{:.4f}"),
            "OPA": ("val/planning/OPA", "{:.3f}"),
        }
        for label, (key, form) in shown.items():
            if key in metrics:
                self.postfix[label] = form.format(metrics[key])
        self.bar.set_postfix(self.postfix, refresh=False)

    def advance(self, step: int) -> None:
        self.bar.update(step - self.bar.n)

    def close(self) -> None:
        self.bar.close()


class SampleLog:
    """Which sample ids each optimizer step trained on, per process. On resume, entries past the checkpoint
    are dropped, so a resumed run's log is comparable line for line with an uninterrupted one."""

    def __init__(self, path: Path, keep_up_to: int, enabled: bool = True):
        self.path, self.enabled = path, enabled
        if not enabled:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if path.is_file() and keep_up_to > 0:
            kept = [
                line for line in path.read_text(encoding="utf-8").splitlines() if json.loads(line)["step"] <= keep_up_to
            ]
        path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

    def write(self, step: int, epoch: int, ids: list[str]) -> None:
        if self.enabled:
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps({"step": step, "epoch": epoch, "ids": ids}) + "\n")


def _check_same_run(state: dict, run: dict, path: Path) -> None:
    from geopilot.training.checkpoint import CheckpointError

    if "settings" not in state:  # written before settings were part of a run's identity
        log.warning("%s does not record its settings: only the step plan and data are checked", path)
        state = {**state, "settings": run["settings"]}
    plan = {key: value for key, value in run.items() if key != "settings"}
    changed = changed_settings(current_settings(state["settings"]), run["settings"])
    changed += changed_settings({key: state.get(key) for key in plan}, plan)
    if changed:
        details = ", ".join(changed)
        raise CheckpointError(
            f"{path} belongs to a different run ({details}); use a new output_dir for this run (that one's "
            "checkpoints stay as they are)"
        )


def _setup_logging(is_main: bool) -> None:
    logging.basicConfig(level=logging.INFO if is_main else logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("geopilot.train").setLevel(logging.INFO if is_main else logging.WARNING)


def _log_start(cfg: TrainConfig, data, plan, ds_config: dict | None) -> None:
    from geopilot.training.deepspeed_config import zero_stage

    report = data.report()
    log.info("stage %d mixture: %s", cfg.stage, json.dumps(report["mixture"]))
    log.info("trained samples: %s; skipped: %s", json.dumps(report["trained"]), json.dumps(report["skipped"]))
    for example in report["skip_examples"][:5]:
        log.info("  skipped: %s", example)
    log.info(
        "steps: %d (%d per epoch, grad accumulation %d, %d processes)%s",
        plan.total_steps,
        plan.steps_per_epoch,
        plan.grad_accum,
        plan.world_size,
        f", DeepSpeed ZeRO-{zero_stage(ds_config)}" if ds_config else "",
    )


if __name__ == "__main__":  # deprecated entry, kept one release: `python -m geopilot.commands.train`
    from geopilot.commands.train import main

    print(
        "geopilot.training.recipe: `-m geopilot.training.recipe` is deprecated; use `-m geopilot.commands.train`",
        file=sys.stderr,
    )
    sys.exit(main())
