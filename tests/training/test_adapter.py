"""Adapters (issue 26 item 4): export.adapter writes peft's format + the projector beside the merged model;
PeftModel.from_pretrained over the base, GeoPilot.from_pretrained(base, adapter=DIR) and `geopilot chat --adapter`
give the merged model's weights; QLoRA is refused in one line without CUDA."""

from __future__ import annotations

import json

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from train_helpers import stage1_args
from transformers import LlavaForConditionalGeneration

import train
from geopilot.agent import GeoPilot
from geopilot.cli import main as cli_main
from geopilot.model import ModelConfig, build_model, save_model

LORA = ["lora.enabled=true", "lora.r=4", "lora.alpha=8", "export.adapter=true", "optim.max_steps=2"]


@pytest.fixture(scope="module")
def adapter_run(dataset, tmp_path_factory):
    base_dir = tmp_path_factory.mktemp("adapter")
    base = save_model(*build_model(ModelConfig(init="tiny", tiny={"seed": 3})), base_dir / "base")
    out = base_dir / "run"
    assert train.main(stage1_args(dataset, out, "model.init=llava_hf", f"model.llava_path={base}", *LORA)) == 0
    return base, out / "export"


def assert_same_weights(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    worst = max((got[k].double() - want[k].double()).abs().max().item() for k in want)
    assert worst <= 1e-6, worst


def test_adapter_loads_with_peft_over_the_base_and_equals_the_merged_export(adapter_run):
    base, export = adapter_run
    adapter = export / "adapter"
    assert {"adapter_config.json", "adapter_model.safetensors", "projector.safetensors"} <= {
        p.name for p in adapter.iterdir()
    }
    merged = LlavaForConditionalGeneration.from_pretrained(export).state_dict()
    peft_model = PeftModel.from_pretrained(LlavaForConditionalGeneration.from_pretrained(base), adapter)
    assert_same_weights(peft_model.merge_and_unload().state_dict(), merged)
    projector = load_file(adapter / "projector.safetensors")
    assert projector.keys() == {k.removeprefix("model.multi_modal_projector.") for k in merged if "projector" in k}
    initial = LlavaForConditionalGeneration.from_pretrained(base).state_dict()
    for name, value in projector.items():
        assert torch.equal(value, merged[f"model.multi_modal_projector.{name}"])
    assert any(not torch.equal(v, initial[f"model.multi_modal_projector.{k}"]) for k, v in projector.items())
    info = json.loads((adapter / "geopilot_train.json").read_text())
    assert info["adapter_base"] == str(base)


def test_geopilot_from_pretrained_with_an_adapter(adapter_run):
    base, export = adapter_run
    pilot = GeoPilot.from_pretrained(base, adapter=export / "adapter", device="cpu")
    assert_same_weights(pilot.model.state_dict(), LlavaForConditionalGeneration.from_pretrained(export).state_dict())


def test_chat_with_an_adapter_and_a_bad_adapter(adapter_run, dataset, tmp_path, capsys):
    base, export = adapter_run
    image = next((dataset.parent / "images").glob("optical_*.png"))
    common = ["chat", "--model", str(base), "--image", str(image), "--max-new-tokens", "32", "--device", "cpu"]
    assert cli_main([*common, "--adapter", str(export / "adapter"), "--json", "How many planes?"]) == 0
    capsys.readouterr()
    assert cli_main([*common, "--adapter", str(tmp_path), "How many planes?"]) == 2
    assert f"no LoRA adapter at {tmp_path}" in capsys.readouterr().err


def test_export_adapter_without_lora_is_refused(dataset, tmp_path, capsys):
    assert train.main(stage1_args(dataset, tmp_path / "run", "export.adapter=true")) == 2
    assert "export.adapter writes a LoRA adapter: set lora.enabled=true" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_qlora_on_cpu_is_refused_in_one_line(adapter_run, dataset, tmp_path, capsys):
    base, _ = adapter_run
    args = stage1_args(dataset, tmp_path / "run", "model.init=llava_hf", f"model.llava_path={base}", *LORA)
    assert train.main([*args, "lora.qlora=true"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "train.py: error: lora.qlora needs a CUDA GPU (bitsandbytes 4-bit); this machine has none: drop lora.qlora"
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_qlora_trains_and_exports_adapter_and_full_precision_model(adapter_run, dataset, tmp_path):
    pytest.importorskip("bitsandbytes")
    base, _ = adapter_run
    out = tmp_path / "qlora"
    args = stage1_args(dataset, out, "model.init=llava_hf", f"model.llava_path={base}", *LORA, "lora.qlora=true")
    assert train.main(args) == 0
    merged = LlavaForConditionalGeneration.from_pretrained(out / "export")
    assert all(p.dtype in (torch.float32, torch.bfloat16) for p in merged.parameters())
    PeftModel.from_pretrained(LlavaForConditionalGeneration.from_pretrained(base), out / "export" / "adapter")
