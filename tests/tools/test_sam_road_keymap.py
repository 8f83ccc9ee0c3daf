"""SAM-Road checkpoints: upstream key names (segment_anything ImageEncoderViT + naive decoder + TopoNet inside a
Lightning `state_dict`) load strictly into the transformers-based model; wrong checkpoints fail clearly."""

from __future__ import annotations

import pytest
import torch

from geopilot.errors import WeightsError
from geopilot.tools.registry import binding_status, load_tools_config
from geopilot.tools.sam_road import SamRoad, SamRoadNet, tiny_config, upstream_key_to_ours

ENCODER_BLOCK_PARTS = (
    "norm1.weight",
    "norm1.bias",
    "attn.qkv.weight",
    "attn.qkv.bias",
    "attn.proj.weight",
    "attn.proj.bias",
    "attn.rel_pos_h",
    "attn.rel_pos_w",
    "norm2.weight",
    "norm2.bias",
    "mlp.lin1.weight",
    "mlp.lin1.bias",
    "mlp.lin2.weight",
    "mlp.lin2.bias",
)
TOPO_LAYER_PARTS = (
    "self_attn.in_proj_weight",
    "self_attn.in_proj_bias",
    "self_attn.out_proj.weight",
    "self_attn.out_proj.bias",
    "linear1.weight",
    "linear1.bias",
    "linear2.weight",
    "linear2.bias",
    "norm1.weight",
    "norm1.bias",
    "norm2.weight",
    "norm2.bias",
)


def upstream_keys(depth: int) -> list[str]:
    """The key names of htcr/sam_road's `SAMRoad` (USE_SAM_DECODER False, no LoRA) for an encoder of `depth` blocks."""
    keys = ["image_encoder.pos_embed", "image_encoder.patch_embed.proj.weight", "image_encoder.patch_embed.proj.bias"]
    keys += [f"image_encoder.blocks.{i}.{part}" for i in range(depth) for part in ENCODER_BLOCK_PARTS]
    keys += [f"image_encoder.neck.{i}.{p}" for i, p in ((0, "weight"), (1, "weight"), (1, "bias"), (2, "weight"))]
    keys += ["image_encoder.neck.3.weight", "image_encoder.neck.3.bias"]
    keys += [f"map_decoder.{i}.{p}" for i in (0, 1, 3, 5, 7) for p in ("weight", "bias")]
    keys += [f"topo_net.{m}.{p}" for m in ("feature_proj", "pair_proj", "output_proj") for p in ("weight", "bias")]
    keys += [f"topo_net.transformer_encoder.layers.{i}.{part}" for i in range(3) for part in TOPO_LAYER_PARTS]
    return keys


@pytest.fixture(scope="module")
def model() -> SamRoadNet:
    return SamRoadNet(tiny_config(512))  # the CityScale patch size, tiny widths


def _upstream_state(model: SamRoadNet, seed: int = 0) -> dict[str, torch.Tensor]:
    ours = model.state_dict()
    generator = torch.Generator().manual_seed(seed)
    return {k: torch.randn(ours[upstream_key_to_ours(k)].shape, generator=generator) for k in upstream_keys(2)}


def test_every_upstream_key_maps_onto_exactly_one_of_ours(model):
    mapped = [upstream_key_to_ours(k) for k in upstream_keys(2)]
    assert sorted(mapped) == sorted(model.state_dict()) and len(set(mapped)) == len(mapped)
    assert upstream_key_to_ours("image_encoder.blocks.1.norm2.bias") == "image_encoder.layers.1.layer_norm2.bias"
    assert upstream_key_to_ours("image_encoder.neck.3.weight") == "image_encoder.neck.layer_norm2.weight"
    assert upstream_key_to_ours("pixel_mean") is None


def _save_lightning(path, state):
    torch.save({"epoch": 9, "global_step": 1000, "pytorch-lightning_version": "2.2.1", "state_dict": state}, path)


def test_lightning_checkpoint_with_upstream_names_loads_strictly(tmp_path, model):
    state = _upstream_state(model)
    path = tmp_path / "cityscale_vitb_512_e10.ckpt"
    _save_lightning(path, state)
    road = SamRoad.from_weights(path, architecture="tiny", preset="cityscale")
    loaded = road.model.state_dict()
    assert torch.equal(loaded["image_encoder.layers.1.attn.rel_pos_h"], state["image_encoder.blocks.1.attn.rel_pos_h"])
    assert torch.equal(loaded["image_encoder.neck.conv2.weight"], state["image_encoder.neck.2.weight"])
    assert torch.equal(loaded["map_decoder.1.weight"], state["map_decoder.1.weight"])
    # the folder form finds the preset's file
    assert SamRoad.from_weights(tmp_path, architecture="tiny").preset.name == "cityscale"


def test_unexpected_missing_and_foreign_keys_are_named(tmp_path, model):
    state = _upstream_state(model)
    extra = {**state, "image_encoder.blocks.7.norm1.weight": torch.zeros(32)}
    _save_lightning(tmp_path / "extra.ckpt", extra)
    with pytest.raises(WeightsError, match=r"unexpected keys \(1\): image_encoder\.layers\.7\.layer_norm1\.weight"):
        SamRoad.from_weights(tmp_path / "extra.ckpt", architecture="tiny")
    missing = {k: v for k, v in state.items() if k != "topo_net.output_proj.bias"}
    _save_lightning(tmp_path / "missing.ckpt", missing)
    with pytest.raises(WeightsError, match=r"missing keys \(1\): topo_net\.output_proj\.bias"):
        SamRoad.from_weights(tmp_path / "missing.ckpt", architecture="tiny")
    _save_lightning(tmp_path / "foreign.ckpt", {**state, "mask_decoder.iou_token.weight": torch.zeros(1, 256)})
    with pytest.raises(WeightsError, match="not a SAM-Road checkpoint: keys outside"):
        SamRoad.from_weights(tmp_path / "foreign.ckpt", architecture="tiny")


def test_missing_weights_are_a_clear_error(tmp_path, monkeypatch):
    with pytest.raises(WeightsError, match="weights not found"):
        SamRoad.from_weights(tmp_path / "absent.ckpt")
    (tmp_path / "sam_road").mkdir()
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(tmp_path))
    with pytest.raises(WeightsError, match="put cityscale_vitb_512_e10.ckpt in|put sam_road/cityscale_vitb_512_e10"):
        SamRoad.from_weights(None)


def test_tools_list_status_follows_the_preset_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(tmp_path))
    config = load_tools_config()
    status, detail = binding_status(config.tools["extract_roads"])
    assert status == "weights missing" and detail.startswith(
        "weights not found: put sam_road/cityscale_vitb_512_e10.ckpt"
    )
    (tmp_path / "sam_road").mkdir()
    (tmp_path / "sam_road" / "spacenet_vitb_256_e10.ckpt").write_bytes(b"x")
    spacenet = load_tools_config(overrides=["tools.extract_roads.options.preset=spacenet"])
    assert binding_status(spacenet.tools["extract_roads"]) == ("ready", None)
    assert binding_status(config.tools["extract_roads"])[0] == "weights missing"
