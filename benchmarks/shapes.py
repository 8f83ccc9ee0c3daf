"""The 7B shapes the benchmarks build with random weights, written once (each from its model's config.json)."""

from __future__ import annotations

from geopilot.model import TinyModelConfig

# LLaVA-1.5-7B: CLIP ViT-L/14-336 in front of Vicuna-7B-v1.5.
LLAVA_7B = TinyModelConfig(
    image_size=336,
    patch_size=14,
    vision_hidden=1024,
    vision_layers=24,
    vision_heads=16,
    text_hidden=4096,
    text_layers=32,
    text_heads=32,
    text_kv_heads=32,
    text_intermediate=11008,
    max_position_embeddings=4096,
)


def llama_decoder_shape(shape: TinyModelConfig) -> dict:
    """The language model of `shape` as LlamaConfig keyword arguments."""
    return {
        "hidden_size": shape.text_hidden,
        "num_hidden_layers": shape.text_layers,
        "num_attention_heads": shape.text_heads,
        "intermediate_size": shape.text_intermediate,
    }
