"""LAE-DINO mmdet -> HF key map: a checkpoint written with the UPSTREAM key names loads strictly and lands right.

How the upstream checkpoint is made here: a tiny model's tensors (all re-randomised, so no two are alike) are
renamed by `to_upstream`, written in this file from the mmdet module names of jaychempan/LAE-DINO
(`mmdetection_lae/mmdet/models/{detectors/lae_dino.py, layers/transformer/grounding_dino_layers.py,
dense_heads/lae_dino_head.py}`, mmdet Swin/ChannelMapper, mmcv MultiheadAttention `attn.in_proj_*`), independently
of the map under test, with fused q/k/v re-fused and Swin patch merging put back into `nn.Unfold` order from first
principles. Loading it through `LaeDino.from_weights` must reproduce every tensor and the detections.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from transformers.models.swin.modeling_swin import SwinPatchMerging

from geopilot.errors import WeightsError
from geopilot.tools.lae_dino import LaeDino, tiny_tokenizer
from geopilot.tools.lae_dino_keymap import reorder_unfold_norm, reorder_unfold_reduction

SWIN = "model.backbone.conv_encoder.model.swin."


def unfold_order(hf: torch.Tensor, channels: int) -> torch.Tensor:
    """HF patch-merging input order (neighbour-major: (0,0),(1,0),(0,1),(1,1)) -> mmdet Unfold (channel-major, kh*2+kw)."""
    out = torch.empty_like(hf)
    for c in range(channels):
        for kh in range(2):
            for kw in range(2):
                out[..., c * 4 + kh * 2 + kw] = hf[..., (kh + 2 * kw) * channels + c]
    return out


def to_upstream(hf_state: dict[str, torch.Tensor], decoder_layers: int, backbone_outs: int) -> dict[str, torch.Tensor]:
    up: dict[str, torch.Tensor] = {}
    qkv: dict[str, dict[str, torch.Tensor]] = {}

    def fuse(key: str, part: str, value: torch.Tensor) -> None:
        qkv.setdefault(key, {})[part] = value

    for k, v in hf_state.items():
        if k.startswith("model.decoder.bbox_embed.") or k.startswith(SWIN + "layernorm."):
            continue  # duplicate of bbox_embed.N / not in upstream
        if m := re.fullmatch(r"model\.backbone\.conv_encoder\.model\.swin\.embeddings\.(patch_embeddings\.)?(.*)", k):
            up["backbone.patch_embed." + m.group(2)] = v
        elif m := re.fullmatch(re.escape(SWIN) + r"encoder\.layers\.(\d+)\.blocks\.(\d+)\.(.*)", k):
            s, b, rest = m.groups()
            pre = f"backbone.stages.{s}.blocks.{b}."
            if mm := re.fullmatch(r"attention\.([qkv])_proj\.(weight|bias)", rest):
                fuse(pre + "attn.w_msa.qkv." + mm.group(2), mm.group(1), v)
            else:
                rest = (
                    rest.replace("attention.o_proj", "attn.w_msa.proj")
                    .replace("attention.relative_position_bias.", "attn.w_msa.")
                    .replace("layernorm_before", "norm1")
                    .replace("layernorm_after", "norm2")
                    .replace("mlp.fc1", "ffn.layers.0.0")
                    .replace("mlp.fc2", "ffn.layers.1")
                )
                up[pre + rest] = v
        elif m := re.fullmatch(
            re.escape(SWIN) + r"encoder\.layers\.(\d+)\.downsample\.(reduction|norm)\.(weight|bias)", k
        ):
            channels = v.shape[-1] // 4
            up[f"backbone.stages.{m.group(1)}.downsample.{m.group(2)}.{m.group(3)}"] = unfold_order(v, channels)
        elif m := re.fullmatch(r"model\.backbone\.conv_encoder\.model\.hidden_states_norms\.stage(\d+)\.(.*)", k):
            up[f"backbone.norm{int(m.group(1)) - 1}.{m.group(2)}"] = v
        elif m := re.fullmatch(r"model\.input_proj_vision\.(\d+)\.([01])\.(.*)", k):
            level, part = int(m.group(1)), "conv" if m.group(2) == "0" else "gn"
            where = f"convs.{level}" if level < backbone_outs else f"extra_convs.{level - backbone_outs}"
            up[f"neck.{where}.{part}.{m.group(3)}"] = v
        elif k.startswith("model.text_backbone."):
            up["language_model.language_backbone.body.model." + k.removeprefix("model.text_backbone.")] = v
        elif k.startswith("model.text_projection."):
            up["text_feat_map." + k.removeprefix("model.text_projection.")] = v
        elif m := re.fullmatch(r"model\.encoder\.layers\.(\d+)\.fusion_layer\.(.*)", k):
            names = {
                "vision_param": "gamma_v",
                "text_param": "gamma_l",
                "layer_norm_vision": "layer_norm_v",
                "layer_norm_text": "layer_norm_l",
                "attn.vision_proj": "attn.v_proj",
                "attn.text_proj": "attn.l_proj",
                "attn.values_vision_proj": "attn.values_v_proj",
                "attn.values_text_proj": "attn.values_l_proj",
                "attn.out_vision_proj": "attn.out_v_proj",
                "attn.out_text_proj": "attn.out_l_proj",
            }
            rest = m.group(2)
            head = next(n for n in sorted(names, key=len, reverse=True) if rest.startswith(n))
            up[f"encoder.fusion_layers.{m.group(1)}.{names[head]}{rest[len(head) :]}"] = v
        elif m := re.fullmatch(r"model\.encoder\.layers\.(\d+)\.text_enhancer_layer\.(.*)", k):
            pre, rest = f"encoder.text_layers.{m.group(1)}.", m.group(2)
            if mm := re.fullmatch(r"self_attn\.(query|key|value)\.(weight|bias)", rest):
                fuse(pre + "self_attn.attn.in_proj_" + mm.group(2), mm.group(1), v)
            else:
                rest = {
                    "layer_norm_before": "norms.0",
                    "layer_norm_after": "norms.1",
                    "fc1": "ffn.layers.0.0",
                    "fc2": "ffn.layers.1",
                    "self_attn.out_proj": "self_attn.attn.out_proj",
                }[rest.rsplit(".", 1)[0]] + ("." + rest.rsplit(".", 1)[1])
                up[pre + rest] = v
        elif m := re.fullmatch(r"model\.encoder\.(visgt_layers|layers)\.(\d+)\.(deformable_layer\.)?(.*)", k):
            stack = "pre_encoder" if m.group(1) == "visgt_layers" else "encoder"
            rest = (
                m.group(4)
                .replace("self_attn_layer_norm", "norms.0")
                .replace("final_layer_norm", "norms.1")
                .replace("fc1", "ffn.layers.0.0")
                .replace("fc2", "ffn.layers.1")
            )
            up[f"{stack}.layers.{m.group(2)}.{rest}"] = v
        elif m := re.fullmatch(r"model\.decoder\.layers\.(\d+)\.(.*)", k):
            pre, rest = f"decoder.layers.{m.group(1)}.", m.group(2)
            if mm := re.fullmatch(r"(self_attn|encoder_attn_text)\.(query|key|value)\.(weight|bias)", rest):
                block = "self_attn" if mm.group(1) == "self_attn" else "cross_attn_text"
                fuse(f"{pre}{block}.attn.in_proj_{mm.group(3)}", mm.group(2), v)
                continue
            for hf, mm_name in (
                ("self_attn.out_proj", "self_attn.attn.out_proj"),
                ("encoder_attn_text.out_proj", "cross_attn_text.attn.out_proj"),
                ("encoder_attn_text_layer_norm", "norms.1"),
                ("encoder_attn_layer_norm", "norms.2"),
                ("self_attn_layer_norm", "norms.0"),
                ("final_layer_norm", "norms.3"),
                ("encoder_attn.", "cross_attn."),
                ("fc1", "ffn.layers.0.0"),
                ("fc2", "ffn.layers.1"),
            ):
                if rest.startswith(hf):
                    rest = mm_name + rest[len(hf) :]
                    break
            up[pre + rest] = v
        elif k.startswith("model.decoder.layer_norm."):
            up["decoder.norm." + k.rsplit(".", 1)[1]] = v
        elif m := re.fullmatch(r"model\.decoder\.reference_points_head\.(.*)", k):
            up["decoder.ref_point_head." + m.group(1)] = v
        elif m := re.fullmatch(r"bbox_embed\.(\d+)\.layers\.(\d)\.(.*)", k):
            up[f"bbox_head.reg_branches.{m.group(1)}.{2 * int(m.group(2))}.{m.group(3)}"] = v
        elif m := re.fullmatch(r"model\.encoder_output_bbox_embed\.layers\.(\d)\.(.*)", k):
            up[f"bbox_head.reg_branches.{decoder_layers}.{2 * int(m.group(1))}.{m.group(2)}"] = v
        elif m := re.fullmatch(r"class_embed\.(\d+)\.log_scale", k):
            up[f"bbox_head.cls_branches.{m.group(1)}.log_scale"] = v
        elif k == "model.encoder_output_class_embed.log_scale":
            up[f"bbox_head.cls_branches.{decoder_layers}.log_scale"] = v
        else:
            others = {
                "model.level_embed": "level_embed",
                "model.query_position_embeddings.weight": "query_embedding.weight",
                "model.enc_output.weight": "memory_trans_fc.weight",
                "model.enc_output.bias": "memory_trans_fc.bias",
                "model.enc_output_norm.weight": "memory_trans_norm.weight",
                "model.enc_output_norm.bias": "memory_trans_norm.bias",
            }
            up[others[k]] = v
    for key, parts in qkv.items():
        order = ("q", "k", "v") if "w_msa" in key else ("query", "key", "value")
        up[key] = torch.cat([parts[p] for p in order])
    return up


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """A re-randomised tiny model, its tokenizer folder, and its tensors written as an upstream mmdet .pth."""
    source = LaeDino.tiny(seed=3, box_threshold=0.0, text_threshold=0.0)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in source.model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    folder = tmp_path_factory.mktemp("lae_dino")
    vocab = tiny_tokenizer().get_vocab()
    (folder / "bert-base-uncased").mkdir()
    (folder / "bert-base-uncased" / "vocab.txt").write_text("\n".join(sorted(vocab, key=vocab.get)) + "\n")
    config = source.model.config
    upstream = to_upstream(source.model.state_dict(), config.decoder_layers, len(config.backbone_config.out_features))
    upstream["dn_query_generator.label_embedding.weight"] = torch.zeros(config.max_text_len, config.d_model)
    upstream["backbone.stages.0.blocks.0.attn.w_msa.relative_position_index"] = torch.zeros(16, 16, dtype=torch.long)
    upstream["language_model.language_backbone.body.model.embeddings.position_ids"] = torch.arange(64)[None]
    return source, folder, upstream


def test_written_checkpoint_uses_upstream_names(tiny_pair):
    _, _, upstream = tiny_pair
    for key in (
        "backbone.stages.0.blocks.0.attn.w_msa.qkv.weight",
        "backbone.stages.2.downsample.reduction.weight",
        "backbone.norm1.weight",
        "neck.extra_convs.0.conv.weight",
        "language_model.language_backbone.body.model.encoder.layer.0.attention.self.query.weight",
        "text_feat_map.weight",
        "pre_encoder.layers.0.self_attn.sampling_offsets.weight",
        "pre_encoder.layers.0.ffn.layers.0.0.weight",
        "encoder.fusion_layers.0.gamma_v",
        "encoder.text_layers.0.self_attn.attn.in_proj_weight",
        "decoder.layers.1.cross_attn_text.attn.in_proj_bias",
        "decoder.layers.1.norms.3.weight",
        "bbox_head.cls_branches.2.log_scale",  # 2 decoder layers + the encoder-output branch
        "bbox_head.reg_branches.2.4.bias",
        "memory_trans_fc.weight",
    ):
        assert key in upstream, key
    assert not any(k.startswith("model.") for k in upstream)


def test_upstream_checkpoint_loads_strictly_and_lands_in_place(tiny_pair):
    source, folder, upstream = tiny_pair
    torch.save({"meta": {"epoch": 12}, "state_dict": upstream}, folder / "lae_dino_tiny.pth")
    loaded = LaeDino.from_weights(
        str(folder / "lae_dino_tiny.pth"),
        architecture="tiny",
        box_threshold=0.0,
        text_threshold=0.0,
        short_side=64,
        max_long_side=96,
    )
    want, got = source.model.state_dict(), loaded.model.state_dict()
    assert set(want) == set(got)
    for key in want:
        if "swin.layernorm" in key:  # unused by the forward pass, not in upstream checkpoints
            continue
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, msg=key)
    image = Image.fromarray((np.random.RandomState(1).rand(72, 100, 3) * 255).astype("uint8"))
    assert loaded.detect(image, ["plane", "ship"]) == source.detect(image, ["plane", "ship"])


def test_patch_merging_reorder_matches_mmdet_unfold():
    """The reorder fact itself: mmdet's Unfold-based merging equals HF's with the converted weights."""
    torch.manual_seed(0)
    channels, height, width = 3, 4, 6
    x = torch.randn(2, height, width, channels)
    norm, reduction = nn.LayerNorm(4 * channels), nn.Linear(4 * channels, 2 * channels, bias=False)
    nn.init.normal_(norm.weight)
    nn.init.normal_(norm.bias)
    mmdet_out = reduction(norm(nn.Unfold(2, stride=2)(x.permute(0, 3, 1, 2)).transpose(1, 2)))
    hf = SwinPatchMerging(dim=channels)
    hf.norm.load_state_dict(
        {"weight": reorder_unfold_norm(norm.weight.data), "bias": reorder_unfold_norm(norm.bias.data)}
    )
    hf.reduction.load_state_dict({"weight": reorder_unfold_reduction(reduction.weight.data)})
    torch.testing.assert_close(hf(x.reshape(2, height * width, channels), (height, width)), mmdet_out)


def test_unexpected_upstream_key_is_listed(tiny_pair, tmp_path):
    _, folder, upstream = tiny_pair
    bad = dict(upstream, **{"bbox_head.extra_branch.weight": torch.zeros(2)})
    torch.save(bad, tmp_path / "bad.pth")
    with pytest.raises(WeightsError, match=r"unexpected keys \(1\).*bbox_head\.extra_branch\.weight"):
        LaeDino.from_weights(
            str(tmp_path / "bad.pth"), architecture="tiny", tokenizer_path=str(folder / "bert-base-uncased")
        )


def test_missing_upstream_key_is_listed(tiny_pair, tmp_path):
    _, folder, upstream = tiny_pair
    short = {k: v for k, v in upstream.items() if k != "pre_encoder.layers.0.norms.1.bias"}
    torch.save(short, tmp_path / "short.pth")
    with pytest.raises(
        WeightsError, match=r"missing keys \(1\).*model\.encoder\.visgt_layers\.0\.final_layer_norm\.bias"
    ):
        LaeDino.from_weights(
            str(tmp_path / "short.pth"), architecture="tiny", tokenizer_path=str(folder / "bert-base-uncased")
        )


def test_published_swin_t_architecture_is_fully_covered():
    """The real LAE-DINO-T layout (on the meta device, no memory): every module key but the unused final Swin norm
    comes from exactly one upstream name, with the right shape; 7 learnable scales (6 decoder layers + encoder)."""
    from geopilot.tools.lae_dino import LaeDinoForObjectDetection, swin_t_config
    from geopilot.tools.lae_dino_keymap import convert_mmdet_state_dict

    with torch.device("meta"):
        model = LaeDinoForObjectDetection(swin_t_config())
    own = model.state_dict()
    upstream = to_upstream(own, decoder_layers=6, backbone_outs=3)
    assert sorted(k for k in upstream if "cls_branches" in k) == [
        f"bbox_head.cls_branches.{i}.log_scale" for i in range(7)
    ]
    assert sum(k.startswith("pre_encoder.layers.") for k in upstream) == 6 * 16  # 6 deformable layers of 16 tensors
    converted = convert_mmdet_state_dict(upstream, num_decoder_layers=6, num_backbone_outs=3)
    assert set(own) - set(converted) == {SWIN + "layernorm.weight", SWIN + "layernorm.bias"}
    assert set(converted) <= set(own)
    assert all(converted[k].shape == own[k].shape for k in converted)
