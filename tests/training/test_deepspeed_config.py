"""The shipped DeepSpeed configs resolve and validate; typos are caught before anything launches."""

from __future__ import annotations

from pathlib import Path

import pytest

from geopilot.errors import ConfigError
from geopilot.training import deepspeed_config as dsc

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "deepspeed"


def resolved(data: dict, world: int = 2) -> dict:
    return dsc.resolve_auto(
        data,
        micro_batch=2,
        grad_accum=3,
        global_batch=6 * world,
        max_grad_norm=1.0,
        mixed_precision="bf16",
        hidden_size=lambda: 4096,
    )


@pytest.mark.parametrize("name, stage", [("zero2.json", 2), ("zero3.json", 3), ("zero3_offload.json", 3)])
def test_shipped_configs_validate(name, stage):
    data = resolved(dsc.read_deepspeed_json(CONFIGS / name))
    dsc.validate(data, name, world_size=2)
    assert dsc.zero_stage(data) == stage
    assert data["train_batch_size"] == 12 and data["bf16"]["enabled"] is True


def test_misspelt_section_is_named_with_a_suggestion():
    data = resolved(dsc.read_deepspeed_json(CONFIGS / "zero2.json"))
    data["zero_optimisation"] = data.pop("zero_optimization")
    with pytest.raises(ConfigError, match="'zero_optimisation' \\(did you mean 'zero_optimization'\\?\\)"):
        dsc.validate(data, "zero2.json", 2)


def test_misspelt_nested_key_and_bad_stage():
    data = resolved(dsc.read_deepspeed_json(CONFIGS / "zero2.json"))
    data["zero_optimization"]["overlap_com"] = True
    with pytest.raises(ConfigError, match="overlap_com"):
        dsc.validate(data, "zero2.json", 2)
    data = resolved(dsc.read_deepspeed_json(CONFIGS / "zero2.json"))
    data["zero_optimization"]["stage"] = 7
    with pytest.raises(ConfigError, match="invalid DeepSpeed config"):
        dsc.validate(data, "zero2.json", 2)


def test_batch_size_mismatch_and_unresolvable_auto(tmp_path):
    data = resolved(dsc.read_deepspeed_json(CONFIGS / "zero2.json"))
    with pytest.raises(ConfigError, match="train_batch_size 12 != micro batch 2 x accumulation 3 x world 4"):
        dsc.validate(data, "zero2.json", 4)
    with pytest.raises(ConfigError, match="zero_optimization.allgather_bucket_size"):
        resolved({"zero_optimization": {"stage": 2, "allgather_bucket_size": "auto"}})
    bad = tmp_path / "bad.json"
    bad.write_text('{"zero_optimization": {"stage": 2},}')
    with pytest.raises(ConfigError, match="not valid JSON"):
        dsc.read_deepspeed_json(bad)


@pytest.mark.parametrize("name", ["stage1.yaml", "stage2.yaml"])
def test_paper_configs_resolve_for_eight_processes(name, tmp_path):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    from geopilot.training.config import load_train_config
    from geopilot.training.stage_setup import deepspeed_settings, grad_accum_steps

    # LLaVA-1.5-7B's config (no weights): ZeRO-3's bucket sizes are read from its hidden size
    LlavaConfig(
        vision_config=CLIPVisionConfig(), text_config=LlamaConfig(hidden_size=4096, num_attention_heads=32)
    ).save_pretrained(tmp_path)
    cfg = load_train_config(CONFIGS.parent / name, [f"model.llava_path={tmp_path}"])
    assert (cfg.optim.lr, cfg.optim.global_batch_size, cfg.optim.epochs, cfg.optim.warmup_ratio) == (2e-5, 144, 2, 0.03)
    assert grad_accum_steps(cfg, world_size=8) == 2
    ds = deepspeed_settings(cfg, world_size=8)
    assert ds["train_batch_size"] == 144 and ds["train_micro_batch_size_per_gpu"] == 9 and ds["bf16"]["enabled"]
    assert ds["zero_optimization"]["reduce_bucket_size"] == 4096 * 4096
    with pytest.raises(ConfigError, match="not a multiple"):
        grad_accum_steps(cfg, world_size=5)


def test_zero3_bucket_sizes_follow_the_hidden_size_and_are_read_only_when_auto():
    sizes = []

    def hidden() -> int:
        sizes.append(4096)
        return 4096

    data = dsc.read_deepspeed_json(CONFIGS / "zero3.json")
    out = dsc.resolve_auto(data, 2, 3, 12, 1.0, "bf16", hidden_size=hidden)
    zero = out["zero_optimization"]
    assert (zero["reduce_bucket_size"], zero["stage3_prefetch_bucket_size"]) == (4096 * 4096, 15099494)
    assert zero["stage3_param_persistence_threshold"] == 40960 and sizes == [4096]
    dsc.validate(out, "zero3.json", world_size=2)
    dsc.resolve_auto(dsc.read_deepspeed_json(CONFIGS / "zero2.json"), 2, 3, 12, 1.0, "bf16", hidden_size=hidden)
    assert sizes == [4096]  # zero2.json fixes its buckets: the model config is not read


def test_hidden_size_comes_from_the_config_files(tmp_path):
    from transformers import LlamaConfig

    from geopilot.model import ModelConfig, text_hidden_size

    assert text_hidden_size(ModelConfig(init="tiny")) == ModelConfig().tiny.text_hidden
    LlamaConfig(hidden_size=96, num_attention_heads=4).save_pretrained(tmp_path)
    assert text_hidden_size(ModelConfig(init="clip_vicuna", vision_path=str(tmp_path), llm_path=str(tmp_path))) == 96


def test_the_pinned_top_level_names_cover_what_the_installed_deepspeed_reads():
    """DeepSpeed checks no top-level names itself; ours are pinned. Read the installed DeepSpeed's names the way its
    config reader spells them (constants + `param_dict[...]` / `param_dict.get(...)` in runtime/config.py): a new
    one fails here, so the pin is updated with the DeepSpeed version, never silently stale."""
    import inspect
    import re

    from deepspeed.runtime import config as ds_config
    from deepspeed.runtime import constants

    from geopilot.training.deepspeed_config import TOP_LEVEL_KEYS

    read = {
        v for k, v in vars(constants).items() if k.isupper() and isinstance(v, str) and re.fullmatch(r"[a-z0-9_]+", v)
    }
    read |= set(re.findall(r"param_dict(?:\.get\(|\[)\s*[\"']([a-z0-9_]+)[\"']", inspect.getsource(ds_config)))
    assert read <= TOP_LEVEL_KEYS, sorted(read - TOP_LEVEL_KEYS)
