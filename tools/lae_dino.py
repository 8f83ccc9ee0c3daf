"""LAE-DINO (open-vocabulary remote-sensing detection) on transformers' Grounding DINO.

What LAE-DINO (jaychempan/LAE-DINO, mmdet) adds to Grounding DINO-T, rebuilt here by subclassing HF modules:
- per-layer box branches: `GroundingDinoConfig(decoder_bbox_embed_share=False)`;
- VisGT: a second stack of deformable encoder layers runs on the image features (without position embeddings, as
  upstream passes `query_pos=None`) before the fusion encoder, with the padding mask (pad tokens give no values);
  the mean over the image tokens is ADDED to every text embedding, at inference too (`VisGTEncoder`; deformable
  layers only, as upstream's `MetaGroundingDinoTransformerEncoder`: 7.7M of the model's 180.6M parameters at
  Swin-T). Mask convention: the encoder receives `vision_attention_mask` with True = padding, while transformers'
  `GroundingDinoDeformableLayer` takes True = valid (its `GroundingDinoEncoderLayer` passes `~key_padding_mask`),
  so the VisGT layers get the inverted mask too. The mean runs over the valid tokens only, so padding a batch does
  not change an image's prior; for one unpadded image (how `LaeDino.detect` runs) it is upstream's plain mean;
- the contrastive head of the official code: `ContrastiveEmbed(max_text_len=256, log_scale=0.0, bias=False)`,
  i.e. logits = (query @ text^T) * exp(log_scale) with one learnable log_scale per prediction layer
  (`LearnableScaleContrastiveEmbedding`, 6 decoder layers + the two-stage encoder output).
Inference follows mmdet's `custom_entities` path: categories are joined with " . " (same BERT tokens as upstream's
"a. b. "), chunked so each forward holds at most `chunk_size` categories and `max_text_len` tokens, a category's
score is the mean sigmoid over its tokens, the top `max_per_image` (query, category) pairs are kept; chunk results
are merged by score. `box_threshold` applies to that score; `text_threshold` additionally needs one of the
category's tokens to reach it (Grounding DINO's phrase rule). Preprocessing: short side 800, long side <= 1333,
ImageNet mean/std, resized as upstream's test pipeline (mmcv `imrescale`, cv2 bilinear on the 8-bit image).
Box refinement in the decoder clamps as mmdet's (`geopilot.tools.lae_dino_decoder`).

Weights: the upstream mmdet checkpoint (`lae_dino_swint_lae1m-28ca3a15.pth`, mapped by
`geopilot.tools.lae_dino_keymap`) or a safetensors file with our own names, plus a local BERT vocab
(`bert-base-uncased/vocab.txt`); never a hub download. Tests: `tests/tools/test_lae_dino*.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from transformers import BertConfig, BertTokenizer, GroundingDinoConfig, GroundingDinoForObjectDetection, SwinConfig
from transformers.models.grounding_dino.modeling_grounding_dino import (
    GroundingDinoDeformableLayer,
    GroundingDinoEncoder,
)

from geopilot.errors import GeoPilotInputError, WeightsError
from geopilot.tool_output import Detection
from geopilot.tools import weights as local_weights
from geopilot.tools.adapters import LaeDinoOptions
from geopilot.tools.canonical import unit_box
from geopilot.tools.cv2_resize import resize_bilinear_uint8
from geopilot.tools.lae_dino_decoder import MmdetRefineDecoder
from geopilot.tools.lae_dino_keymap import UNUSED_LOCAL, convert_mmdet_state_dict, is_mmdet_state_dict

BACKEND = "lae_dino"
CHECKPOINT_FILE = "lae_dino_swint_lae1m-28ca3a15.pth"
TOKENIZER_DIR = "bert-base-uncased"
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)
SPECIAL_TOKENS = ("[CLS]", "[SEP]", ".", "?")  # sub-sentence boundaries, as upstream's special_tokens_list


class LearnableScaleContrastiveEmbedding(nn.Module):
    """mmdet `ContrastiveEmbed(log_scale=0.0, bias=False)`: similarity times a learnable exp(log_scale)."""

    def __init__(self, max_text_len: int, log_scale: float = 0.0):
        super().__init__()
        self.max_text_len = max_text_len
        self.log_scale = nn.Parameter(torch.tensor([log_scale]))

    def forward(
        self, vision_hidden_state: torch.Tensor, text_hidden_state: torch.Tensor, text_token_mask: torch.Tensor
    ):
        res = (vision_hidden_state @ text_hidden_state.transpose(-1, -2)) * self.log_scale.exp()
        res = res.masked_fill(~text_token_mask[:, None, :], float("-inf"))
        padded = res.new_full((*res.shape[:-1], self.max_text_len), float("-inf"))
        padded[..., : res.shape[-1]] = res
        return padded


class VisGTEncoder(GroundingDinoEncoder):
    """The fusion encoder preceded by LAE-DINO's VisGT pre-encoder (upstream `MetaGroundingDinoTransformerEncoder`)."""

    def __init__(self, config: GroundingDinoConfig):
        super().__init__(config)
        self.visgt_layers = nn.ModuleList([GroundingDinoDeformableLayer(config) for _ in range(config.encoder_layers)])
        self.post_init()

    def visual_text_prior(
        self,
        vision_features,
        vision_attention_mask,
        spatial_shapes,
        spatial_shapes_list,
        level_start_index,
        valid_ratios=None,
        **_other_encoder_inputs,  # the rest of the encoder's inputs, when called with all of them
    ):
        """(batch, 1, d_model): the valid image tokens after the VisGT layers, averaged.

        `vision_attention_mask` is True at padding (the encoder's convention); the deformable layers want True at
        valid tokens, exactly as `GroundingDinoEncoderLayer` hands its own deformable layer `~key_padding_mask`."""
        reference_points = self.get_reference_points(spatial_shapes_list, valid_ratios, device=vision_features.device)
        valid = ~vision_attention_mask.bool()
        hidden = vision_features
        for layer in self.visgt_layers:
            hidden, _ = layer(
                hidden_states=hidden,
                attention_mask=valid,
                position_embeddings=None,
                reference_points=reference_points,
                spatial_shapes=spatial_shapes,
                spatial_shapes_list=spatial_shapes_list,
                level_start_index=level_start_index,
            )
        weights = valid.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(dim=1, keepdim=True) / weights.sum(dim=1, keepdim=True).clamp(min=1.0)

    def forward(self, text_features=None, **encoder_inputs):
        # GroundingDinoModel passes its encoder every input by name; the VisGT prior is added to the text features
        prior = self.visual_text_prior(**encoder_inputs)
        return super().forward(text_features=text_features + prior, **encoder_inputs)


class LaeDinoForObjectDetection(GroundingDinoForObjectDetection):
    """Grounding DINO with LAE-DINO's VisGT encoder and learnable-scale contrastive heads.

    The parent builds the stock encoder and parameter-free heads; they are replaced here, before any weights load.
    """

    def __init__(self, config: GroundingDinoConfig):
        if config.decoder_bbox_embed_share:
            raise ValueError("LAE-DINO has per-layer box branches: use decoder_bbox_embed_share=False")
        super().__init__(config)
        self.model.encoder = VisGTEncoder(config)
        decoder = MmdetRefineDecoder(config)
        decoder.bbox_embed = self.model.decoder.bbox_embed
        self.model.decoder = decoder
        self.class_embed = nn.ModuleList(
            [LearnableScaleContrastiveEmbedding(config.max_text_len) for _ in range(config.decoder_layers)]
        )
        self.model.encoder_output_class_embed = LearnableScaleContrastiveEmbedding(config.max_text_len)
        self.post_init()


def swin_t_config() -> GroundingDinoConfig:
    """The published LAE-DINO: Swin-T (96, 2-2-6-2, window 7, stages 2-4), BERT-base, 900 queries, 6+6 layers."""
    return GroundingDinoConfig(
        backbone_config=SwinConfig(
            embed_dim=96,
            depths=[2, 2, 6, 2],
            num_heads=[3, 6, 12, 24],
            window_size=7,
            out_features=["stage2", "stage3", "stage4"],
        ),
        text_config=BertConfig(),
        decoder_bbox_embed_share=False,
        two_stage_bbox_embed_share=False,
    )


def tiny_config(vocab_size: int) -> GroundingDinoConfig:
    """A random-init model small enough for CPU unit tests (0.5M parameters)."""
    return GroundingDinoConfig(
        backbone_config=SwinConfig(
            image_size=64,
            patch_size=4,
            embed_dim=16,
            depths=[1, 1, 2, 1],
            num_heads=[1, 2, 2, 4],
            window_size=4,
            out_features=["stage2", "stage3", "stage4"],
        ),
        text_config=BertConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        ),
        d_model=32,
        encoder_layers=1,
        decoder_layers=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        num_queries=30,
        max_text_len=48,
        decoder_bbox_embed_share=False,
        two_stage_bbox_embed_share=False,
    )


TINY_WORDS = (
    "plane airplane ship boat vehicle car truck storage tank harbor bridge airport runway building house road "
    "tree water river field court ground track basketball tennis baseball stadium roundabout pool swimming"
).split()


def tiny_tokenizer() -> BertTokenizer:
    """A WordPiece tokenizer built in memory: BERT's specials, letters as fallback pieces, a few RS words."""
    letters = list("abcdefghijklmnopqrstuvwxyz0123456789")
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "?", ",", "-", *letters, *(f"##{c}" for c in letters)]
    pieces += [w for w in TINY_WORDS if w not in pieces]
    return BertTokenizer(vocab={piece: i for i, piece in enumerate(pieces)})


@dataclass(frozen=True)
class PromptChunk:
    """One forward's caption and, per category, the token positions its score averages over."""

    categories: list[str]
    caption: str
    token_positions: list[list[int]]


def clean_label_name(name: str) -> str:
    """Upstream `clean_label_name`: drop "(...)", underscores to spaces."""
    return re.sub(r"  ", " ", re.sub(r"_", " ", re.sub(r"\(.*\)", "", name))).strip()


def _caption(names: list[str]) -> tuple[str, list[tuple[int, int]]]:
    caption, spans = "", []
    for name in names:
        spans.append((len(caption), len(caption) + len(name)))
        caption += name + " . "
    return caption.rstrip(), spans


def _positive_tokens(encoding, spans: list[tuple[int, int]]) -> list[list[int]]:
    """Upstream `create_positive_map` + `create_positive_map_label_to_token`, as token index lists."""
    out = []
    for beg, end in spans:
        first = next((t for t in (encoding.char_to_token(c) for c in (beg, beg + 1, beg + 2)) if t is not None), None)
        last = next(
            (t for t in (encoding.char_to_token(c) for c in (end - 1, end - 2, end - 3)) if t is not None), None
        )
        out.append(list(range(first, last + 1)) if first is not None and last is not None else [])
    return out


def build_prompt_chunks(tokenizer, categories: list[str], chunk_size: int, max_text_len: int) -> list[PromptChunk]:
    """Greedy chunks of at most `chunk_size` categories whose caption fits in `max_text_len` tokens."""
    names = [clean_label_name(c) for c in categories]
    chunks: list[list[int]] = [[]]
    for index, name in enumerate(names):
        if len(tokenizer(name + " .").input_ids) > max_text_len:
            raise GeoPilotInputError(f"category {categories[index]!r} is longer than {max_text_len} tokens")
        trial = chunks[-1] + [index]
        too_long = len(tokenizer(_caption([names[i] for i in trial])[0]).input_ids) > max_text_len
        if chunks[-1] and (len(trial) > chunk_size or too_long):
            chunks.append([index])
        else:
            chunks[-1] = trial
    result = []
    for members in chunks:
        caption, spans = _caption([names[i] for i in members])
        token_positions = _positive_tokens(tokenizer(caption), spans)
        result.append(PromptChunk([categories[i] for i in members], caption, token_positions))
    return result


class LaeDino:
    """`detect(image, categories) -> list[Detection]` with LAE-DINO."""

    def __init__(self, model: LaeDinoForObjectDetection, tokenizer, options: LaeDinoOptions, device: torch.device):
        self.model, self.tokenizer, self.options, self.device = model, tokenizer, options, device
        special_ids = tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS))
        self.model.model.special_tokens.copy_(torch.tensor(special_ids, dtype=torch.long))

    @classmethod
    def tiny(cls, seed: int = 0, **options) -> LaeDino:
        """Random weights, tiny sizes, in-memory tokenizer: for tests and dry runs (outputs are meaningless)."""
        torch.manual_seed(seed)
        tokenizer = tiny_tokenizer()
        model = LaeDinoForObjectDetection(tiny_config(len(tokenizer.get_vocab()))).eval()
        opts = LaeDinoOptions(
            **{"short_side": 64, "max_long_side": 96, "box_threshold": 0.0, "text_threshold": 0.0, **options}
        )
        return cls(model, tokenizer, opts, torch.device("cpu"))

    @classmethod
    def from_weights(cls, weights_path: str | None, device: str = "cpu", **options) -> LaeDino:
        opts = LaeDinoOptions(**options)
        checkpoint = local_weights.resolve_weights(BACKEND, weights_path, filename=CHECKPOINT_FILE)
        if checkpoint.is_dir():
            found = sorted([*checkpoint.glob("*.pth"), *checkpoint.glob("*.safetensors")])
            if not found:
                raise WeightsError(f"weights not found: put {CHECKPOINT_FILE} in {checkpoint}")
            checkpoint = found[0]
        tokenizer_dir = Path(opts.tokenizer_path) if opts.tokenizer_path else checkpoint.parent / TOKENIZER_DIR
        if not any((tokenizer_dir / name).is_file() for name in ("vocab.txt", "tokenizer.json")):
            raise WeightsError(f"weights not found: put the BERT vocabulary at {tokenizer_dir / 'vocab.txt'}")
        tokenizer = BertTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
        vocab_size = len(tokenizer.get_vocab())
        config = swin_t_config() if opts.architecture == "swin-t" else tiny_config(vocab_size)
        if vocab_size > config.text_config.vocab_size:
            raise WeightsError(
                f"{tokenizer_dir}: {vocab_size} tokens, but the text encoder has {config.text_config.vocab_size}"
            )
        model = LaeDinoForObjectDetection(config)
        state = local_weights.read_state_dict(checkpoint)
        load_lae_dino_state(model, state, source=str(checkpoint))
        target = local_weights.pick_device(device)
        stored = local_weights.float_dtypes(state)
        model = local_weights.place(model, target, opts.precision, stored=stored, source=str(checkpoint))
        return cls(model, tokenizer, opts, target)

    def _pixels(self, image: Image.Image) -> torch.Tensor:
        o = self.options
        width, height = image.size
        scale = min(o.short_side / min(width, height), o.max_long_side / max(width, height))
        size = (max(1, int(width * scale + 0.5)), max(1, int(height * scale + 0.5)))
        rgb = np.asarray(image.convert("RGB"), dtype=np.uint8)
        array = resize_bilinear_uint8(rgb, *size).astype(np.float32)  # upstream: mmcv imrescale, cv2 backend
        array = (array - np.array(IMAGENET_MEAN, dtype=np.float32)) / np.array(IMAGENET_STD, dtype=np.float32)
        dtype = next(self.model.parameters()).dtype
        return torch.from_numpy(array).permute(2, 0, 1)[None].to(self.device, dtype)

    @torch.no_grad()
    def _detect_chunk(self, pixels: torch.Tensor, chunk: PromptChunk) -> list[tuple[float, Detection]]:
        o = self.options
        text = self.tokenizer([chunk.caption], return_tensors="pt").to(self.device)
        out = self.model(
            pixel_values=pixels,
            input_ids=text.input_ids,
            token_type_ids=text.token_type_ids,
            attention_mask=text.attention_mask,
        )
        probs = out.logits[0].float().sigmoid()  # (queries, max_text_len)
        boxes = out.pred_boxes[0].float()
        usable = [i for i, tokens in enumerate(chunk.token_positions) if tokens]
        if not usable:
            return []
        mean_score = torch.stack([probs[:, chunk.token_positions[i]].mean(-1) for i in usable], dim=1)
        best_token = torch.stack([probs[:, chunk.token_positions[i]].max(-1).values for i in usable], dim=1)
        k = min(o.max_per_image, mean_score.numel())
        scores, flat = mean_score.flatten().topk(k)
        found = []
        for score, index in zip(scores.tolist(), flat.tolist(), strict=True):
            query, column = divmod(index, len(usable))
            if score < o.box_threshold or best_token[query, column] < o.text_threshold:
                continue
            cx, cy, w, h = boxes[query].tolist()
            box = unit_box(cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
            label = chunk.categories[usable[column]]
            found.append((score, Detection(label=label, box=box, score=min(max(score, 0.0), 1.0))))
        return found

    def detect(self, image: Image.Image, categories: list[str]) -> list[Detection]:
        names = list(dict.fromkeys(c.strip() for c in categories))
        if not names or any(not n for n in names):
            raise GeoPilotInputError("LAE-DINO needs at least one non-empty category name")
        pixels = self._pixels(image)
        chunks = build_prompt_chunks(self.tokenizer, names, self.options.chunk_size, self.model.config.max_text_len)
        found = [hit for chunk in chunks for hit in self._detect_chunk(pixels, chunk)]
        found.sort(key=lambda pair: -pair[0])
        return [d for _, d in found[: self.options.max_detections]]


def load_lae_dino_state(
    model: LaeDinoForObjectDetection, state: dict[str, torch.Tensor], source: str = "checkpoint"
) -> None:
    """Load an upstream mmdet or an own-name state dict strictly (see `geopilot.tools.lae_dino_keymap`)."""
    if is_mmdet_state_dict(state):
        config = model.config
        state = convert_mmdet_state_dict(state, config.decoder_layers, len(config.backbone_config.out_features))
        own = model.state_dict()
        for pattern in UNUSED_LOCAL:  # never read by the forward pass; keep the module's own values
            state.update({k: v for k, v in own.items() if re.fullmatch(pattern, k) and k not in state})
    local_weights.load_strict(model, state, source=source)
