"""The model in llava-hf layout: built three ways, loaded by plain transformers with the same logits as GeoPilot's path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from geopilot.batch import collate, pixel_values
from geopilot.cli import main
from geopilot.image import load_image
from geopilot.model import load_model, num_image_tokens, save_model, vit_l14_336_config
from geopilot.render import render_turns


def test_plain_transformers_loads_it_with_the_same_logits(tiny_model_dir, tmp_path):
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    path = tmp_path / "scene.png"
    Image.fromarray((np.random.RandomState(0).rand(40, 64, 3) * 255).astype(np.uint8)).save(path)
    question = "How many planes are on the apron?"

    model, processor = load_model(tiny_model_dir)  # GeoPilot's path: renderer ids + geopilot.image
    image = load_image(path).image
    rendered = render_turns([("user", "<image>\n" + question)], processor.tokenizer, num_image_tokens(model.config))
    batch = collate([rendered], processor.tokenizer.pad_token_id)
    with torch.no_grad():
        ours = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            pixel_values=pixel_values(processor, [image]),
        ).logits

    hf_model = LlavaForConditionalGeneration.from_pretrained(tiny_model_dir).eval()  # plain transformers
    hf_processor = AutoProcessor.from_pretrained(tiny_model_dir)
    conversation = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    prompt = hf_processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    inputs = hf_processor(images=Image.open(path), text=prompt, return_tensors="pt", add_special_tokens=False)
    assert inputs["input_ids"][0].tolist() == rendered.input_ids
    with torch.no_grad():
        theirs = hf_model(**inputs).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def test_real_vit_l14_336_config_gives_576_image_tokens():
    from transformers import CLIPVisionModel, LlamaConfig, LlavaConfig

    vision_config = vit_l14_336_config()
    config = LlavaConfig(
        vision_config=vision_config,
        text_config=LlamaConfig(),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )
    assert num_image_tokens(config) == 576
    with torch.device("meta"):  # shapes only, no weights
        tower = CLIPVisionModel(vision_config)
        hidden = tower(torch.empty(1, 3, 336, 336), output_hidden_states=True).hidden_states[-2]
    assert hidden[:, 1:].shape == (1, 576, 1024)  # "default" drops CLS


def _write_tiny_clip_and_llama(root, tokenizer):
    from transformers import CLIPConfig, CLIPModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    clip = CLIPModel(
        CLIPConfig(
            vision_config={
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "image_size": 28,
                "patch_size": 14,
            },
            text_config={
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "vocab_size": 99,
            },
            projection_dim=16,
        )
    )
    clip.save_pretrained(root / "clip")
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer) - 2,
            hidden_size=48,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
        )
    )
    llama.save_pretrained(root / "vicuna")
    tokenizer.save_pretrained(root / "vicuna")
    return clip, llama


def test_clip_plus_vicuna_plus_fresh_projector(tmp_path, tiny_tokenizer):
    clip, llama = _write_tiny_clip_and_llama(tmp_path, tiny_tokenizer)
    config = tmp_path / "model.yaml"
    config.write_text(
        yaml.safe_dump(
            {"init": "clip_vicuna", "vision_path": str(tmp_path / "clip"), "llm_path": str(tmp_path / "vicuna")}
        )
    )
    assert main(["init-model", "--config", str(config), "--out", str(tmp_path / "out")]) == 0
    model, processor = load_model(tmp_path / "out")
    assert num_image_tokens(model.config) == 4 and model.config.vision_feature_layer == -2
    assert model.config.text_config.vocab_size % 64 == 0 and model.config.text_config.vocab_size >= len(
        processor.tokenizer
    )
    torch.testing.assert_close(
        model.model.vision_tower.embeddings.patch_embedding.weight, clip.vision_model.embeddings.patch_embedding.weight
    )
    torch.testing.assert_close(
        model.model.language_model.layers[1].mlp.up_proj.weight, llama.model.layers[1].mlp.up_proj.weight
    )
    n = llama.config.vocab_size
    torch.testing.assert_close(model.lm_head.weight[:n], llama.lm_head.weight)
    assert (
        model.model.multi_modal_projector.linear_1.in_features == 32
        and model.model.multi_modal_projector.linear_2.out_features == 48
    )


def test_from_a_llava_hf_directory(tiny_model_dir, tmp_path):
    config = tmp_path / "model.yaml"
    config.write_text(yaml.safe_dump({"init": "llava_hf", "llava_path": str(tiny_model_dir)}))
    assert main(["init-model", "--config", str(config), "--out", str(tmp_path / "out")]) == 0
    original, _ = load_model(tiny_model_dir)
    rebuilt, _ = load_model(tmp_path / "out")
    for (name, a), (_, b) in zip(original.state_dict().items(), rebuilt.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, msg=name)


def test_save_is_atomic_and_replaces(tmp_path, tiny):
    model, processor = tiny
    out = save_model(model, processor, tmp_path / "m")
    assert (out / "model.safetensors").is_file() and not [p for p in tmp_path.iterdir() if p.name.startswith(".m.")]
    save_model(model, processor, out)  # overwriting an existing export works
    assert (out / "config.json").is_file()


@pytest.mark.parametrize(
    "content, message",
    [
        (
            {"init": "clip_vicuna", "vision_path": "/nonexistent/clip", "llm_path": "/nonexistent/v"},
            "vision_path directory not found",
        ),
        ({"init": "tiny", "tiny": {"image_sise": 32}}, "tiny.image_sise: unknown key"),
        ({"init": "gpt"}, "init"),
    ],
)
def test_bad_model_configs_exit_2_with_one_line(tmp_path, capsys, content, message):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(content))
    assert main(["init-model", "--config", str(config), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
