"""Rendered samples + images -> model input tensors. One collate for training (right padding) and generation (left)."""

from __future__ import annotations

from typing import Literal

from PIL import Image

from geopilot.render import IGNORE_INDEX, Rendered


def collate(rendered: list[Rendered], pad_token_id: int, padding_side: Literal["right", "left"] = "right") -> dict:
    """Pad ids with `pad_token_id`, labels with -100, and build the attention mask."""
    import torch

    width = max(len(r.input_ids) for r in rendered)
    ids = torch.full((len(rendered), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(rendered), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(rendered), width), dtype=torch.long)
    for row, r in enumerate(rendered):
        n = len(r.input_ids)
        span = slice(0, n) if padding_side == "right" else slice(width - n, width)
        ids[row, span] = torch.tensor(r.input_ids, dtype=torch.long)
        labels[row, span] = torch.tensor(r.labels, dtype=torch.long)
        mask[row, span] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def pixel_values(processor, images: list[Image.Image]):
    """8-bit RGB images (from `geopilot.image.load_image`) -> normalised, padded-to-square, resized pixel tensor."""
    return processor.image_processor(images, return_tensors="pt")["pixel_values"]
