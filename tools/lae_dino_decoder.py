"""The Grounding DINO decoder with mmdet's box-refinement clamp (used by `geopilot.tools.lae_dino`).

transformers' `GroundingDinoDecoder` refines each layer's boxes with `sigmoid(delta + logit(reference, eps=1e-5))`;
LAE-DINO's decoder (mmdet `DinoTransformerDecoder.forward`, `mmdet/models/layers/transformer/dino_layers.py` L102-103)
uses `inverse_sigmoid(reference, eps=1e-3)`: a reference coordinate within 1e-3 of 0 or 1 (boxes at the image border,
or proposals that start saturated) is read as 1e-3 / 1 - 1e-3, and every later layer's boxes follow. The layer loop
below is transformers' with that one function swapped (inference path: no attention outputs, no checkpointing).
Compared against the upstream decoder in `tests/tools/test_lae_dino_upstream.py`.
"""

from __future__ import annotations

import torch
from transformers.models.grounding_dino.modeling_grounding_dino import (
    GroundingDinoDecoder,
    GroundingDinoDecoderOutput,
    encode_sinusoidal_position_embedding,
)

REFINE_EPS = 1e-3  # mmdet dino_layers.py L103


def mmdet_inverse_sigmoid(x: torch.Tensor, eps: float) -> torch.Tensor:
    """mmdet `inverse_sigmoid` (layers/transformer/utils.py L100-113): clamp to [0, 1], then each side to >= eps."""
    x = x.clamp(min=0, max=1)
    return torch.log(x.clamp(min=eps) / (1 - x).clamp(min=eps))


class MmdetRefineDecoder(GroundingDinoDecoder):
    def forward(
        self,
        inputs_embeds,
        vision_encoder_hidden_states,
        vision_encoder_attention_mask=None,
        text_encoder_hidden_states=None,
        text_encoder_attention_mask=None,
        reference_points=None,
        spatial_shapes=None,
        spatial_shapes_list=None,
        level_start_index=None,
        valid_ratios=None,
        self_attn_mask=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ):
        if output_attentions or (self.gradient_checkpointing and self.training):
            raise NotImplementedError("the LAE-DINO decoder runs inference only (no attention outputs)")
        if reference_points.shape[-1] != 4:
            raise ValueError(f"LAE-DINO is two-stage: reference boxes have 4 coordinates, got {reference_points.shape}")
        hidden_states = inputs_embeds
        all_hidden_states = () if output_hidden_states else None
        intermediate, intermediate_reference_points = (), ()
        if text_encoder_attention_mask is not None:  # as transformers: an additive mask per head and query
            dtype = text_encoder_hidden_states.dtype
            mask = text_encoder_attention_mask[:, None, None, :]
            mask = mask.repeat(1, self.config.decoder_attention_heads, self.config.num_queries, 1).to(dtype)
            text_encoder_attention_mask = mask * torch.finfo(dtype).min
        for idx, decoder_layer in enumerate(self.layers):
            reference_points_input = reference_points[:, :, None] * torch.cat([valid_ratios, valid_ratios], -1)[:, None]
            query_pos = self.reference_points_head(
                encode_sinusoidal_position_embedding(
                    reference_points_input[:, :, 0, :], num_pos_feats=self.config.d_model // 2
                )
            )
            if output_hidden_states:
                all_hidden_states += (self.layer_norm(hidden_states),)
            hidden_states = decoder_layer(
                hidden_states=hidden_states,
                position_embeddings=query_pos,
                reference_points=reference_points_input,
                spatial_shapes=spatial_shapes,
                spatial_shapes_list=spatial_shapes_list,
                level_start_index=level_start_index,
                vision_encoder_hidden_states=vision_encoder_hidden_states,
                vision_encoder_attention_mask=vision_encoder_attention_mask,
                text_encoder_hidden_states=text_encoder_hidden_states,
                text_encoder_attention_mask=text_encoder_attention_mask,
                self_attn_mask=self_attn_mask,
                output_attentions=False,
            )[0]
            delta = self.bbox_embed[idx](hidden_states)
            reference_points = (delta + mmdet_inverse_sigmoid(reference_points, REFINE_EPS)).sigmoid().detach()
            intermediate += (self.layer_norm(hidden_states),)
            intermediate_reference_points += (reference_points,)
        hidden_states = self.layer_norm(hidden_states)
        if output_hidden_states:
            all_hidden_states += (hidden_states,)
        output = GroundingDinoDecoderOutput(
            last_hidden_state=hidden_states,
            intermediate_hidden_states=torch.stack(intermediate, dim=1),
            intermediate_reference_points=torch.stack(intermediate_reference_points, dim=1),
            hidden_states=all_hidden_states,
            attentions=None,
        )
        return output if return_dict is not False else output.to_tuple()
