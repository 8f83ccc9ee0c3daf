"""train.py end to end on CPU (in-process `main`): stage 1 then stage 2, exports that plain transformers loads,
and clear exit-2 errors for bad configs."""

from __future__ import annotations

import json

import torch
from train_helpers import stage1_args, stage2_args
from transformers import AutoProcessor, LlavaForConditionalGeneration

import train


def test_stage1_then_stage2_export_loads_in_plain_transformers(dataset, tmp_path):
    assert train.main(stage1_args(dataset, tmp_path / "s1", "optim.max_steps=3")) == 0
    export1 = tmp_path / "s1" / "export"
    info1 = json.loads((export1 / "geopilot_train.json").read_text())
    assert info1["stage"] == 1 and info1["steps"] == 3
    assert info1["data"]["trained"]["by_modality"] == {"optical": 24}
    assert {"git_revision", "seed", "alpha", "config"} <= set(info1)
    assert list((tmp_path / "s1" / "tensorboard").rglob("events.out.tfevents.*"))

    assert train.main(stage2_args(dataset, tmp_path / "s2", export1, "optim.max_steps=2", "data.mixture_seed=5")) == 0
    export2 = tmp_path / "s2" / "export"
    info2 = json.loads((export2 / "geopilot_train.json").read_text())
    mixture = info2["data"]["mixture"]
    assert mixture["selected"] == {"optical": 5, "sar": 12} and mixture["mixture_seed"] == 5 and mixture["alpha"] == 0.2
    state = json.loads(next((tmp_path / "s2" / "checkpoints").glob("step-*/trainer_state.json")).read_text())
    assert state["data"]["mixture"] == mixture  # the counts and the seed are in the checkpoint too

    model = LlavaForConditionalGeneration.from_pretrained(export2)  # plain transformers, no geopilot code
    processor = AutoProcessor.from_pretrained(export2)
    before = LlavaForConditionalGeneration.from_pretrained(export1)
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before.state_dict()[n])]
    assert changed and not any(n.startswith("model.vision_tower.") for n in changed)  # frozen by default
    assert processor.tokenizer.chat_template and processor.image_processor is not None


def test_stage2_without_a_stage1_model_is_a_clear_error(dataset, tmp_path, capsys):
    assert train.main(stage2_args(dataset, tmp_path / "s2", tmp_path / "missing")) == 2
    assert "stage 2 needs the stage-1 model" in capsys.readouterr().err


def test_misspelt_config_key_is_named(dataset, tmp_path, capsys):
    assert train.main(stage1_args(dataset, tmp_path / "s1", "optim.lrr=1e-4")) == 2
    assert "optim.lrr: unknown key" in capsys.readouterr().err


def test_deepspeed_config_typo_is_caught_before_launch(dataset, tmp_path, capsys):
    bad = tmp_path / "zero2.json"
    bad.write_text(
        json.dumps({"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2, "overlap_com": True}})
    )
    assert train.main(stage1_args(dataset, tmp_path / "s1", f"engine.deepspeed={bad}")) == 2
    assert "overlap_com" in capsys.readouterr().err
    assert not (tmp_path / "s1").exists()


def test_lora_trains_the_language_model_only_and_is_merged_at_export(dataset, tmp_path):
    out = tmp_path / "lora"
    args = ["optim.max_steps=2", "lora.enabled=true", "lora.r=4", "lora.alpha=8", "freeze.projector=true"]
    assert train.main(stage1_args(dataset, out, *args, "model.tiny.seed=3")) == 0
    from geopilot.model import ModelConfig, build_model

    initial = build_model(ModelConfig(init="tiny", tiny={"seed": 3}))[0].state_dict()
    exported = LlavaForConditionalGeneration.from_pretrained(out / "export").state_dict()
    assert exported.keys() == initial.keys()  # merged: no lora_A/lora_B, no peft wrappers
    changed = {n.split(".")[1] for n, p in exported.items() if not torch.equal(p, initial[n])}
    assert changed == {"language_model"}  # the vision tower is frozen, the projector frozen by the flag


def test_freeze_flags_select_the_trainable_components(dataset, tmp_path):
    from geopilot.model import ModelConfig, build_model
    from geopilot.training.config import load_train_config
    from geopilot.training.stage_setup import apply_freeze

    model, _ = build_model(ModelConfig(init="tiny"))
    for flags, trainable in [
        ({}, {"multi_modal_projector", "language_model", "lm_head"}),  # LLaVA-1.5: all but the vision tower
        ({"freeze.language_model": "true"}, {"multi_modal_projector"}),  # projector-only (LLaVA pre-training)
        ({"freeze.vision_tower": "false", "freeze.projector": "true"}, {"vision_tower", "language_model", "lm_head"}),
    ]:
        cfg = load_train_config(
            None, ["stage=1", "output_dir=x", "data.files=[x]", *(f"{k}={v}" for k, v in flags.items())]
        )
        apply_freeze(model, cfg)
        names = {n.removeprefix("model.").split(".")[0] for n, p in model.named_parameters() if p.requires_grad}
        assert names == trainable, flags
