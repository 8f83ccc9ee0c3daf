"""Batches: which samples go together (length-grouped or random) and how they become model inputs.

`LengthGroupedBatches` shuffles the samples, cuts them into mega-batches of `megabatch_batches` batches, sorts each
mega-batch by length and cuts it into batches, then shuffles the batch order: batches hold samples of similar
length (little padding) while the order stays random. `RandomBatches` is the LLaVA-style baseline (random order,
padded to the longest in each batch). Both depend only on (seed, epoch), and both yield per-device batches in
multiples of `batches_per_step` (world size x gradient accumulation) so every process runs the same number of
steps; the few samples left over change from epoch to epoch. accelerate shards the batches across processes.
"""

from __future__ import annotations

import random
from collections import OrderedDict

import torch

from geopilot.batch import collate
from geopilot.errors import ImageInputError
from geopilot.families import family_of_processor
from geopilot.image import load_image
from geopilot.render import Rendered


class _EpochBatches:
    def __init__(self, lengths: list[int], batch_size: int, batches_per_step: int, seed: int):
        self.lengths, self.batch_size, self.batches_per_step, self.seed = (
            list(lengths),
            batch_size,
            batches_per_step,
            seed,
        )
        self.epoch = 0

    def use_epoch(self, epoch: int) -> None:
        # Not named `set_epoch` on purpose: accelerate's DataLoaderShard calls `set_epoch(<its own iteration
        # count>)` on a batch sampler it wraps directly, which restarts at 0 for a resumed or skipping loader
        # and would silently replay epoch 0's order (huggingface/accelerate#2016). The training loop decides.
        self.epoch = epoch

    def __len__(self) -> int:
        full = len(self.lengths) // self.batch_size
        return full - full % self.batches_per_step

    def _rng(self) -> random.Random:
        return random.Random(f"{self.seed}:{self.epoch}")

    def batches(self) -> list[list[int]]:
        raise NotImplementedError

    def __iter__(self):
        yield from self.batches()[: len(self)]


class RandomBatches(_EpochBatches):
    def batches(self) -> list[list[int]]:
        order = list(range(len(self.lengths)))
        self._rng().shuffle(order)
        size = self.batch_size
        return [order[i : i + size] for i in range(0, len(order) - size + 1, size)]


class LengthGroupedBatches(_EpochBatches):
    def __init__(self, lengths, batch_size, batches_per_step, seed, megabatch_batches: int = 32):
        super().__init__(lengths, batch_size, batches_per_step, seed)
        self.megabatch = megabatch_batches * batch_size

    def batches(self) -> list[list[int]]:
        rng = self._rng()
        order = list(range(len(self.lengths)))
        rng.shuffle(order)
        size = self.batch_size
        usable = len(order) - len(order) % size  # the remainder is dropped before grouping, so batches are full
        batches = []
        for start in range(0, usable, self.megabatch):
            group = sorted(order[start : min(start + self.megabatch, usable)], key=lambda i: -self.lengths[i])
            batches += [group[i : i + size] for i in range(0, len(group), size)]
        rng.shuffle(batches)
        return batches


class Collator:
    """Dataset rows -> model inputs (right padding, -100 labels) + `sample_ids` for the per-step log.

    `image_cache` keeps that many processed images (least recently used out): generated traces hold several samples
    per scene, and decoding + resizing the same file again is most of a small model's data time.
    """

    def __init__(self, processor, max_pixels: int = 100_000_000, image_cache: int = 0):
        self.processor, self.max_pixels = processor, max_pixels
        self.family = family_of_processor(processor)
        self.pad_token_id = processor.tokenizer.pad_token_id
        self.image_cache, self._cached = image_cache, OrderedDict()

    def __call__(self, rows: list[dict]) -> dict:
        batch = collate([Rendered(list(r["input_ids"]), list(r["labels"])) for r in rows], self.pad_token_id)
        loaded = [[self._image_inputs(path) for path in r["images"]] for r in rows]  # each row's images, in order
        for row, images in zip(rows, loaded, strict=True):
            if len({size for _, size in images}) > 1:  # as the data check refuses them (data.check_images off)
                sizes = ", ".join("x".join(map(str, size)) for _, size in images)
                raise ImageInputError(f"sample {row['id']!r}: its images must be one size, got {sizes}")
        inputs = [one for images in loaded for one, _ in images]
        if inputs:
            batch.update({key: torch.cat([one[key] for one in inputs]) for key in inputs[0]})
            image_token_id = self.processor.image_token_id
            batch.update(self.family.vision_kwargs(image_token_id, batch["input_ids"], batch.get("image_grid_thw")))
        batch["sample_ids"] = [r["id"] for r in rows]
        return batch

    def _image_inputs(self, path: str) -> tuple[dict, tuple[int, int]]:
        """One image's model inputs (LLaVA: pixel_values; Qwen2.5-VL: also image_grid_thw) and its size, through
        the cache."""
        if path in self._cached:
            self._cached.move_to_end(path)
            return self._cached[path]
        image = load_image(path, max_pixels=self.max_pixels).image
        entry = (self.family.image_inputs(self.processor, [image]), image.size)
        if self.image_cache > 0:
            self._cached[path] = entry
            if len(self._cached) > self.image_cache:
                self._cached.popitem(last=False)
        return entry


def padding_stats(batch: dict) -> tuple[int, int]:
    """(non-padding tokens, all tokens) of a collated batch."""
    mask = batch["attention_mask"]
    return int(mask.sum()), int(mask.numel())
