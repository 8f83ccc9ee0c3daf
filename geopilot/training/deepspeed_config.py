"""DeepSpeed JSON configs: fill the "auto" values from the training config, then validate before launching.

Validation uses DeepSpeed's own `DeepSpeedConfig` (pydantic: it rejects unknown keys inside sections such as
`zero_optimization`, and bad values such as `stage: 7`). DeepSpeed does not check top-level key names, so a
misspelt section (`zero_optimisation`) would silently mean "no ZeRO": those are checked against the names
DeepSpeed's config reader knows, with a did-you-mean suggestion.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Callable
from pathlib import Path

from geopilot.config import CONFIG_MAX_BYTES
from geopilot.errors import ConfigError, GeoPilotInputError
from geopilot.fileio import read_json

# Every top-level name DeepSpeed 0.19 reads (runtime/config.py's getters, runtime/constants.py, and the sections other
# modules read), pinned here; tests/training/test_deepspeed_config.py checks the installed DeepSpeed against it, so a
# new DeepSpeed section is a failing test, not a key refused at launch.
TOP_LEVEL_KEYS = frozenset(
    {
        "06:30:33,238]",
        "CPU.",
        "GPU",
        "If",
        "Setting",
        "[2026-12-03",
        "[WARNING]",
        "[real_accelerator.py:213:get_accelerator]",
        "accelerator",
        "accelerator,",
        "activation_checkpointing",
        "aio",
        "amp",
        "auto",
        "auto_cast",
        "autotuning",
        "bf16",
        "bf16_master_weights_and_grads",
        "bf16_optimizer_states",
        "bfloat16",
        "buffer_dtype",
        "check_overflow",
        "checkpoint",
        "comet",
        "comms_logger",
        "communication_data_type",
        "compile",
        "compression_training",
        "consecutive_hysteresis",
        "csv_monitor",
        "curriculum_learning",
        "data_efficiency",
        "data_parallel_group",
        "data_types",
        "dataloader_drop_last",
        "ddp_bf16",
        "detect",
        "disable_allgather",
        "disable_python_gc",
        "ds_pipe_replicated",
        "dtype",
        "dump_state",
        "eigenvalue",
        "elasticity",
        "enabled",
        "encode",
        "eval",
        "expert_parallel",
        "flops_profiler",
        "fp16",
        "fp16_master_weights_and_grads",
        "fp32",
        "global_rank",
        "grad_accum_dtype",
        "gradient_accumulation_steps",
        "gradient_allreduce_op",
        "gradient_clipping",
        "gradient_predivide_factor",
        "graph_harvesting",
        "have",
        "hybrid_engine",
        "hysteresis",
        "immediate_grad_update",
        "initial_scale_power",
        "it.",
        "keep_in_fp32_modules",
        "legacy_fusion",
        "load_universal",
        "log_level",
        "loss_scale",
        "loss_scale_window",
        "lower_precision_safe_modules",
        "managed_gradient_accumulation",
        "max_grad_norm",
        "mean",
        "memory_breakdown",
        "min_loss_scale",
        "monitor_config",
        "nebula",
        "optimizer",
        "or",
        "other",
        "parallel_write",
        "param_dtype",
        "params",
        "pipeline",
        "pipeline_stage",
        "predict",
        "prescale_gradients",
        "progressive_layer_drop",
        "quantize_training",
        "scheduler",
        "seq_parallel_communication_data_type",
        "sequence_parallel_size",
        "sparse_attention",
        "steps_per_print",
        "sum",
        "tag_validation",
        "tensor_parallel",
        "tensorboard",
        "timers",
        "to",
        "torch_autocast",
        "train",
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "type",
        "unable",
        "use_data_before_expert_parallelism",
        "use_node_local_storage",
        "vocabulary_size",
        "wall_clock_breakdown",
        "wandb",
        "we",
        "weight_quantization",
        "were",
        "you",
        "zenflow",
        "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer",
        "zero_optimization",
    }
)


BUCKET_KEYS = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")


def read_deepspeed_json(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"engine.deepspeed: DeepSpeed config not found: {path}")
    try:
        data = read_json(path, CONFIG_MAX_BYTES, "DeepSpeed config")
    except GeoPilotInputError as err:
        raise ConfigError(str(err)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be an object")
    refuse_engine_sections(data, str(path))
    return data


# Sections GeoPilot fills itself: AdamW and the warmup + cosine schedule come from `optim.*`, built before
# accelerate wraps them; a DeepSpeed optimizer or scheduler would replace them behind the config's back.
OWNED_SECTIONS = {"optimizer": "optim.lr / optim.weight_decay", "scheduler": "optim.warmup_ratio (cosine schedule)"}


def refuse_engine_sections(data: dict, source: str) -> None:
    """Refuse `optimizer` / `scheduler` sections (at config load, before any process starts)."""
    present = [key for key in OWNED_SECTIONS if key in data]
    if present:
        where = "; ".join(f"{key!r} is set by {OWNED_SECTIONS[key]}" for key in present)
        raise ConfigError(f"{source}: remove the {' and '.join(repr(k) for k in present)} section(s): {where}")


def resolve_auto(
    data: dict,
    micro_batch: int,
    grad_accum: int,
    global_batch: int,
    max_grad_norm: float,
    mixed_precision: str,
    hidden_size: Callable[[], int] | None = None,
) -> dict:
    """Replace "auto" with the values the training config fixes (the same keys and rules as the HF Trainer).

    The ZeRO bucket sizes scale with the model: `hidden_size()` is called only when one of them is "auto".
    """
    resolved = copy.deepcopy(data)
    zero = resolved.get("zero_optimization")
    if hidden_size is not None and isinstance(zero, dict) and "auto" in (zero.get(k) for k in BUCKET_KEYS):
        h = hidden_size()
        sizes = {"reduce_bucket_size": h * h, "stage3_prefetch_bucket_size": int(0.9 * h * h)}
        sizes["stage3_param_persistence_threshold"] = 10 * h
        zero.update({k: v for k, v in sizes.items() if zero.get(k) == "auto"})
    fills = {
        ("train_micro_batch_size_per_gpu",): micro_batch,
        ("gradient_accumulation_steps",): grad_accum,
        ("train_batch_size",): global_batch,
        ("gradient_clipping",): max_grad_norm,
        ("bf16", "enabled"): mixed_precision == "bf16",
        ("fp16", "enabled"): mixed_precision == "fp16",
    }
    for keys, value in fills.items():
        node = resolved
        for key in keys[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get(keys[-1]) == "auto":
            node[keys[-1]] = value
    left = [key for key, value in _flatten(resolved) if value == "auto"]
    if left:
        raise ConfigError(f"DeepSpeed config: cannot resolve 'auto' for {', '.join(left)}; give an explicit value")
    return resolved


def _flatten(data: dict, prefix: str = ""):
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def validate(resolved: dict, source: str, world_size: int) -> None:
    """Raise ConfigError naming the problem; `world_size` is the launch's (no process group is needed)."""
    from deepspeed.runtime.config import DeepSpeedConfig

    known = TOP_LEVEL_KEYS
    unknown = sorted(set(resolved) - known)
    if unknown:
        hints = [
            f"{k!r} (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(k, known, n=1)) else repr(k)
            for k in unknown
        ]
        raise ConfigError(f"{source}: unknown DeepSpeed key(s) {', '.join(hints)}")
    micro = resolved.get("train_micro_batch_size_per_gpu")
    accum = resolved.get("gradient_accumulation_steps", 1)
    total = resolved.get("train_batch_size")
    if (
        isinstance(micro, int)
        and isinstance(accum, int)
        and isinstance(total, int)
        and total != micro * accum * world_size
    ):
        raise ConfigError(
            f"{source}: train_batch_size {total} != micro batch {micro} x accumulation {accum} x world {world_size}"
        )
    checkable = {k: v for k, v in resolved.items() if k != "train_batch_size"}  # DeepSpeedConfig assumes world 1 here
    try:
        DeepSpeedConfig(checkable)
    except Exception as err:  # pydantic ValidationError, AssertionError, TypeError: all mean a bad config
        first = str(err).strip().splitlines()
        raise ConfigError(
            f"{source}: invalid DeepSpeed config: {' '.join(line.strip() for line in first[:3])}"
        ) from None


def zero_stage(resolved: dict) -> int:
    return int(resolved.get("zero_optimization", {}).get("stage", 0))
