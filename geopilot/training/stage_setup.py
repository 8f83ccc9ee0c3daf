"""The pieces train.py wires: the accelerate engine (DDP or DeepSpeed ZeRO), the stage's model, optimizer, schedule.

Gradient sync, sharding, mixed precision and checkpoint formats are accelerate's and DeepSpeed's; this module
only decides which of them a TrainConfig asks for. On CPU the same code runs over gloo (torchrun or one process).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from geopilot.errors import ConfigError, GeoPilotInputError, WeightsError
from geopilot.training import deepspeed_config
from geopilot.training.config import TrainConfig

EXPORT_INFO = "geopilot_train.json"


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


@dataclass
class StepPlan:
    grad_accum: int
    world_size: int
    batches_per_epoch: int  # per process
    steps_per_epoch: int
    total_steps: int
    warmup_steps: int


def grad_accum_steps(cfg: TrainConfig, world_size: int) -> int:
    per_step = cfg.optim.per_device_batch_size * world_size
    if cfg.optim.global_batch_size % per_step:
        raise ConfigError(
            f"optim.global_batch_size {cfg.optim.global_batch_size} is not a multiple of per_device_batch_size "
            f"{cfg.optim.per_device_batch_size} x {world_size} processes"
        )
    return cfg.optim.global_batch_size // per_step


def plan_steps(cfg: TrainConfig, batches_total: int, world_size: int) -> StepPlan:
    accum = grad_accum_steps(cfg, world_size)
    per_process = batches_total // world_size
    steps_per_epoch = per_process // accum
    if steps_per_epoch == 0:
        raise ConfigError(
            f"the training set gives no full optimizer step (global batch {cfg.optim.global_batch_size}); "
            "lower optim.global_batch_size or add data"
        )
    total = steps_per_epoch * cfg.optim.epochs
    if cfg.optim.max_steps is not None:
        total = min(total, cfg.optim.max_steps)
    return StepPlan(accum, world_size, per_process, steps_per_epoch, total, math.ceil(cfg.optim.warmup_ratio * total))


def deepspeed_settings(cfg: TrainConfig, world_size: int) -> dict | None:
    """The resolved + validated DeepSpeed config, or None without DeepSpeed. Runs before any process group."""
    if not cfg.engine.deepspeed:
        return None
    from geopilot.model import text_hidden_size

    raw = deepspeed_config.read_deepspeed_json(cfg.engine.deepspeed)
    resolved = deepspeed_config.resolve_auto(
        raw,
        cfg.optim.per_device_batch_size,
        grad_accum_steps(cfg, world_size),
        cfg.optim.global_batch_size,
        cfg.optim.max_grad_norm,
        cfg.optim.mixed_precision,
        hidden_size=lambda: text_hidden_size(cfg.model),
    )
    deepspeed_config.validate(resolved, cfg.engine.deepspeed, world_size)
    if cfg.lora.enabled and deepspeed_config.zero_stage(resolved) == 3:
        raise ConfigError("lora.enabled with ZeRO-3 is not supported (merging needs whole weights); use zero2.json")
    if cfg.eval.planning_cases and deepspeed_config.zero_stage(resolved) == 3:
        raise ConfigError(
            "eval.planning_cases with ZeRO-3 is not supported (each process generates its own cases over sharded "
            "weights); use zero2.json, or validation loss alone (data.eval_files)"
        )
    return resolved


def require_distributed_launch(ds_config: dict | None) -> None:
    """DeepSpeed starts no process group of its own: even one process must come from torchrun (or deepspeed)."""
    if ds_config is not None and "RANK" not in os.environ:
        raise ConfigError(
            "engine.deepspeed needs a distributed launch, even for one process; run "
            "`torchrun --nproc_per_node 1 train.py <the same arguments>` (or drop engine.deepspeed for one process)"
        )


def make_accelerator(cfg: TrainConfig, ds_config: dict | None, world_size: int, log_with: list | None = None):
    """DeepSpeed plugin when configured; otherwise DDP (or one process). gloo on CPU in both cases. `log_with`:
    the trackers (geopilot.training.tracking.tracker_kinds)."""
    import torch
    from accelerate import Accelerator, DeepSpeedPlugin
    from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs, ProjectConfiguration

    backend = cfg.engine.backend if cfg.engine.backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
    on_cpu = not torch.cuda.is_available()
    handlers = [DistributedDataParallelKwargs(find_unused_parameters=not cfg.freeze.vision_tower)]
    kwargs = {}
    if ds_config is not None:
        # accelerate only turns DeepSpeed on when not cpu=True; on a CPU host it then needs the gloo backend named.
        kwargs["deepspeed_plugin"] = DeepSpeedPlugin(
            hf_ds_config=ds_config, zero3_init_flag=deepspeed_config.zero_stage(ds_config) == 3
        )
        if world_size > 1 or on_cpu:
            handlers.append(InitProcessGroupKwargs(backend=backend))
    else:
        kwargs["cpu"] = on_cpu
    project = ProjectConfiguration(project_dir=cfg.output_dir, logging_dir=str(Path(cfg.output_dir) / "tensorboard"))
    return Accelerator(
        gradient_accumulation_steps=grad_accum_steps(cfg, world_size),
        mixed_precision=cfg.optim.mixed_precision,
        step_scheduler_with_optimizer=False,  # the schedule counts optimizer steps; train.py steps it
        log_with=log_with,
        project_config=project,
        kwargs_handlers=handlers,
        **kwargs,
    )


def stage_one_export(cfg: TrainConfig) -> Path:
    """Stage 2 starts from the stage-1 export; say so clearly when it is not there."""
    checkpoint = cfg.model.checkpoint_dir
    path = Path(checkpoint or "")
    info = path / EXPORT_INFO
    if not checkpoint or not (path / "config.json").is_file():
        key = "llava_path" if cfg.model.init == "llava_hf" else "path"
        raise WeightsError(
            f"stage 2 needs the stage-1 model: model.{key}={checkpoint!r} is not a model directory "
            "(run stage 1 first, e.g. `geopilot train --config configs/tiny/stage1.yaml`; it exports to <output_dir>/export)"
        )
    if not info.is_file() or json.loads(info.read_text(encoding="utf-8")).get("stage") != 1:
        raise WeightsError(f"stage 2 needs a stage-1 export from train.py, but {path} has no stage-1 {EXPORT_INFO}")
    return path


class NonFiniteError(GeoPilotInputError):
    """NaN or inf where a run must never have them: the loss, loaded weights, weights about to be exported."""


def non_finite_tensors(model) -> list[str]:
    """Names of the parameters holding NaN or inf (under ZeRO-3 outside a gather, only this process's shard)."""
    import torch

    return [name for name, param in model.named_parameters() if not bool(torch.isfinite(param.detach()).all())]


def refuse_non_finite(model, what: str) -> None:
    bad = non_finite_tensors(model)
    if bad:
        total = sum(1 for _ in model.parameters())
        shown = ", ".join(bad[:3]) + (", ..." if len(bad) > 3 else "")
        raise NonFiniteError(f"{what}: {len(bad)} of {total} weight tensors hold NaN or inf ({shown})")


def build_stage_model(cfg: TrainConfig):
    """(model with the stage's trainable parameters, processor). Build after the accelerator (ZeRO-3 init)."""
    from geopilot.model import build_model

    if cfg.stage == 2:
        stage_one_export(cfg)
    model, processor = build_quantized_base(cfg) if cfg.lora.qlora else build_model(cfg.model)
    if cfg.model.init != "tiny":  # loaded weights: a diverged export must not become the next stage's start
        refuse_non_finite(model, f"the weights of model.init={cfg.model.init}")
    apply_freeze(model, cfg)
    if cfg.optim.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    if cfg.lora.enabled:
        model = apply_lora(model, cfg)
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError("every component is frozen (freeze.*): nothing would train")
    return model, processor


def build_quantized_base(cfg: TrainConfig):
    """QLoRA: the llava-hf base in 4 bits (bitsandbytes NF4, bf16 compute) on this process's GPU."""
    import torch

    if not torch.cuda.is_available():
        raise ConfigError("lora.qlora needs a CUDA GPU (bitsandbytes 4-bit); this machine has none: drop lora.qlora")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ConfigError("lora.qlora needs the bitsandbytes package: pip install bitsandbytes") from None
    if cfg.model.init != "llava_hf":
        raise ConfigError("lora.qlora quantizes a saved model: set model.init=llava_hf and model.llava_path")
    from peft import prepare_model_for_kbit_training
    from transformers import BitsAndBytesConfig, LlavaForConditionalGeneration

    from geopilot.model import build_processor, load_tokenizer

    quantization = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_use_double_quant=True,
        llm_int8_skip_modules=["vision_tower", "multi_modal_projector", "lm_head"],
    )
    device = int(os.environ.get("LOCAL_RANK", "0"))
    model = LlavaForConditionalGeneration.from_pretrained(
        cfg.model.llava_path, quantization_config=quantization, device_map={"": device}, dtype=torch.bfloat16
    )
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=cfg.optim.gradient_checkpointing)
    vision = model.config.vision_config
    return model, build_processor(
        load_tokenizer(cfg.model.tokenizer_path or cfg.model.llava_path), vision.image_size, vision.patch_size
    )


def apply_freeze(model, cfg: TrainConfig) -> None:
    from geopilot.families import family_of_model

    groups = family_of_model(model).FREEZE_GROUPS
    frozen = [prefixes for name, prefixes in groups.items() if getattr(cfg.freeze, name)]
    for name, param in model.named_parameters():
        param.requires_grad = not any(name.startswith(p) for prefixes in frozen for p in prefixes)


def apply_lora(model, cfg: TrainConfig):
    """peft trains the adapters + `modules_to_save` (the projector, unless freeze.projector says otherwise)."""
    from peft import LoraConfig, get_peft_model

    from geopilot.families import family_of_model

    lora, family = cfg.lora, family_of_model(model)
    saved = family.MODULES_TO_SAVE if lora.modules_to_save is None else lora.modules_to_save
    matches = [n for n, _ in model.named_modules() if re.fullmatch(lora.target_modules, n)]
    if not matches:
        raise ConfigError(f"lora.target_modules {lora.target_modules!r} matches no module of the model")
    peft_config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        modules_to_save=[m for m in saved if not (cfg.freeze.projector and m in family.MODULES_TO_SAVE)],
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, peft_config)


def build_optimizer_and_schedule(model, cfg: TrainConfig, plan: StepPlan):
    import torch
    from transformers import (
        get_constant_schedule_with_warmup,
        get_cosine_schedule_with_warmup,
        get_linear_schedule_with_warmup,
    )

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=cfg.optim.lr, betas=cfg.optim.betas, eps=cfg.optim.eps, weight_decay=cfg.optim.weight_decay
    )
    if cfg.optim.scheduler == "constant":
        scheduler = get_constant_schedule_with_warmup(optimizer, plan.warmup_steps)
    else:
        make = get_cosine_schedule_with_warmup if cfg.optim.scheduler == "cosine" else get_linear_schedule_with_warmup
        scheduler = make(optimizer, plan.warmup_steps, plan.total_steps)
    return optimizer, scheduler
