"""Train GeoPilot: one stage of the two-stage curriculum (docs/design.md §6), resumable, on 1..N processes.

    python train.py --config configs/tiny/stage1.yaml [key=value ...]
    torchrun --nproc_per_node 8 train.py --config configs/stage2.yaml
    (DeepSpeed: engine.deepspeed=configs/deepspeed/zero3.json, in the YAML or as an override)

Reads top to bottom: config -> engine -> model -> data -> resume -> loop -> export. Re-running the same command
after a crash continues from the latest complete checkpoint with the same samples in the same order.
Exit codes: 0 done, 2 bad input (config, data, checkpoint; one line on stderr), 1 anything else.

From Python, `main(argv, on_step=callback)` calls `callback(step, event)` during the run: event "checkpoint" on the
main process half-way through writing that step's checkpoint (files saved, not yet committed), event "step" on every
process once the optimizer step and any checkpoint of it are complete. The resume tests kill the process from it,
as a pre-emption would; it is not part of the config.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from geopilot.config import add_override_arguments, parse_command_line
from geopilot.errors import GeoPilotInputError
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
        print(f"train.py: error: {err}", file=sys.stderr)
        return 2


def train(cfg: TrainConfig, on_step: StepCallback | None = None) -> int:
    import torch
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    from geopilot.model import num_image_tokens
    from geopilot.training.batching import Collator, LengthGroupedBatches, RandomBatches
    from geopilot.training.checkpoint import CheckpointStore
    from geopilot.training.data import build_training_data
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

    # --- engine: validate the DeepSpeed config before any process group exists, then start accelerate
    world_size = world_size_from_env()
    ds_config = deepspeed_settings(cfg, world_size)
    require_distributed_launch(ds_config)
    accelerator = make_accelerator(cfg, ds_config, world_size)
    _setup_logging(accelerator.is_main_process)
    set_seed(cfg.optim.seed)
    out = Path(cfg.output_dir)
    store = CheckpointStore(out / "checkpoints")
    resume = store.find_resumable() if cfg.checkpoint.resume else None

    # --- model and data
    model, processor = build_stage_model(cfg)
    with accelerator.main_process_first():  # the main process fills the tokenisation cache, the others read it
        data = build_training_data(
            cfg.data, cfg.stage, processor.tokenizer, num_image_tokens(model.config), cfg.cache_dir
        )
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
    loader = DataLoader(
        data.dataset,
        batch_sampler=batches,
        collate_fn=Collator(processor, cfg.data.max_pixels, cfg.data.image_cache),
        num_workers=cfg.data.num_workers,
    )
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

    # --- resume: model, optimizer, scheduler, RNG (accelerate) + data position (our step counter)
    step, last_loss = 0, float("nan")
    if resume is not None:
        path, state = resume
        _check_same_run(state, run, path)
        accelerator.load_state(str(path))
        step, last_loss = state["step"], state.get("loss", float("nan"))
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
    if cfg.logging.tensorboard:
        accelerator.init_trackers(f"stage{cfg.stage}")

    def checkpoint_state(at_step: int) -> dict:
        return {
            **run,
            "step": at_step,
            "epoch": at_step // plan.steps_per_epoch,
            "seed": cfg.optim.seed,
            "loss": last_loss,
            "data": data.report(),
        }

    # --- the loop: one optimizer step per `grad_accum` micro-batches per process
    pixel_dtype = next(accelerator.unwrap_model(model).parameters()).dtype
    progress = tqdm(
        total=plan.total_steps,
        initial=step,
        desc=f"stage {cfg.stage}",
        disable=not (accelerator.is_main_process and cfg.logging.progress_bar),
    )
    model.train()
    loss_sum, loss_count, non_finite = 0.0, 0, 0.0
    while step < plan.total_steps:
        epoch, done_in_epoch = divmod(step, plan.steps_per_epoch)
        batches.use_epoch(epoch)
        epoch_loader = accelerator.skip_first_batches(loader, done_in_epoch * grad_accum) if done_in_epoch else loader
        for batch in epoch_loader:
            sample_log.write(step + 1, epoch, batch.pop("sample_ids"))
            if "pixel_values" in batch:
                batch["pixel_values"] = batch["pixel_values"].to(pixel_dtype)
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                if accelerator.sync_gradients and cfg.optim.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.optim.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad()
            micro_loss = loss.detach().float().item()
            loss_sum, loss_count = loss_sum + micro_loss, loss_count + 1
            non_finite += 0.0 if math.isfinite(micro_loss) else 1.0
            if not accelerator.sync_gradients:
                continue
            # every process learns whether any diverged (one tiny all-reduce a step), so all stop together
            if float(accelerator.reduce(torch.tensor(non_finite, device=accelerator.device), "sum")) > 0:
                raise NonFiniteError(
                    f"step {step + 1}: the loss is not finite (NaN or inf); stopped with nothing exported, the last "
                    f"complete checkpoint is kept; lower optim.lr ({cfg.optim.lr:g}) or check the data"
                )
            scheduler.step()
            step += 1
            progress.update(1)
            if step % cfg.logging.logging_steps == 0 or step == plan.total_steps:
                mean = accelerator.reduce(torch.tensor(loss_sum / loss_count, device=accelerator.device), "mean")
                last_loss, loss_sum, loss_count = float(mean), 0.0, 0
                lr = scheduler.get_last_lr()[0]
                progress.set_postfix(loss=f"{last_loss:.4f}", lr=f"{lr:.2e}")
                if cfg.logging.tensorboard:
                    accelerator.log(
                        {"train/loss": last_loss, "train/lr": lr, "train/epoch": step / plan.steps_per_epoch}, step=step
                    )
            if step % cfg.checkpoint.save_steps == 0 or step == plan.total_steps:
                hook = None if on_step is None else lambda at=step: on_step(at, "checkpoint")
                store.save(accelerator, checkpoint_state(step), cfg.checkpoint.keep_last, before_commit=hook)
            if on_step is not None:
                on_step(step, "step")
            if step >= plan.total_steps or step % plan.steps_per_epoch == 0:
                break
    progress.close()

    # --- export: llava-hf layout + processor + chat template + what this run trained on
    info = {
        "stage": cfg.stage,
        "steps": step,
        "final_loss": last_loss,
        "seed": cfg.optim.seed,
        "alpha": cfg.data.alpha,
        "mixture_seed": cfg.data.mixture_seed,
        "data": data.report(),
        "world_size": world_size,
        "engine": f"deepspeed zero-{zero_stage(ds_config)}" if ds_config else "ddp",
        "git_revision": git_revision(Path(__file__).parent),
        "config": cfg.model_dump(mode="json"),
    }
    exported = export_model(accelerator, model, processor, out / "export", info)
    if exported is not None:
        log.info("exported %s", exported)
    accelerator.end_training()
    return 0


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
    old, new = state["settings"], run["settings"]
    changed = [
        f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)
    ]
    changed += [
        f"{k}: {state.get(k)!r} -> {value!r}" for k, value in run.items() if k != "settings" and state.get(k) != value
    ]
    if changed:
        details = ", ".join(changed)
        raise CheckpointError(
            f"{path} belongs to a different run ({details}); use a new output_dir or checkpoint.resume=false"
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
