"""LAE-DINO on a tiny random model: canonical detections, VisGT and the learnable-scale head, prompt chunking."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from geopilot.errors import GeoPilotInputError, WeightsError
from geopilot.tool_output import ToolOutput
from geopilot.tools.lae_dino import LaeDino, LearnableScaleContrastiveEmbedding, build_prompt_chunks


@pytest.fixture(scope="module")
def backend():
    return LaeDino.tiny(seed=0)


def _image(width: int = 120, height: int = 80, seed: int = 0) -> Image.Image:
    return Image.fromarray((np.random.RandomState(seed).rand(height, width, 3) * 255).astype("uint8"))


def test_tiny_forward_gives_canonical_detections(backend):
    categories = ["plane", "storage tank", "ship"]
    found = backend.detect(_image(), categories)
    output = ToolOutput.model_validate(ToolOutput(detections=found).model_dump())
    assert 0 < len(output.detections) <= backend.options.max_detections
    scores = [d.score for d in output.detections]
    assert scores == sorted(scores, reverse=True)
    for d in output.detections:
        assert d.label in categories
        x1, y1, x2, y2 = d.box
        assert 0 <= x1 < x2 <= 1 and 0 <= y1 < y2 <= 1


def test_thresholds_filter_detections(backend):
    strict = LaeDino(
        backend.model, backend.tokenizer, backend.options.model_copy(update={"box_threshold": 1.0}), backend.device
    )
    assert strict.detect(_image(), ["plane"]) == []
    scores = [d.score for d in backend.detect(_image(), ["plane", "ship"])]
    middle = float(np.median(scores))
    half = LaeDino(
        backend.model, backend.tokenizer, backend.options.model_copy(update={"box_threshold": middle}), backend.device
    )
    assert all(d.score >= middle for d in half.detect(_image(), ["plane", "ship"]))


@pytest.mark.parametrize("categories", [[], ["  "], ["plane", ""]])
def test_empty_categories_are_refused(backend, categories):
    with pytest.raises(GeoPilotInputError, match="at least one non-empty category"):
        backend.detect(_image(), categories)


def test_prompt_chunks_respect_count_and_token_budget(backend):
    tokenizer = backend.tokenizer
    categories = ["plane", "storage tank", "ship", "harbor", "bridge"]
    chunks = build_prompt_chunks(tokenizer, categories, chunk_size=2, max_text_len=256)
    assert [c.categories for c in chunks] == [["plane", "storage tank"], ["ship", "harbor"], ["bridge"]]
    assert chunks[0].caption == "plane . storage tank ."
    ids = tokenizer(chunks[0].caption).input_ids
    words = [tokenizer.decode([ids[t] for t in tokens]) for tokens in chunks[0].token_positions]
    assert words == ["plane", "storage tank"]
    many = [f"field {i}" for i in range(40)]
    by_tokens = build_prompt_chunks(tokenizer, many, chunk_size=100, max_text_len=48)
    assert len(by_tokens) > 1 and sum(len(c.categories) for c in by_tokens) == 40
    assert all(len(tokenizer(c.caption).input_ids) <= 48 for c in by_tokens)


def test_long_vocabulary_is_chunked_and_merged(backend):
    """Each chunk is a separate forward; the merged list is the union of the chunks' results, by score."""
    categories = ["plane", "ship", "harbor"]
    chunked = LaeDino(
        backend.model, backend.tokenizer, backend.options.model_copy(update={"chunk_size": 2}), backend.device
    )
    merged = chunked.detect(_image(), categories)
    assert {d.label for d in merged} == set(categories)
    singles = [d for part in (categories[0:2], categories[2:]) for d in chunked.detect(_image(), part)]
    expected = sorted(singles, key=lambda d: -d.score)[: chunked.options.max_detections]
    assert [(d.label, d.box) for d in merged] == [(d.label, d.box) for d in expected]


def test_visgt_prior_is_added_to_the_text_features(backend):
    model = backend.model
    seen = {}
    hooks = [
        model.model.text_projection.register_forward_hook(lambda m, i, o: seen.__setitem__("text", o)),
        model.model.encoder.visgt_layers[-1].register_forward_hook(lambda m, i, o: seen.__setitem__("visgt", o[0])),
        model.model.encoder.layers[0].register_forward_pre_hook(
            lambda m, args, kwargs: seen.__setitem__("fused_in", kwargs["text_features"]), with_kwargs=True
        ),
    ]
    try:
        backend.detect(_image(), ["plane"])
    finally:
        for hook in hooks:
            hook.remove()
    expected = seen["text"] + seen["visgt"].mean(dim=1, keepdim=True)
    torch.testing.assert_close(seen["fused_in"], expected)


def _visgt_inputs(model, pixel_values, pixel_mask, text):
    """The keyword arguments the fusion encoder (and so VisGT) receives in a real forward."""
    seen = {}
    hook = model.model.encoder.register_forward_pre_hook(lambda m, args, kwargs: seen.update(kwargs), with_kwargs=True)
    try:
        with torch.no_grad():
            model(pixel_values=pixel_values, pixel_mask=pixel_mask, **text)
    finally:
        hook.remove()
    return seen


def _prior(model, inputs, vision_features):
    with torch.no_grad():
        return model.model.encoder.visual_text_prior(
            vision_features,
            inputs["vision_attention_mask"],
            inputs["spatial_shapes"],
            inputs["spatial_shapes_list"],
            inputs["level_start_index"],
            inputs["valid_ratios"],
        )


def test_visgt_samples_real_values(backend):
    """transformers' deformable layer takes True = valid; handed the encoder's padding mask (True = pad) it would
    zero every value of an unpadded image, and VisGT would add nothing but biases to the text."""
    sampled = []
    hooks = [
        layer.self_attn.output_proj.register_forward_pre_hook(lambda m, args: sampled.append(args[0]))
        for layer in backend.model.model.encoder.visgt_layers
    ]
    try:
        backend.detect(_image(), ["plane"])
    finally:
        for hook in hooks:
            hook.remove()
    assert len(sampled) == len(backend.model.model.encoder.visgt_layers)
    for values in sampled:
        assert values.abs().amax() > 0


def test_visgt_prior_ignores_the_padded_region_of_a_batch(backend):
    """Image 1 of a batch of two is padded (bottom and right); what stands at its padded tokens is not its content."""
    model = backend.model
    torch.manual_seed(1)
    pixels = torch.randn(2, 3, 64, 96)
    mask = torch.ones(2, 64, 96, dtype=torch.long)
    mask[1, 40:, :] = 0
    mask[1, :, 56:] = 0
    text = dict(backend.tokenizer(["plane . ship ."] * 2, return_tensors="pt"))
    inputs = _visgt_inputs(model, pixels, mask, text)
    features, padded = inputs["vision_features"], inputs["vision_attention_mask"]
    assert padded[1].any() and not padded[0].any()
    changed = features.masked_fill(padded[..., None], 0.0) + padded[..., None] * torch.randn_like(features) * 10
    before, after = _prior(model, inputs, features), _prior(model, inputs, changed)
    torch.testing.assert_close(after, before)
    assert before.abs().amax() > 0


def test_contrastive_head_scale_is_learnable_and_padded():
    head = LearnableScaleContrastiveEmbedding(max_text_len=6)
    with torch.no_grad():
        head.log_scale.fill_(math.log(2.0))
    vision, text = torch.randn(1, 3, 4), torch.randn(1, 4, 4)
    mask = torch.tensor([[True, True, True, False]])
    out = head(vision, text, mask)
    assert out.shape == (1, 3, 6)
    torch.testing.assert_close(out[..., :3], 2.0 * (vision @ text.transpose(1, 2))[..., :3])
    assert torch.isinf(out[..., 3:]).all()
    assert head.log_scale.requires_grad


def test_every_prediction_layer_has_its_own_scale_and_box_branch(backend):
    model, config = backend.model, backend.model.config
    scales = {id(m.log_scale) for m in model.class_embed} | {id(model.model.encoder_output_class_embed.log_scale)}
    assert len(scales) == config.decoder_layers + 1
    assert len({id(m.layers[0].weight) for m in model.bbox_embed}) == config.decoder_layers


def test_missing_weights_say_where_to_put_them(monkeypatch, tmp_path):
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(tmp_path))
    with pytest.raises(WeightsError, match=r"weights not found: put lae_dino/lae_dino_swint_lae1m-28ca3a15\.pth"):
        LaeDino.from_weights(None)


def test_missing_tokenizer_is_a_weights_error(tmp_path):
    (tmp_path / "model.pth").write_bytes(b"x")
    with pytest.raises(WeightsError, match="bert-base-uncased/vocab.txt"):
        LaeDino.from_weights(str(tmp_path / "model.pth"))


def test_boxes_go_through_the_canonical_helper(backend):
    """A prediction that collapses at 3 decimals becomes the smallest canonical box (`canonical.unit_box`), as in
    every other backend, instead of being dropped by a private rule."""

    def flatten(module, args, output):
        output.pred_boxes[..., 2:] = 0.0  # zero width and height
        return output

    hook = backend.model.register_forward_hook(flatten)
    try:
        found = backend.detect(_image(), ["plane"])
    finally:
        hook.remove()
    assert found
    for d in found:
        x1, y1, x2, y2 = d.box
        assert round(x2 - x1, 3) == 0.001 and round(y2 - y1, 3) == 0.001
