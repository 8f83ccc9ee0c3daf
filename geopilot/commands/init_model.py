"""`geopilot init-model --config configs/model/tiny.yaml --out DIR`: build the model and write it in its family's
transformers layout (llava-hf, or Qwen2.5-VL's)."""

from __future__ import annotations

import argparse
import json

from geopilot.config import add_override_arguments, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="model YAML (configs/model/*.yaml)")
    parser.add_argument("--out", required=True, help="output directory (weights as safetensors + processor)")
    add_override_arguments(parser, "dtype=bfloat16 tiny.seed=1")
    parser.add_argument("--json", action="store_true", help="print a machine-readable summary")


def run(args: argparse.Namespace) -> int:
    from geopilot.families import family_of_model
    from geopilot.model import ModelConfig, build_model, save_model

    cfg = load_config(ModelConfig, args.config, args.overrides)
    model, processor = build_model(cfg)
    out = save_model(model, processor, args.out)
    summary = {
        "out": str(out),
        "family": cfg.family,
        "init": cfg.init,
        "parameters": sum(p.numel() for p in model.parameters()),
        "image_tokens": family_of_model(model).image_token_count(processor, 448, 448),  # a 448 px square's
        "vocab_size": model.config.text_config.vocab_size,
        "tokenizer_size": len(processor.tokenizer),
    }
    print(json.dumps(summary) if args.json else "\n".join(f"{k}: {v}" for k, v in summary.items()))
    return 0
