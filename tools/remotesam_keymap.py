"""Published RemoteSAM checkpoint names -> `geopilot.tools.remotesam_model.RemoteSamNet` names.

The checkpoint (`{'model': state_dict}`, saved from upstream's `LAVTOne`) names modules after upstream's classes:
`backbone.layers.N.fusion.image_lang_att.f_query.0`, `backbone.cim.block.0.csa1.m.DWConv1.0`,
`classifier.conv2_4.rounting_func.fc_theta`, ... `upstream_key_to_ours` renames each one by the ordered rules
below; a key no rule knows is returned unchanged, so the strict load lists it as unexpected. `None` means dropped on
purpose (entries that are not part of the network: BERT's pooler, which upstream deletes, and position-id buffers).
"""

from __future__ import annotations

import re

# Ordered (pattern, replacement): the first match wins; patterns are anchored at the start of the key.
_RULES: list[tuple[str, str | None]] = [
    # text encoder: same names as transformers' BertModel
    (r"text_encoder\.pooler\.", None),
    (r"text_encoder\.embeddings\.(position_ids|token_type_ids)$", None),
    (r"text_encoder\.", "text_encoder."),
    # Swin stem and per-stage output norms
    (r"backbone\.patch_embed\.proj\.", "backbone.patch_embed."),
    (r"backbone\.patch_embed\.norm\.", "backbone.patch_norm."),
    (r"backbone\.norm(\d)\.", r"backbone.out_norms.\1."),
    # Swin blocks and patch merging keep their names inside a stage
    (r"backbone\.layers\.(\d+)\.(blocks|downsample)\.", r"backbone.stages.\1.\2."),
    # pixel-word attention module
    (r"backbone\.layers\.(\d+)\.fusion\.vis_project\.0\.", r"backbone.stages.\1.pwam.visual_proj."),
    (r"backbone\.layers\.(\d+)\.fusion\.project_mm\.0\.", r"backbone.stages.\1.pwam.fused_proj."),
    (r"backbone\.layers\.(\d+)\.fusion\.image_lang_att\.f_query\.0\.", r"backbone.stages.\1.pwam.attention.query."),
    (r"backbone\.layers\.(\d+)\.fusion\.image_lang_att\.f_key\.0\.", r"backbone.stages.\1.pwam.attention.key."),
    (r"backbone\.layers\.(\d+)\.fusion\.image_lang_att\.f_value\.0\.", r"backbone.stages.\1.pwam.attention.value."),
    (r"backbone\.layers\.(\d+)\.fusion\.image_lang_att\.W\.0\.", r"backbone.stages.\1.pwam.attention.out."),
    # gates
    (r"backbone\.layers\.(\d+)\.res_gate\.", r"backbone.stages.\1.language_gate."),
    (r"backbone\.layers\.(\d+)\.visual_gate\.", r"backbone.stages.\1.visual_gate."),
    # the spatial re-weighting branch (RepBlock: first stage unsuffixed, second stage `_2`)
    (r"backbone\.layers\.(\d+)\.visual_residual\.repblock\.brb_3x3(_2)?\.conv1\.", r"backbone.stages.\1.receptive.rep\2.pointwise_then_3x3.0."),
    (r"backbone\.layers\.(\d+)\.visual_residual\.repblock\.brb_3x3(_2)?\.bn1\.", r"backbone.stages.\1.receptive.rep\2.pointwise_then_3x3.1."),
    (r"backbone\.layers\.(\d+)\.visual_residual\.repblock\.brb_3x3(_2)?\.conv2\.", r"backbone.stages.\1.receptive.rep\2.pointwise_then_3x3.2."),
    (r"backbone\.layers\.(\d+)\.visual_residual\.repblock\.brb_3x3(_2)?\.bn2\.", r"backbone.stages.\1.receptive.rep\2.pointwise_then_3x3.3."),
    (r"backbone\.layers\.(\d+)\.visual_residual\.repblock\.brb_1x1(_2)?\.conv\.", r"backbone.stages.\1.receptive.rep\2.pointwise.0."),
    (r"backbone\.layers\.(\d+)\.visual_residual\.repblock\.brb_1x1(_2)?\.bn\.", r"backbone.stages.\1.receptive.rep\2.pointwise.1."),
    (r"backbone\.layers\.(\d+)\.visual_residual\.repblock\.brb_identity(_2)?\.", r"backbone.stages.\1.receptive.rep\2.identity."),
    # cross-scale interaction module
    (r"backbone\.cim\.down_channel\.", "neck.reduce."),
    (r"backbone\.cim\.up_channel\.", "neck.expand."),
    (r"backbone\.cim\.bn\.", "neck.norm."),
    (r"backbone\.cim\.fusion\.(\d+)\.local_embedding\.", r"neck.gates.\1.local_proj."),
    (r"backbone\.cim\.fusion\.(\d+)\.global_embedding\.", r"neck.gates.\1.global_proj."),
    (r"backbone\.cim\.fusion\.(\d+)\.global_act\.", r"neck.gates.\1.gate_proj."),
    (r"backbone\.cim\.fusion\.(\d+)\.bn1\.", r"neck.gates.\1.local_norm."),
    (r"backbone\.cim\.fusion\.(\d+)\.bn2\.", r"neck.gates.\1.global_norm."),
    (r"backbone\.cim\.fusion\.(\d+)\.bn3\.", r"neck.gates.\1.gate_norm."),
    (r"backbone\.cim\.block\.0\.csa([12])\.m\.bn1\.", r"neck.block.attn\1.norm_in."),
    (r"backbone\.cim\.block\.0\.csa([12])\.m\.DWConv1\.", r"neck.block.attn\1.pool2."),
    (r"backbone\.cim\.block\.0\.csa([12])\.m\.DWConv2\.", r"neck.block.attn\1.pool3."),
    (r"backbone\.cim\.block\.0\.csa([12])\.m\.bn4\.", r"neck.block.attn\1.norm_out."),
    (r"backbone\.cim\.block\.0\.csa([12])\.m\.conv\.", r"neck.block.attn\1.proj."),
    (r"backbone\.cim\.block\.0\.csa([12])\.m\.attention\.qkv\.c\.", r"neck.block.attn\1.attention.qkv.linear."),
    (r"backbone\.cim\.block\.0\.csa([12])\.m\.attention\.qkv\.bn\.", r"neck.block.attn\1.attention.qkv.bn."),
    (r"backbone\.cim\.block\.0\.csa([12])\.m\.attention\.parallel_conv\.1\.", r"neck.block.attn\1.attention.value_conv."),
    (r"backbone\.cim\.block\.0\.csa([12])\.m\.attention\.to_out\.", r"neck.block.attn\1.attention.out."),
    (r"backbone\.cim\.block\.0\.csa([12])\.m\.attention\.proj\.", r"neck.block.attn\1.attention.token_proj."),
    (r"backbone\.cim\.block\.0\.intra_ff\.m\.ff([1-4])\.m\.", r"neck.block.scale_ffn.ffns.<\1-1>."),
    (r"backbone\.cim\.block\.0\.ff\.m\.", "neck.block.ffn."),
    # decoder: conv{1,2}_{4,3,2} and bn{1,2}_{4,3,2} are its three top-down stages; conv1_1 the classifier
    (r"classifier\.conv1_1\.", "decoder.classifier."),
    (r"classifier\.conv1_([432])\.", r"decoder.stages.<4-\1>.conv."),
    (r"classifier\.bn1_([432])\.", r"decoder.stages.<4-\1>.norm1."),
    (r"classifier\.bn2_([432])\.", r"decoder.stages.<4-\1>.norm2."),
    (r"classifier\.conv2_([432])\.weight$", r"decoder.stages.<4-\1>.rotated.weight"),
    (r"classifier\.conv2_([432])\.rounting_func\.dwc\.", r"decoder.stages.<4-\1>.rotated.routing.dwconv."),
    (r"classifier\.conv2_([432])\.rounting_func\.norm\.norm\.", r"decoder.stages.<4-\1>.rotated.routing.norm."),
    (r"classifier\.conv2_([432])\.rounting_func\.fc_alpha\.", r"decoder.stages.<4-\1>.rotated.routing.fc_gate."),
    (r"classifier\.conv2_([432])\.rounting_func\.fc_theta\.", r"decoder.stages.<4-\1>.rotated.routing.fc_angle."),
]
_COMPILED = [(re.compile(pattern), replacement) for pattern, replacement in _RULES]
_FEED_FORWARD = {"bn1": "norm1", "conv1": "expand", "bn2": "norm2", "conv2": "mix", "conv3": "reduce"}
_ARITHMETIC = re.compile(r"<(\d)-(\d)>")  # "<4-3>" -> "1": index arithmetic in a replacement


def _rename_rep_stage(key: str) -> str:
    """`rep` (first RepBlock stage, no suffix) -> rep1, `rep_2` -> rep2."""
    return key.replace(".receptive.rep_2.", ".receptive.rep2.").replace(".receptive.rep.", ".receptive.rep1.")


def upstream_key_to_ours(key: str) -> str | None:
    key = key.removeprefix("module.")  # a DistributedDataParallel wrapper
    for pattern, replacement in _COMPILED:
        match = pattern.match(key)
        if match is None:
            continue
        if replacement is None:
            return None
        new = match.expand(replacement) + key[match.end() :]
        new = _ARITHMETIC.sub(lambda m: str(int(m.group(1)) - int(m.group(2))), new)
        new = _rename_rep_stage(new)
        if ".ffn." in new or ".ffns." in new:  # FeedForward's layers: upstream bn/conv numbering -> our names
            head, _, leaf = new.rpartition(".")
            prefix, _, layer = head.rpartition(".")
            new = f"{prefix}.{_FEED_FORWARD.get(layer, layer)}.{leaf}"
        return new
    return key
