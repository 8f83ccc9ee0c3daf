"""LAE-DINO checkpoint keys: the upstream mmdet names (jaychempan/LAE-DINO, `mmdetection_lae`) -> our HF module names.

The facts come from transformers' `convert_mm_grounding_dino_to_hf.py` (the MM-Grounding-DINO regex map), brought up to
the transformers 5.x Swin layout (`swin.` prefix, `q_proj/k_proj/v_proj/o_proj`, `mlp.fc1/fc2`), plus LAE-DINO's own
modules: the VisGT `pre_encoder.layers.N` (deformable layers only) and the per-layer learnable
`bbox_head.cls_branches.N.log_scale`. Tensor surgery, as the upstream converter does it:
- Swin `w_msa.qkv` and mmcv `MultiheadAttention.in_proj_*` are split into query/key/value;
- Swin patch merging: mmdet concatenates the 2x2 neighbours in `nn.Unfold` order (0,0),(0,1),(1,0),(1,1) per
  channel, HF in (0,0),(1,0),(0,1),(1,1) blocks, so `downsample.reduction/norm` are reordered;
- `bbox_head.*_branches.N` serve decoder layer N (N < num_decoder_layers; HF keeps the box branch twice, once in the
  detector and once in the decoder for box refinement) or the two-stage encoder output (N == num_decoder_layers).
Used by `geopilot.tools.lae_dino`; the round trip is tested in `tests/tools/test_lae_dino_keymap.py`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from geopilot.errors import WeightsError
from geopilot.tools.keymap import KeyRenames

SWIN = "model.backbone.conv_encoder.model"

# Upstream keys with no counterpart in the inference model, dropped on purpose (and only these).
DROPPED = {
    r"dn_query_generator\.label_embedding\.weight": "denoising queries, used in training only",
    r"language_model\.language_backbone\.body\.model\.embeddings\.(position_ids|token_type_ids)": "BERT index buffers",
    r"backbone\.stages\.\d+\.blocks\.\d+\.attn\.w_msa\.relative_position_index": "recomputed from the window size",
}

# Keys our modules hold that the upstream checkpoint cannot provide and the forward pass never reads:
# SwinModel's final `layernorm` (the backbone returns per-stage `hidden_states_norms` instead).
UNUSED_LOCAL = (rf"{re.escape(SWIN)}\.swin\.layernorm\.(weight|bias)",)

_DEFORMABLE = r"(sampling_offsets|attention_weights|value_proj|output_proj)\.(weight|bias)"
# mmcv's FFN (Sequential(Linear, act, dropout), Linear) -> HF's fc1, fc2; the same in every layer that has one
_FFN = {r"ffn\.layers\.0\.0": "fc1", r"ffn\.layers\.1": "fc2"}
_FFN_NORMS_ENCODER = {r"norms\.0": "self_attn_layer_norm", **_FFN, r"norms\.1": "final_layer_norm"}


def _per_layer(upstream: str, hf_layers: str, parts: dict[str, str], module: str = "") -> list[tuple[str, str]]:
    """The renames of the (weight|bias) parts of a repeated layer: `upstream.N.PART` -> `hf_layers.N.module+HF_PART`."""
    return [
        (rf"{upstream}\.(\d+)\.{up}\.(weight|bias)", rf"{hf_layers}.\1.{module}{hf}.\2") for up, hf in parts.items()
    ]


# (upstream regex, HF template); applied to whole keys, first match wins (`geopilot.tools.keymap.KeyRenames`).
RENAMES: list[tuple[str, str]] = [
    # Swin-T backbone
    (r"backbone\.patch_embed\.projection\.(weight|bias)", SWIN + r".swin.embeddings.patch_embeddings.projection.\1"),
    (r"backbone\.patch_embed\.norm\.(weight|bias)", SWIN + r".swin.embeddings.norm.\1"),
    (
        r"backbone\.stages\.(\d+)\.blocks\.(\d+)\.attn\.w_msa\.relative_position_bias_table",
        SWIN + r".swin.encoder.layers.\1.blocks.\2.attention.relative_position_bias.relative_position_bias_table",
    ),
    (
        r"backbone\.stages\.(\d+)\.blocks\.(\d+)\.attn\.w_msa\.(q|k|v)_split\.(weight|bias)",
        SWIN + r".swin.encoder.layers.\1.blocks.\2.attention.\3_proj.\4",
    ),
    (
        r"backbone\.stages\.(\d+)\.blocks\.(\d+)\.attn\.w_msa\.proj\.(weight|bias)",
        SWIN + r".swin.encoder.layers.\1.blocks.\2.attention.o_proj.\3",
    ),
    (
        r"backbone\.stages\.(\d+)\.blocks\.(\d+)\.norm1\.(weight|bias)",
        SWIN + r".swin.encoder.layers.\1.blocks.\2.layernorm_before.\3",
    ),
    (
        r"backbone\.stages\.(\d+)\.blocks\.(\d+)\.norm2\.(weight|bias)",
        SWIN + r".swin.encoder.layers.\1.blocks.\2.layernorm_after.\3",
    ),
    (
        r"backbone\.stages\.(\d+)\.blocks\.(\d+)\.ffn\.layers\.0\.0\.(weight|bias)",
        SWIN + r".swin.encoder.layers.\1.blocks.\2.mlp.fc1.\3",
    ),
    (
        r"backbone\.stages\.(\d+)\.blocks\.(\d+)\.ffn\.layers\.1\.(weight|bias)",
        SWIN + r".swin.encoder.layers.\1.blocks.\2.mlp.fc2.\3",
    ),
    (
        r"backbone\.stages\.(\d+)\.downsample\.reduction\.weight",
        SWIN + r".swin.encoder.layers.\1.downsample.reduction.weight",
    ),
    (r"backbone\.stages\.(\d+)\.downsample\.norm\.(weight|bias)", SWIN + r".swin.encoder.layers.\1.downsample.norm.\2"),
    # (backbone.norm{i} is renamed in `convert_mmdet_state_dict`: it needs i + 1)
    # ChannelMapper neck (extra convs are renumbered after the normal ones in `convert_mmdet_state_dict`)
    (r"neck\.convs\.(\d+)\.conv\.(weight|bias)", r"model.input_proj_vision.\1.0.\2"),
    (r"neck\.convs\.(\d+)\.gn\.(weight|bias)", r"model.input_proj_vision.\1.1.\2"),
    # BERT and its projection
    (r"language_model\.language_backbone\.body\.model\.(.*)", r"model.text_backbone.\1"),
    (r"text_feat_map\.(weight|bias)", r"model.text_projection.\1"),
    # VisGT pre-encoder: deformable self-attention layers only
    (rf"pre_encoder\.layers\.(\d+)\.self_attn\.{_DEFORMABLE}", r"model.encoder.visgt_layers.\1.self_attn.\2.\3"),
    *_per_layer(r"pre_encoder\.layers", "model.encoder.visgt_layers", _FFN_NORMS_ENCODER),
    # fusion encoder
    (r"encoder\.fusion_layers\.(\d+)\.gamma_v", r"model.encoder.layers.\1.fusion_layer.vision_param"),
    (r"encoder\.fusion_layers\.(\d+)\.gamma_l", r"model.encoder.layers.\1.fusion_layer.text_param"),
    *_per_layer(
        r"encoder\.fusion_layers",
        "model.encoder.layers",
        {
            "layer_norm_v": "layer_norm_vision",
            "layer_norm_l": "layer_norm_text",
            r"attn\.v_proj": "attn.vision_proj",
            r"attn\.l_proj": "attn.text_proj",
            r"attn\.values_v_proj": "attn.values_vision_proj",
            r"attn\.values_l_proj": "attn.values_text_proj",
            r"attn\.out_v_proj": "attn.out_vision_proj",
            r"attn\.out_l_proj": "attn.out_text_proj",
        },
        module="fusion_layer.",
    ),
    (rf"encoder\.layers\.(\d+)\.self_attn\.{_DEFORMABLE}", r"model.encoder.layers.\1.deformable_layer.self_attn.\2.\3"),
    *_per_layer(r"encoder\.layers", "model.encoder.layers", _FFN_NORMS_ENCODER, module="deformable_layer."),
    (
        r"encoder\.text_layers\.(\d+)\.self_attn\.attn\.(query|key|value)_split\.(weight|bias)",
        r"model.encoder.layers.\1.text_enhancer_layer.self_attn.\2.\3",
    ),
    *_per_layer(
        r"encoder\.text_layers",
        "model.encoder.layers",
        {
            r"self_attn\.attn\.out_proj": "self_attn.out_proj",
            r"norms\.0": "layer_norm_before",
            **_FFN,
            r"norms\.1": "layer_norm_after",
        },
        module="text_enhancer_layer.",
    ),
    # decoder
    (r"decoder\.norm\.(weight|bias)", r"model.decoder.layer_norm.\1"),
    (r"decoder\.ref_point_head\.layers\.(\d+)\.(weight|bias)", r"model.decoder.reference_points_head.layers.\1.\2"),
    (
        r"decoder\.layers\.(\d+)\.self_attn\.attn\.(query|key|value)_split\.(weight|bias)",
        r"model.decoder.layers.\1.self_attn.\2.\3",
    ),
    *_per_layer(
        r"decoder\.layers",
        "model.decoder.layers",
        {r"self_attn\.attn\.out_proj": "self_attn.out_proj", r"norms\.0": "self_attn_layer_norm"},
    ),
    (
        r"decoder\.layers\.(\d+)\.cross_attn_text\.attn\.(query|key|value)_split\.(weight|bias)",
        r"model.decoder.layers.\1.encoder_attn_text.\2.\3",
    ),
    *_per_layer(
        r"decoder\.layers",
        "model.decoder.layers",
        {r"cross_attn_text\.attn\.out_proj": "encoder_attn_text.out_proj", r"norms\.1": "encoder_attn_text_layer_norm"},
    ),
    (rf"decoder\.layers\.(\d+)\.cross_attn\.{_DEFORMABLE}", r"model.decoder.layers.\1.encoder_attn.\2.\3"),
    *_per_layer(
        r"decoder\.layers",
        "model.decoder.layers",
        {
            r"norms\.2": "encoder_attn_layer_norm",
            **_FFN,
            r"norms\.3": "final_layer_norm",
        },
    ),
    # two-stage query selection
    (r"level_embed", r"model.level_embed"),
    (r"query_embedding\.weight", r"model.query_position_embeddings.weight"),
    (r"memory_trans_fc\.(weight|bias)", r"model.enc_output.\1"),
    (r"memory_trans_norm\.(weight|bias)", r"model.enc_output_norm.\1"),
]
_RENAMES = KeyRenames((pattern + r"\Z", template) for pattern, template in RENAMES)
_DROPPED = [re.compile(pattern + r"\Z") for pattern in DROPPED]
_REG_LAYER = {"0": "0", "2": "1", "4": "2"}  # mmdet Sequential(Linear, ReLU, Linear, ReLU, Linear) -> MLP layers


def reorder_unfold_reduction(weight: torch.Tensor) -> torch.Tensor:
    """Patch-merging reduction weight (out, 4C): mmdet `nn.Unfold` channel order -> HF concatenation order."""
    out_channels, in_channels = weight.shape
    w = weight.reshape(out_channels, in_channels // 4, 4).transpose(1, 2)
    return w[:, [0, 2, 1, 3], :].reshape(out_channels, in_channels)


def reorder_unfold_norm(vector: torch.Tensor) -> torch.Tensor:
    """Patch-merging norm weight/bias (4C,): the same reorder as `reorder_unfold_reduction`."""
    v = vector.reshape(vector.shape[0] // 4, 4).transpose(0, 1)
    return v[[0, 2, 1, 3], :].reshape(vector.shape[0])


def _split_fused(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Split fused q/k/v tensors into `*_split` keys that the renames pick up."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        swin = re.fullmatch(r"(backbone\..*\.attn\.w_msa)\.qkv\.(weight|bias)", key)
        mha = re.fullmatch(r"(.*\.attn)\.in_proj_(weight|bias)", key)
        if swin:
            for name, part in zip(("q", "k", "v"), value.chunk(3), strict=True):
                out[f"{swin.group(1)}.{name}_split.{swin.group(2)}"] = part
        elif mha:
            for name, part in zip(("query", "key", "value"), value.chunk(3), strict=True):
                out[f"{mha.group(1)}.{name}_split.{mha.group(2)}"] = part
        else:
            out[key] = value
    return out


def _head_keys(key: str, num_decoder_layers: int) -> list[str] | None:
    """HF names for a `bbox_head` branch key, or None when `key` is not one."""
    cls = re.fullmatch(r"bbox_head\.cls_branches\.(\d+)\.log_scale", key)
    if cls:
        layer = int(cls.group(1))
        return [
            "model.encoder_output_class_embed.log_scale"
            if layer == num_decoder_layers
            else f"class_embed.{layer}.log_scale"
        ]
    reg = re.fullmatch(r"bbox_head\.reg_branches\.(\d+)\.([024])\.(weight|bias)", key)
    if reg:
        layer, index, kind = int(reg.group(1)), _REG_LAYER[reg.group(2)], reg.group(3)
        if layer == num_decoder_layers:
            return [f"model.encoder_output_bbox_embed.layers.{index}.{kind}"]
        return [f"bbox_embed.{layer}.layers.{index}.{kind}", f"model.decoder.bbox_embed.{layer}.layers.{index}.{kind}"]
    return None


def is_mmdet_state_dict(state: Mapping[str, torch.Tensor]) -> bool:
    return any(k.startswith(("backbone.", "pre_encoder.", "bbox_head.")) for k in state)


def convert_mmdet_state_dict(
    state: Mapping[str, torch.Tensor], num_decoder_layers: int, num_backbone_outs: int
) -> dict[str, torch.Tensor]:
    """Upstream mmdet LAE-DINO tensors under our module names; unknown upstream keys are a `WeightsError`."""
    converted: dict[str, torch.Tensor] = {}
    unknown: list[str] = []
    for key, value in _split_fused(dict(state)).items():
        if any(p.match(key) for p in _DROPPED):
            continue
        extra = re.fullmatch(r"neck\.extra_convs\.(\d+)\.(conv|gn)\.(weight|bias)", key)
        stage_norm = re.fullmatch(r"backbone\.norm(\d+)\.(weight|bias)", key)  # norm{i} follows Swin stage i+1
        if stage_norm:
            targets = [f"{SWIN}.hidden_states_norms.stage{int(stage_norm.group(1)) + 1}.{stage_norm.group(2)}"]
        elif extra:
            part = "0" if extra.group(2) == "conv" else "1"
            targets = [f"model.input_proj_vision.{num_backbone_outs + int(extra.group(1))}.{part}.{extra.group(3)}"]
        else:
            targets = _head_keys(key, num_decoder_layers)
        if targets is None:
            if not _RENAMES.knows(key):
                unknown.append(key)
                continue
            targets = [_RENAMES(key)]
            if key.endswith("downsample.reduction.weight"):
                value = reorder_unfold_reduction(value)
            elif ".downsample.norm." in key:
                value = reorder_unfold_norm(value)
        for target in targets:
            converted[target] = value
    if unknown:
        shown = ", ".join(sorted(unknown)[:12]) + (f" ... and {len(unknown) - 12} more" if len(unknown) > 12 else "")
        raise WeightsError(
            f"LAE-DINO checkpoint has unexpected keys ({len(unknown)}) with no place in the model: {shown}"
        )
    return converted
