"""Resolution as a setting: image tokens, prefill time and answer-turn time to first token at 448, 896 and 1344 px,
LLaVA-1.5 (a fixed square) beside Qwen2.5-VL (native resolution within min/max pixels), on random models.

For each family and image size: a chat's first turn is prefilled (image encoded + prompt, one token generated), then
the answer turn (a tool output) is prefilled on the reused KV cache and its first token generated; the median of
`--repeats` runs. `--shape tiny` uses configs/model/tiny*.yaml's sizes (CPU); `--shape 7b` builds random models of
LLaVA-1.5-7B's and Qwen2.5-VL-7B's shapes (a GPU; weights are random, the timings are the architecture's).

    python benchmarks/resolution.py [--shape tiny|7b] [--device cpu] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch
from output import emit  # benchmarks/output.py
from PIL import Image
from shapes import LLAVA_7B  # benchmarks/shapes.py

from geopilot.families import family_of_model
from geopilot.families.qwen2_5_vl import TinyQwenConfig
from geopilot.generation import GenerationOptions, KVSession
from geopilot.model import ModelConfig, build_model
from geopilot.tool_output import ToolOutput
from geopilot.wire import format_tool_turn

SIZES = (448, 896, 1344)
QUESTION = "How many planes are parked on the apron?"
SHAPES = {
    "tiny": {
        "llava": ModelConfig(family="llava", init="tiny"),
        "qwen2_5_vl": ModelConfig(family="qwen2_5_vl", init="tiny"),
    },
    "7b": {  # LLaVA-1.5-7B (CLIP ViT-L/14-336 + Vicuna-7B) and Qwen2.5-VL-7B-Instruct, as their config.json give them
        "llava": ModelConfig(
            family="llava",
            init="tiny",
            dtype="bfloat16",
            tiny=LLAVA_7B,
        ),
        "qwen2_5_vl": ModelConfig(
            family="qwen2_5_vl",
            init="tiny",
            dtype="bfloat16",
            tiny_qwen=TinyQwenConfig(
                text_hidden=3584,
                text_layers=28,
                text_heads=28,
                text_kv_heads=4,
                text_intermediate=18944,
                mrope_section=[16, 24, 24],
                vision_hidden=1280,
                vision_intermediate=3420,
                vision_depth=32,
                vision_heads=16,
                window_size=112,
                fullatt_block_indexes=[7, 15, 23, 31],
            ),
        ),
    },
}


def measure(model, processor, size: int, repeats: int) -> dict:
    """Image tokens, prefill seconds (encode + first turn's prompt) and answer-turn TTFT, medians over `repeats`."""
    family, tokenizer = family_of_model(model), processor.tokenizer
    image = Image.fromarray(np.random.default_rng(size).integers(0, 255, (size, size, 3), dtype=np.uint8))
    tokens = family.image_token_count(processor, size, size)
    prompt = family.prompt_ids([_user()], tokenizer, tokens)
    tool_turn = format_tool_turn([("detect_objects", ToolOutput(error="none found"))], QUESTION)
    options = GenerationOptions(max_new_tokens=1, min_new_tokens=1)
    prefill, answer = [], []
    for _ in range(repeats + 1):  # the first run warms up
        inputs = family.image_inputs(processor, [image])
        pixels = inputs.pop("pixel_values")
        session = KVSession(model, tokenizer, [prompt], pixels, options, **inputs)
        [think] = session.generate([0])
        [reply] = session.generate([0], [family.tail_ids(tokenizer, tool_turn)])
        prefill.append(session.encode_seconds + think.seconds)
        answer.append(reply.seconds)
    return {
        "image_px": size,
        "image_tokens": tokens,
        "prompt_tokens": len(prompt),
        "prefill_s": statistics.median(prefill[1:]),
        "answer_ttft_s": statistics.median(answer[1:]),
    }


def _user():
    from geopilot.sample import UserMessage

    return UserMessage(role="user", content=f"<image>\n{QUESTION}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    for name, cfg in SHAPES[args.shape].items():
        with torch.device(args.device):  # random weights initialised where they run
            model, processor = build_model(cfg)
        model.eval()
        for size in SIZES:
            rows.append({"family": name, **measure(model, processor, size, args.repeats)})
        del model
    report = {"shape": args.shape, "device": args.device, "repeats": args.repeats, "rows": rows}

    def text() -> None:
        print(f"{'family':<11} {'px':>5} {'image tok':>9} {'prompt':>7} {'prefill s':>10} {'answer TTFT s':>14}")
        for r in rows:
            print(
                f"{r['family']:<11} {r['image_px']:>5} {r['image_tokens']:>9} {r['prompt_tokens']:>7} "
                f"{r['prefill_s']:>10.4f} {r['answer_ttft_s']:>14.4f}"
            )

    return emit(report, args.json, text)


if __name__ == "__main__":
    raise SystemExit(main())
