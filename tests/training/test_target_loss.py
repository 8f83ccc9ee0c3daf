"""The loss over target positions only equals the model's own loss (and its gradients), for both families, with
padding and rows of different target counts; the per-row sums add up to what the full logits give."""

from __future__ import annotations

import pytest


def _batch(vocab: int, avoid: set[int]):
    import torch

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (3, 12), generator=generator)
    for token in avoid:  # no image placeholders: a text-only batch needs no pixels
        ids[ids == token] = 5
    labels = torch.full_like(ids, -100)
    labels[0, 4:9] = ids[0, 4:9]
    labels[1, 2:12] = ids[1, 2:12]
    labels[2, 10:12] = ids[2, 10:12]
    attention = torch.ones_like(ids)
    attention[2, :3] = 0  # left padding
    return ids, labels, attention


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl"])
def test_target_loss_equals_the_models_loss_and_gradients(family):
    import torch
    import torch.nn.functional as F

    from geopilot.model import ModelConfig, build_model
    from geopilot.training.target_loss import target_loss, target_positions

    torch.manual_seed(0)
    model, processor = build_model(ModelConfig(family=family, init="tiny"))
    model.train()
    config = model.config
    avoid = {
        getattr(config, name)
        for name in ("image_token_id", "image_token_index", "video_token_id")
        if hasattr(config, name)
    }
    ids, labels, attention = _batch(config.text_config.vocab_size, {t for t in avoid if t is not None})

    full = model(input_ids=ids, attention_mask=attention, labels=labels)
    full.loss.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()

    positions = target_positions(labels)
    kept = model(input_ids=ids, attention_mask=attention, logits_to_keep=positions).logits
    loss, (sums, counts) = target_loss(kept, labels, positions)
    loss.backward()

    assert kept.shape[0] == int((labels[:, 1:] != -100).sum()) == sum(counts)
    assert counts == [5.0, 10.0, 2.0]  # each label is predicted from the position before it
    torch.testing.assert_close(loss, full.loss, rtol=1e-5, atol=1e-6)
    for name, grad in expected.items():
        torch.testing.assert_close(dict(model.named_parameters())[name].grad, grad, rtol=1e-4, atol=1e-6)
    for row in range(3):
        targets = labels[row, 1:]
        per_row = F.cross_entropy(full.logits[row, :-1].float(), targets, ignore_index=-100, reduction="sum")
        assert sums[row] == pytest.approx(float(per_row), rel=1e-5)
