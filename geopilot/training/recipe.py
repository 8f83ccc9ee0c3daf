"""The training recipe: one stage of the two-stage curriculum (docs/design.md §6), resumable, on 1..N processes.

`train(cfg, on_step)` reads top to bottom: config -> engine -> model -> data -> resume -> loop -> export. Re-running
the same command after a crash continues from the latest complete checkpoint with the same samples in the same
order. `train.py` at the top of the checkout and `python -m geopilot.training.recipe` are the same entry point:

    python -m geopilot.training.recipe --config configs/tiny/stage1.yaml [key=value ...]
    torchrun --nproc_per_node 8 -m geopilot.training.recipe --config configs/stage2.yaml

Exit codes: 0 done, 2 bad input (config, data, checkpoint; one line on stderr), 1 anything else.

`main(argv, on_step=callback)` calls `callback(step, event)` during the run: event "checkpoint" on the main process
half-way through writing that step's checkpoint (files saved, not yet committed), event "step" on every process once
the optimizer step and any checkpoint of it are complete. The resume tests kill the process from it, as a
pre-emption would; it is not part of the config.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from geopilot.config import add_override_arguments, parse_command_line
from geopilot.errors import GeoPilotInputError, echo, one_line
from geopilot.run_dir import changed_settings
from geopilot.training.config import TrainConfig, load_train_config, result_settings

log = logging.getLogger("geopilot.train")

StepEvent = Literal["checkpoint", "step"]
StepCallback = Callable[[int, StepEvent], None]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="train.py", description="Train one stage of GeoPilot.")
    parser.add_argument(
        "--config", required=True, help="training YAML (configs/stage1.yaml, configs/tiny/stage1.yaml, ...)"
    )
    add_override_arguments(parser, "optim.max_steps=10 data.alpha=0.5")
    return parse_command_line(parser, argv)


def main(argv: list[str] | None = None, on_step: StepCallback | None = None) -> int:
    args = parse_args(argv)
    try:
        return train(load_train_config(args.config, args.overrides), on_step)
    except GeoPilotInputError as err:
        print(f"train.py: error: {one_line(err)}", file=sys.stderr)
        return 2
    except PermissionError as err:  # a tracking folder or shared cache another user owns: say which, not a traceback
        where = f" {echo(str(err.filename))}" if err.filename else ""
        print(
            f"train.py: error: no permission to use{where} ({err.strerror or err}); choose an output_dir and "
            "data.cache_dir this user can write",
            file=sys.stderr,
        )
        return 2


def train(cfg: TrainConfig, on_step: StepCallback | None = None) -> int:
    import torch
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader

    from geopilot.training import tracking
    from geopilot.training.batching import Collator, LengthGroupedBatches, RandomBatches
    from geopilot.training.checkpoint import CheckpointStore
    from geopilot.training.data import ImageTokens, build_training_data
    from geopilot.training.deepspeed_config import zero_stage
    from geopilot.training.engine import (
        EXPORT_INFO,
        NonFiniteError,
        build_optimizer_and_schedule,
        build_stage_model,
        deepspeed_settings,
        make_accelerator,
        plan_steps,
        require_distributed_launch,
        world_size_from_env,
    )
    from geopilot.training.export import export_model, git_revision
    from geopilot.training.nodes import check_same_checkpoint, check_same_job
    from geopilot.training.validation import build_eval_data, per_sample_loss, validation_loss

    # --- engine: validate the DeepSpeed config before any process group exists, then start accelerate
    world_size = world_size_from_env()
    ds_config = deepspeed_settings(cfg, world_size)
    require_distributed_launch(ds_config)
    accelerator = make_accelerator(cfg, ds_config, world_size, tracking.tracker_kinds(cfg))
    _setup_logging(accelerator.is_main_process)
    check_same_job(accelerator, cfg)  # a node with another config or code version is refused before any work
    set_seed(cfg.optim.seed)
    out = Path(cfg.output_dir)
    store = CheckpointStore(out / "checkpoints")
    resume = store.find_resumable() if cfg.checkpoint.resume else None
    check_same_checkpoint(accelerator, resume)

    # --- model and data
    model, processor = build_stage_model(cfg)
    with accelerator.main_process_first():  # the main process fills the tokenisation cache, the others read it
        image_tokens = ImageTokens.of(processor, cfg.data.max_pixels)
        data = build_training_data(cfg.data, cfg.stage, processor.tokenizer, image_tokens, cfg.cache_dir)
        eval_data = None
        if cfg.data.eval_files:
            eval_data = build_eval_data(cfg.data, processor.tokenizer, image_tokens, cfg.cache_dir, data.dataset["id"])
    planning = None
    if cfg.eval.planning_cases:
        from geopilot.training.planning_eval import PlanningProbe

        planning = PlanningProbe(cfg.eval, processor)
    source_of = dict(zip(data.dataset["id"], data.dataset["source"], strict=True))
    batching = LengthGroupedBatches if cfg.data.group_by_length else RandomBatches
    grad_accum = accelerator.gradient_accumulation_steps
    batches = batching(
        list(data.dataset["length"]),
        cfg.optim.per_device_batch_size,
        world_size * grad_accum,
        cfg.optim.seed,
        **({"megabatch_batches": cfg.data.megabatch_batches} if cfg.data.group_by_length else {}),
    )
    plan = plan_steps(cfg, len(batches), world_size)
    collator = Collator(processor, cfg.data.max_pixels, cfg.data.image_cache)
    loader = DataLoader(data.dataset, batch_sampler=batches, collate_fn=collator, num_workers=cfg.data.num_workers)
    optimizer, scheduler = build_optimizer_and_schedule(model, cfg, plan)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    run = {
        "stage": cfg.stage,
        "world_size": world_size,
        "global_batch_size": cfg.optim.global_batch_size,
        "total_steps": plan.total_steps,
        "steps_per_epoch": plan.steps_per_epoch,
        "data_fingerprint": hashlib.sha256("\n".join(data.dataset["id"]).encode()).hexdigest(),
        "settings": result_settings(cfg),
    }
    _log_start(cfg, data, plan, ds_config)

    # --- resume: model, optimizer, scheduler, RNG (accelerate) + data position and best evaluation (our state)
    step, last_loss, best, last_eval = 0, float("nan"), None, {}
    if resume is not None:
        path, state = resume
        _check_same_run(state, run, path)
        accelerator.load_state(str(path))
        step, last_loss = state["step"], state.get("loss", float("nan"))
        best, last_eval = state.get("best"), state.get("last_eval", {})
        log.info("resumed from %s at step %d of %d", path, step, plan.total_steps)
    if step >= plan.total_steps and (out / "export" / EXPORT_INFO).is_file():
        log.info("this run finished at step %d: %s is kept as it is", step, out / "export")
        accelerator.end_training()
        return 0
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(cfg.model_dump_json(indent=1), encoding="utf-8")
    sample_log = SampleLog(
        out / "logs" / f"samples.rank{accelerator.process_index}.jsonl",
        keep_up_to=step,
        enabled=cfg.logging.log_sample_ids,
    )
    tracking.start_trackers(accelerator, cfg, step, tracking.flat_config(cfg))

    def checkpoint_state(at_step: int) -> dict:
        return {
            **run,
            "step": at_step,
            "epoch": at_step // plan.steps_per_epoch,
            "seed": cfg.optim.seed,
            "loss": last_loss,
            "best": best,
            "last_eval": last_eval,
            "data": data.report(),
        }

    # --- the loop: one optimizer step per `grad_accum` micro-batches per process
    unwrapped = accelerator.unwrap_model(model)
    pixel_dtype = next(unwrapped.parameters()).dtype
    flops_token, peak = tracking.flops_per_token(unwrapped), tracking.peak_flops(cfg)
    progress = ProgressLine(plan.total_steps, step, cfg.stage, accelerator.is_main_process and cfg.logging.progress_bar)
    meter = tracking.StepMeter(accelerator.device.type == "cuda")
    model.train()
    loss_sum, loss_count, non_finite, grad_norms, window_steps = 0.0, 0, 0.0, [], 0
    while step < plan.total_steps:
        epoch, done_in_epoch = divmod(step, plan.steps_per_epoch)
        batches.use_epoch(epoch)
        epoch_loader = accelerator.skip_first_batches(loader, done_in_epoch * grad_accum) if done_in_epoch else loader
        meter.lap("data")  # the loader's start (workers, skipping) counts as data time
        for batch in epoch_loader:
            meter.lap("data")
            sample_ids = batch.pop("sample_ids")
            sample_log.write(step + 1, epoch, sample_ids)
            if "pixel_values" in batch:
                batch["pixel_values"] = batch["pixel_values"].to(pixel_dtype)
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                accelerator.backward(loss)
                with torch.no_grad():
                    per_sample = per_sample_loss(outputs.logits.detach(), batch["labels"])
                del outputs
                meter.lap("forward_backward")
                norm = None
                if accelerator.sync_gradients:
                    norm = accelerator.clip_grad_norm_(model.parameters(), cfg.optim.max_grad_norm or math.inf)
                optimizer.step()
                optimizer.zero_grad()
                if accelerator.sync_gradients:
                    grad_norms.append(_grad_norm(norm, model))
            meter.add_batch(batch, [source_of[i] for i in sample_ids], per_sample)
            micro_loss = loss.detach().float().item()
            loss_sum, loss_count = loss_sum + micro_loss, loss_count + 1
            non_finite += 0.0 if math.isfinite(micro_loss) else 1.0
            if not accelerator.sync_gradients:
                meter.lap("optimizer")
                continue
            # every process learns whether any diverged (one tiny all-reduce a step), so all stop together
            if float(accelerator.reduce(torch.tensor(non_finite, device=accelerator.device), "sum")) > 0:
                raise NonFiniteError(
                    f"step {step + 1}: the loss is not finite (NaN or inf); stopped with nothing exported, the last "
                    f"complete checkpoint is kept; lower optim.lr ({cfg.optim.lr:g}) or check the data"
                )
            scheduler.step()
            step += 1
            window_steps += 1
            meter.lap("optimizer")
            metrics = {}
            if step % cfg.logging.logging_steps == 0 or step == plan.total_steps:
                mean = accelerator.reduce(torch.tensor(loss_sum / loss_count, device=accelerator.device), "mean")
                last_loss, loss_sum, loss_count = float(mean), 0.0, 0
                seconds = time.perf_counter() - meter.started
                metrics = {
                    "train/loss": last_loss,
                    "train/lr": scheduler.get_last_lr()[0],
                    "train/epoch": step / plan.steps_per_epoch,
                    "train/grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"),
                    **tracking.combine(
                        gather_object([meter.state()]), window_steps, seconds, flops_token, peak, world_size
                    ),
                    **tracking.gpu_memory(),
                }
                grad_norms, window_steps = [], 0
            is_eval_step = (eval_data is not None or planning is not None) and (
                step % cfg.eval.every_steps == 0 or step == plan.total_steps
            )
            new_best, paused = False, time.perf_counter()  # evaluation and checkpoints are not training time
            if is_eval_step:
                started = time.perf_counter()
                last_eval = {}
                if eval_data is not None:
                    last_eval.update(
                        validation_loss(accelerator, model, eval_data, collator, cfg.eval.batch_size, pixel_dtype)
                    )
                if planning is not None:
                    last_eval.update(planning.scores(accelerator, model))
                last_eval["time/eval_s"] = time.perf_counter() - started
                metrics.update(last_eval)
                best, new_best = _update_best(cfg.checkpoint.keep_best, best, last_eval, step)
            if metrics:
                accelerator.log(metrics, step=step)  # before the checkpoint: a resume drops it with the steps after
                progress.show(metrics)
            progress.advance(step)
            if step % cfg.checkpoint.save_steps == 0 or step == plan.total_steps or new_best:
                hook = None if on_step is None else lambda at=step: on_step(at, "checkpoint")
                store.save(
                    accelerator,
                    checkpoint_state(step),
                    cfg.checkpoint.keep_last,
                    before_commit=hook,
                    best=store.name(best["step"]) if best else None,
                )
            if on_step is not None:
                on_step(step, "step")
            if metrics:
                meter.reset()
            else:
                meter.pause(time.perf_counter() - paused)
            if step >= plan.total_steps or step % plan.steps_per_epoch == 0:
                break
    progress.close()

    # --- export: llava-hf layout + processor + chat template + what this run trained on and how it validated
    info = {
        "stage": cfg.stage,
        "steps": step,
        "final_loss": last_loss,
        "seed": cfg.optim.seed,
        "alpha": cfg.data.alpha,
        "mixture_seed": cfg.data.mixture_seed,
        "data": data.report(),
        "validation": {"last": last_eval, "best": best, "metrics": str(out / tracking.METRICS_FILE)},
        "world_size": world_size,
        "engine": f"deepspeed zero-{zero_stage(ds_config)}" if ds_config else "ddp",
        "git_revision": git_revision(Path(__file__).resolve().parent),
        "config": cfg.model_dump(mode="json"),
    }
    exported = export_model(accelerator, model, processor, out / "export", info, adapter=cfg.export.adapter)
    if exported is not None:
        log.info("exported %s", exported)
    accelerator.end_training()
    return 0


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
    changed = changed_settings(state["settings"], run["settings"])
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


if __name__ == "__main__":
    sys.exit(main())
