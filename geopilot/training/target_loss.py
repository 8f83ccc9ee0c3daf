"""The training loss over the target tokens only: the LM head runs at the positions that predict a label.

A 49k-token vocabulary (SmolLM2) makes the head a fifth of a step's compute and its logits the largest tensor of
the batch, yet only the assistant turns (a quarter of a sample's tokens) carry labels. `transformers` models take a
boolean `(batch, seq)` `logits_to_keep` and return the kept positions' logits flattened, so the loss is the
model's own (mean cross-entropy over the shifted targets), computed from those rows alone.
"""

from __future__ import annotations

from geopilot.render import IGNORE_INDEX


def target_positions(labels):
    """`(batch, seq)` bool: True where the next token is a label (the positions whose logits the loss reads)."""
    import torch

    predicts = torch.zeros_like(labels, dtype=torch.bool)
    predicts[:, :-1] = labels[:, 1:] != IGNORE_INDEX
    return predicts


def target_loss(logits, labels, positions):
    """(mean loss, (per-row loss sums, per-row target counts)) from the logits of `positions` only, flattened
    `(num_kept, vocab)` in row-major order as `logits_to_keep` returns them."""
    import torch
    import torch.nn.functional as F

    targets = labels[:, 1:][positions[:, :-1]]
    losses = F.cross_entropy(logits.float(), targets, reduction="none")
    rows = positions.nonzero()[:, 0]
    detached = losses.detach()
    sums = torch.zeros(labels.shape[0], dtype=detached.dtype).index_add_(0, rows.cpu(), detached.cpu())
    counts = positions.sum(dim=1)
    return losses.mean(), (sums.tolist(), counts.float().tolist())
