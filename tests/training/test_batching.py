"""Length-grouped batches: deterministic per (seed, epoch), every sample at most once, far less padding."""

from __future__ import annotations

import random

from geopilot.training.batching import LengthGroupedBatches, RandomBatches


def lengths(n: int = 203, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.choice([rng.randint(60, 120), rng.randint(300, 900)]) for _ in range(n)]


def useful_fraction(batches, lens) -> float:
    useful = sum(lens[i] for b in batches for i in b)
    padded = sum(max(lens[i] for i in b) * len(b) for b in batches)
    return useful / padded


def test_deterministic_per_seed_and_epoch():
    lens = lengths()
    a, b = LengthGroupedBatches(lens, 4, 2, seed=3), LengthGroupedBatches(lens, 4, 2, seed=3)
    assert list(a) == list(b)
    first = list(a)
    a.use_epoch(1)
    assert list(a) != first
    assert list(LengthGroupedBatches(lens, 4, 2, seed=4)) != first


def test_batches_are_full_disjoint_and_a_multiple_of_the_step():
    lens = lengths()
    for sampler in (LengthGroupedBatches(lens, 4, 6, seed=0), RandomBatches(lens, 4, 6, seed=0)):
        batches = list(sampler)
        assert len(batches) == len(sampler) and len(batches) % 6 == 0
        assert all(len(b) == 4 for b in batches)
        flat = [i for b in batches for i in b]
        assert len(flat) == len(set(flat)) and len(flat) >= len(lens) - 4 * 6


def test_length_grouping_cuts_padding():
    lens = lengths(1000)
    grouped = useful_fraction(list(LengthGroupedBatches(lens, 8, 1, seed=0, megabatch_batches=32)), lens)
    baseline = useful_fraction(list(RandomBatches(lens, 8, 1, seed=0)), lens)
    assert grouped > 0.9 > baseline


def test_the_image_cache_gives_the_same_pixels_and_stays_bounded(tmp_path, tiny_tokenizer):
    import torch
    from PIL import Image

    from geopilot.batch import pixel_values
    from geopilot.image import load_image
    from geopilot.model import build_processor
    from geopilot.training.batching import Collator

    paths = []
    for i, colour in enumerate([(200, 30, 30), (30, 200, 30), (30, 30, 200)]):
        paths.append(str(tmp_path / f"{i}.png"))
        Image.new("RGB", (40 + 8 * i, 40), colour).save(paths[-1])
    rows = [
        {"id": str(i), "images": [p], "input_ids": [5, 6, 7][: 1 + i % 3], "labels": [-100, 6, 7][: 1 + i % 3]}
        for i, p in enumerate(paths + paths[::-1])
    ]
    processor = build_processor(tiny_tokenizer, image_size=32, patch_size=8)
    plain, cached = Collator(processor), Collator(processor, image_cache=2)
    for start in (0, 3, 0):
        expected = plain(rows[start : start + 3])
        got = cached(rows[start : start + 3])
        batched = pixel_values(processor, [load_image(r["images"][0]).image for r in rows[start : start + 3]])
        assert torch.equal(got["pixel_values"], batched) and torch.equal(expected["pixel_values"], batched)
        assert torch.equal(got["input_ids"], expected["input_ids"]) and got["sample_ids"] == expected["sample_ids"]
        assert len(cached._cached) == 2  # used, and bounded
    assert not plain._cached
