"""SegEarth-OV on a tiny random open_clip model: canonical outputs, the modified attention, bias removal, weights."""

from __future__ import annotations

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from pycocotools import mask as mask_utils
from safetensors.torch import save_file

from geopilot.errors import GeoPilotInputError, WeightsError
from geopilot.tool_output import ToolOutput
from geopilot.tools.segearth_ov import (
    TINY_CLIP,
    JBUOne,
    SegEarthOV,
    _queries,
    segearth_attention,
    segearth_image_tokens,
)


def _image(width: int = 64, height: int = 48, seed: int = 0) -> Image.Image:
    return Image.fromarray((np.random.RandomState(seed).rand(height, width, 3) * 255).astype("uint8"))


@pytest.fixture(scope="module")
def bilinear():
    return SegEarthOV.tiny(seed=0, upsampler="bilinear", prob_threshold=0.0)


def _with(backend: SegEarthOV, **options) -> SegEarthOV:
    """The same weights with other options (building a tiny CLIP costs a second or two)."""
    return SegEarthOV(
        backend.clip, backend.tokenizer, backend.upsampler, backend.options.model_copy(update=options), backend.device
    )


def _check_canonical(segments, image: Image.Image, classes: list[str]) -> None:
    output = ToolOutput.model_validate(ToolOutput(segments=segments).model_dump())
    assert output.segments, "the tiny model should assign pixels to at least one class"
    covered = np.zeros((image.height, image.width), dtype=bool)
    for segment in output.segments:
        assert segment.label in classes
        decoded = mask_utils.decode({"size": list(segment.mask.size), "counts": segment.mask.counts.encode()}).astype(
            bool
        )
        assert decoded.shape == (image.height, image.width)
        assert segment.area == round(float(decoded.mean()), 6)  # canonical.segment_class, as every backend
        assert not (covered & decoded).any(), "classes of a semantic segmentation do not overlap"
        covered |= decoded


def test_tiny_forward_gives_canonical_segments(bilinear):
    image, classes = _image(100, 70), ["building,roof", "road", "tree"]
    _check_canonical(bilinear.segment(image, classes), image, classes)


def test_tiny_forward_with_jbu_upsampler(bilinear):
    backend = SegEarthOV(
        bilinear.clip,
        bilinear.tokenizer,
        JBUOne(32).eval(),
        bilinear.options.model_copy(update={"long_side": 64}),
        bilinear.device,
    )
    image, classes = _image(64, 48), ["water", "field"]
    _check_canonical(backend.segment(image, classes), image, classes)


def test_jbu_one_upsamples_sixteen_times():
    features, guidance = torch.randn(1, 32, 4, 3), torch.randn(1, 3, 64, 48)
    with torch.no_grad():
        assert JBUOne(32).eval()(features, guidance).shape == (1, 32, 64, 48)


def test_segearth_attention_is_the_sum_of_three_self_similarities():
    torch.manual_seed(0)
    attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(1, 5, 8)
    q, k, v = F.linear(x, attn.in_proj_weight, attn.in_proj_bias).chunk(3, -1)
    heads = []
    for h in range(2):  # one head at a time, written out
        qh, kh, vh = (t[0, :, 4 * h : 4 * h + 4] for t in (q, k, v))
        weights = sum(torch.softmax(a @ a.T / 2.0, dim=-1) for a in (qh, kh, vh))
        heads.append(weights @ vh)
    expected = attn.out_proj(torch.cat(heads, dim=-1))[None]
    torch.testing.assert_close(segearth_attention(attn, x), expected)


def test_last_block_drops_residual_and_mlp(bilinear):
    """Changing the last block's MLP must not change the image tokens."""
    visual = bilinear.clip.visual
    pixels = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        before = segearth_image_tokens(visual, pixels)
        mlp = visual.transformer.resblocks[-1].mlp
        saved = [p.clone() for p in mlp.parameters()]
        for p in mlp.parameters():
            p.add_(1.0)
        after = segearth_image_tokens(visual, pixels)
        for p, s in zip(mlp.parameters(), saved, strict=True):
            p.copy_(s)
    for a, b in zip(before, after, strict=True):
        torch.testing.assert_close(a, b)


def test_cls_bias_is_subtracted_uniformly(bilinear):
    plain, biased = _with(bilinear, cls_token_lambda=0.0), _with(bilinear, cls_token_lambda=-0.3)
    text = plain.text_features(["background", "road", "tree"])
    crop = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        diff = biased._crop_logits(crop, text) - plain._crop_logits(crop, text)
        cls, _ = segearth_image_tokens(plain.clip.visual, crop)
    expected = -0.3 * (F.normalize(cls, dim=-1) @ text.T)[0]
    torch.testing.assert_close(diff[0].mean((1, 2)), expected, atol=1e-5, rtol=1e-4)
    assert diff[0].std((1, 2)).max() < 1e-5  # the same shift at every pixel


def test_synonyms_and_background_queries():
    queries, index, background, requested = _queries(["building,roof", "road"], "background")
    assert (queries, index, background, requested) == (
        ["background", "building", "roof", "road"],
        [0, 1, 1, 2],
        0,
        False,
    )
    queries, index, background, requested = _queries(["road", "Background"], "background")
    assert (queries, index, background, requested) == (["road", "Background"], [0, 1], 1, True)


def test_low_confidence_pixels_go_to_background(bilinear):
    backend = _with(bilinear, prob_threshold=1.0)
    assert backend.segment(_image(), ["road", "tree"]) == []  # all background, which was not asked for
    (only,) = backend.segment(_image(), ["road", "background"])
    assert (only.label, only.area) == ("background", 1.0)


@pytest.mark.parametrize("classes", [[], ["  "], [" , "]])
def test_empty_class_list_is_refused(bilinear, classes):
    with pytest.raises(GeoPilotInputError, match="at least one non-empty class"):
        bilinear.segment(_image(), classes)


def test_too_thin_image_is_refused(bilinear):
    backend = SegEarthOV(bilinear.clip, bilinear.tokenizer, JBUOne(32), bilinear.options, bilinear.device)
    with pytest.raises(GeoPilotInputError, match="too thin"):
        backend.segment(_image(400, 20), ["road"])


@pytest.fixture
def tiny_registered(monkeypatch):
    """The tiny config registered with open_clip for this test only (compat.md section 8)."""
    monkeypatch.setitem(open_clip.factory._MODEL_CONFIGS, "GeoPilotTiny-ViT", TINY_CLIP)
    return "GeoPilotTiny-ViT"


def test_local_weights_load_strictly_and_reproduce(tiny_registered, tmp_path):
    source = SegEarthOV.tiny(seed=4, upsampler="jbu_one", prob_threshold=0.0, long_side=64)
    save_file(
        {k: v.contiguous() for k, v in source.clip.state_dict().items()}, str(tmp_path / "open_clip_model.safetensors")
    )
    lightning = {"epoch": 3, "state_dict": {f"upsampler.{k}": v for k, v in source.upsampler.state_dict().items()}}
    torch.save(lightning, tmp_path / "xclip_jbu_one_million_aid.ckpt")
    loaded = SegEarthOV.from_weights(
        str(tmp_path / "open_clip_model.safetensors"),
        model_name=tiny_registered,
        prob_threshold=0.0,
        long_side=64,
        slide_crop=64,
        slide_stride=32,
    )
    image = _image(64, 48, seed=5)
    assert loaded.segment(image, ["water", "field"]) == source.segment(image, ["water", "field"])


def test_unexpected_clip_key_is_listed(bilinear, tiny_registered, tmp_path):
    state = {k: v.contiguous() for k, v in bilinear.clip.state_dict().items()}
    state["visual.extra_head.weight"] = torch.zeros(2)
    save_file(state, str(tmp_path / "clip.safetensors"))
    with pytest.raises(WeightsError, match=r"unexpected keys \(1\).*visual\.extra_head\.weight"):
        SegEarthOV.from_weights(str(tmp_path / "clip.safetensors"), model_name=tiny_registered, upsampler="bilinear")


def test_missing_upsampler_checkpoint_says_where_to_put_it(bilinear, tiny_registered, tmp_path):
    save_file(
        {k: v.contiguous() for k, v in bilinear.clip.state_dict().items()},
        str(tmp_path / "open_clip_model.safetensors"),
    )
    with pytest.raises(WeightsError, match="weights not found.*xclip_jbu_one_million_aid.ckpt"):
        SegEarthOV.from_weights(str(tmp_path / "open_clip_model.safetensors"), model_name=tiny_registered)


def test_no_weights_anywhere_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("GEOPILOT_WEIGHTS_DIR", raising=False)
    with pytest.raises(WeightsError, match="weights not found"):
        SegEarthOV.from_weights(None)


def test_large_output_is_labelled_small_and_resized(bilinear):
    """Above `max_output_pixels` the label map is computed at the working size and resized (nearest)."""
    small = _with(bilinear, max_output_pixels=100)
    image, classes = _image(100, 70), ["building", "road"]
    _check_canonical(small.segment(image, classes), image, classes)
