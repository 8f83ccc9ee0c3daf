"""The bi-temporal data of `geopilot synth` (LEVIR-CD and LEVIR-CC layouts) through `geopilot generate`'s template
backend becomes two-image training rows whose images are the pair in order (A, then B), and the tiny LLaVA trains
one step on a batch of them (both images in each row's forward)."""

from __future__ import annotations

import math


def test_synth_change_traces_train_one_step_with_both_images(tmp_path):
    import torch

    from geopilot.data_gen.generate import generate_dataset
    from geopilot.data_gen.generate_config import GenerateConfig
    from geopilot.data_gen.synthetic.datasets import write_synthetic
    from geopilot.model import ModelConfig, build_model, num_image_tokens
    from geopilot.tokenizer import IMAGE_TOKEN
    from geopilot.training.batching import Collator
    from geopilot.training.config import DataConfig
    from geopilot.training.data import build_training_data

    write_synthetic(tmp_path / "synth", seed=5, optical=5, sar=0)
    sources = [
        {"reader": r, "root": str(tmp_path / "synth" / n)}
        for r, n in (("levir_cd", "LEVIR-CD"), ("levir_cc", "LEVIR-CC"))
    ]
    config = GenerateConfig.model_validate(
        {"sources": sources, "samples_per_record": 1, "backend": {"kind": "template"}}
    )
    out = tmp_path / "traces"
    result = generate_dataset(config, out)
    files = [str(out / shard["path"]) for shard in result.manifest["shards"]]
    model, processor = build_model(ModelConfig(init="tiny"))
    tokens = num_image_tokens(model.config)
    data = build_training_data(DataConfig(files=files), 1, processor.tokenizer, tokens, tmp_path / "cache")
    rows = list(data.dataset)
    assert len(rows) >= 4 and {len(row["images"]) for row in rows} == {2}
    pairs = [row for row in rows if "LEVIR-CD" in row["images"][0]]
    assert pairs and all("/A/" in row["images"][0] and "/B/" in row["images"][1] for row in pairs)
    image_id = processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    assert all(row["input_ids"].count(image_id) == 2 * tokens for row in rows)
    batch = Collator(processor)(rows[:4])
    assert batch["pixel_values"].shape[0] == 8  # two images per row, in row order
    model.train()
    loss = model(**{k: v for k, v in batch.items() if k != "sample_ids"}).loss
    loss.backward()
    assert math.isfinite(loss.item())
    projector = [p.grad for n, p in model.named_parameters() if "multi_modal_projector" in n]
    assert projector and all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in projector)
