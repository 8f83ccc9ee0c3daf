"""DeepSpeed JSON configs: fill the "auto" values from the training config, then validate before launching.

Validation uses DeepSpeed's own `DeepSpeedConfig` (pydantic: it rejects unknown keys inside sections such as
`zero_optimization`, and bad values such as `stage: 7`). DeepSpeed does not check top-level key names, so a
misspelt section (`zero_optimisation`) would silently mean "no ZeRO": those are checked against the names
DeepSpeed's config reader knows, with a did-you-mean suggestion.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import json
import re
from collections.abc import Callable
from pathlib import Path

from geopilot.errors import ConfigError

# Sections read by DeepSpeed modules other than runtime/config.py's getters.
EXTRA_TOP_LEVEL_KEYS = {
    "zero_optimization",
    "amp",
    "activation_checkpointing",
    "flops_profiler",
    "tensorboard",
    "wandb",
    "csv_monitor",
    "comet",
    "comms_logger",
    "aio",
    "elasticity",
    "autotuning",
    "compression_training",
    "data_efficiency",
    "curriculum_learning",
    "nebula",
    "hybrid_engine",
    "pipeline",
    "compile",
    "weight_quantization",
    "sparse_attention",
    "sequence_parallel_size",
    "tensor_parallel",
    "timers",
    "expert_parallel",
    "checkpoint",
    "torch_autocast",
    "monitor_config",
    "quantize_training",
    "progressive_layer_drop",
    "eigenvalue",
    "graph_harvesting",
    "use_node_local_storage",
    "zenflow",
    "data_types",
    "steps_per_print",
    "dump_state",
    "train_batch_size",
}


BUCKET_KEYS = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")


def known_top_level_keys() -> set[str]:
    from deepspeed.runtime import config as ds_config
    from deepspeed.runtime import constants

    names = {
        v for k, v in vars(constants).items() if k.isupper() and isinstance(v, str) and re.fullmatch(r"[a-z0-9_]+", v)
    }
    names |= set(re.findall(r"param_dict(?:\.get\(|\[)\s*[\"']([a-z0-9_]+)[\"']", inspect.getsource(ds_config)))
    return names | EXTRA_TOP_LEVEL_KEYS


def read_deepspeed_json(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"engine.deepspeed: DeepSpeed config not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
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

    known = known_top_level_keys()
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
