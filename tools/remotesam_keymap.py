"""Published RemoteSAM checkpoint names -> `geopilot.tools.remotesam_model.RemoteSamNet` names.

The checkpoint (`{'model': state_dict}`, saved from upstream's `LAVTOne`) names modules after upstream's classes:
`backbone.layers.N.fusion.image_lang_att.f_query.0`, `backbone.cim.block.0.csa1.m.DWConv1.0`,
`classifier.conv2_4.rounting_func.fc_theta`, ... `upstream_key_to_ours` renames each one by the ordered rules
below (`geopilot.tools.keymap.KeyRenames`: the first match wins); a key no rule knows is returned unchanged, so the
strict load lists it as unexpected. `None` means dropped on purpose (entries that are not part of the network: BERT's
pooler, which upstream deletes, and position-id buffers).
"""

from __future__ import annotations

from geopilot.tools.keymap import KeyRenames, under

_STAGE = r"backbone\.layers\.(\d+)\."  # -> backbone.stages.\1.
# FeedForward's layers: upstream bn/conv numbering -> our names
_FEED_FORWARD = {
    r"bn1\.": "norm1.",
    r"conv1\.": "expand.",
    r"bn2\.": "norm2.",
    r"conv2\.": "mix.",
    r"conv3\.": "reduce.",
}
# RepBlock branches, for each of its two stages: `brb_*` (-> rep1) and `brb_*_2` (-> rep2)
_REP_BRANCH = {
    r"brb_3x3{suffix}\.conv1\.": "pointwise_then_3x3.0.",
    r"brb_3x3{suffix}\.bn1\.": "pointwise_then_3x3.1.",
    r"brb_3x3{suffix}\.conv2\.": "pointwise_then_3x3.2.",
    r"brb_3x3{suffix}\.bn2\.": "pointwise_then_3x3.3.",
    r"brb_1x1{suffix}\.conv\.": "pointwise.0.",
    r"brb_1x1{suffix}\.bn\.": "pointwise.1.",
    r"brb_identity{suffix}\.": "identity.",
}
# decoder: classifier.{conv,bn}{1,2}_N (N = 4, 3, 2: its three top-down stages) -> decoder.stages.<4 - N>.
_DECODER_STAGE = {
    r"conv1_{n}\.": "conv.",
    r"bn1_{n}\.": "norm1.",
    r"bn2_{n}\.": "norm2.",
    r"conv2_{n}\.weight$": "rotated.weight",
    r"conv2_{n}\.rounting_func\.dwc\.": "rotated.routing.dwconv.",
    r"conv2_{n}\.rounting_func\.norm\.norm\.": "rotated.routing.norm.",
    r"conv2_{n}\.rounting_func\.fc_alpha\.": "rotated.routing.fc_gate.",
    r"conv2_{n}\.rounting_func\.fc_theta\.": "rotated.routing.fc_angle.",
}

_RENAMES = KeyRenames(
    [
        # text encoder: same names as transformers' BertModel
        (r"text_encoder\.pooler\.", None),
        (r"text_encoder\.embeddings\.(position_ids|token_type_ids)$", None),
        (r"text_encoder\.", "text_encoder."),
        # Swin stem and per-stage output norms
        (r"backbone\.patch_embed\.proj\.", "backbone.patch_embed."),
        (r"backbone\.patch_embed\.norm\.", "backbone.patch_norm."),
        (r"backbone\.norm(\d)\.", r"backbone.out_norms.\1."),
        # Swin blocks and patch merging keep their names inside a stage; the gates
        *under(
            _STAGE,
            r"backbone.stages.\1.",
            {r"(blocks|downsample)\.": r"\2.", r"res_gate\.": "language_gate.", r"visual_gate\.": "visual_gate."},
        ),
        # pixel-word attention module
        *under(
            _STAGE + r"fusion\.",
            r"backbone.stages.\1.pwam.",
            {
                r"vis_project\.0\.": "visual_proj.",
                r"project_mm\.0\.": "fused_proj.",
                r"image_lang_att\.f_query\.0\.": "attention.query.",
                r"image_lang_att\.f_key\.0\.": "attention.key.",
                r"image_lang_att\.f_value\.0\.": "attention.value.",
                r"image_lang_att\.W\.0\.": "attention.out.",
            },
        ),
        # the spatial re-weighting branch
        *[
            rule
            for suffix, rep in (("", "rep1"), ("_2", "rep2"))
            for rule in under(
                _STAGE + r"visual_residual\.repblock\.",
                rf"backbone.stages.\1.receptive.{rep}.",
                {name.format(suffix=suffix): new for name, new in _REP_BRANCH.items()},
            )
        ],
        # cross-scale interaction module
        *under(
            r"backbone\.cim\.", "neck.", {r"down_channel\.": "reduce.", r"up_channel\.": "expand.", r"bn\.": "norm."}
        ),
        *under(
            r"backbone\.cim\.fusion\.(\d+)\.",
            r"neck.gates.\1.",
            {
                r"local_embedding\.": "local_proj.",
                r"global_embedding\.": "global_proj.",
                r"global_act\.": "gate_proj.",
                r"bn1\.": "local_norm.",
                r"bn2\.": "global_norm.",
                r"bn3\.": "gate_norm.",
            },
        ),
        *under(
            r"backbone\.cim\.block\.0\.csa([12])\.m\.",
            r"neck.block.attn\1.",
            {
                r"bn1\.": "norm_in.",
                r"DWConv1\.": "pool2.",
                r"DWConv2\.": "pool3.",
                r"bn4\.": "norm_out.",
                r"conv\.": "proj.",
                r"attention\.qkv\.c\.": "attention.qkv.linear.",
                r"attention\.qkv\.bn\.": "attention.qkv.bn.",
                r"attention\.parallel_conv\.1\.": "attention.value_conv.",
                r"attention\.to_out\.": "attention.out.",
                r"attention\.proj\.": "attention.token_proj.",
            },
        ),
        *[
            rule
            for n in range(1, 5)
            for rule in under(
                rf"backbone\.cim\.block\.0\.intra_ff\.m\.ff{n}\.m\.",
                f"neck.block.scale_ffn.ffns.{n - 1}.",
                _FEED_FORWARD,
            )
        ],
        *under(r"backbone\.cim\.block\.0\.ff\.m\.", "neck.block.ffn.", _FEED_FORWARD),
        # decoder
        (r"classifier\.conv1_1\.", "decoder.classifier."),
        *[
            rule
            for n in (4, 3, 2)
            for rule in under(
                r"classifier\.",
                f"decoder.stages.{4 - n}.",
                {name.format(n=n): new for name, new in _DECODER_STAGE.items()},
            )
        ],
    ]
)


def upstream_key_to_ours(key: str) -> str | None:
    return _RENAMES(key.removeprefix("module."))  # "module.": a DistributedDataParallel wrapper
