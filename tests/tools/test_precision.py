"""Precision: fp32 defaults, fp16 only where it gives fp32's outputs, fp32 parts, refusals, checkpoint dtype notes.

fp16 is measured on CPU (torch runs fp16 kernels there) with the tiny random architectures on fixed inputs; the
tolerances are `benchmarks/specialists_check.py`'s (docs/tools.md, "Precision").
"""

from __future__ import annotations

import copy
import json
import logging

import numpy as np
import pytest
import torch
from PIL import Image

from geopilot.errors import ConfigError
from geopilot.tools.adapters import DenoDetOptions, LaeDinoOptions, RemoteSamOptions, SamRoadOptions, SpaGanOptions
from geopilot.tools.precision import PRECISIONS
from geopilot.tools.weights import to_precision


def _scene(seed: int, size: int = 96) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (size, size * 3 // 2, 3), dtype=np.uint8))


def _in_fp16(tool, backend: str):
    """A copy of `tool` with its networks in fp16 and the backend's fp32 parts in fp32, as `weights.place` on CUDA."""
    other = copy.deepcopy(tool)
    for name, value in vars(other).items():
        if isinstance(value, torch.nn.Module):
            parts = tuple(p for p in PRECISIONS[backend].fp32_parts if hasattr(value, p.split(".")[0]))
            setattr(other, name, to_precision(value, "fp16", parts))
    if "dtype" in vars(other):
        other.dtype = torch.float16
    return other


def test_every_backend_defaults_to_fp32_upstreams_precision_except_segearth_ovs_fp16():
    # SegEarth-OV's segearth_segmentor.py L48/L157/L292 run CLIP, the upsampler and the inputs in fp16
    assert {name: p.upstream for name, p in PRECISIONS.items() if p.upstream != "fp32"} == {"segearth_ov": "fp16"}
    assert {p.default for p in PRECISIONS.values()} == {"fp32"}
    for options in (LaeDinoOptions(), DenoDetOptions(), SamRoadOptions(), RemoteSamOptions(), SpaGanOptions()):
        assert options.precision == "fp32"


def _boxes(detections) -> np.ndarray:
    return np.array([d.box for d in detections], dtype=np.float64).reshape(-1, 4)


@pytest.mark.parametrize("seed", [0, 1])
def test_lae_dino_fp16_finds_the_same_boxes_within_0_01(seed):
    """Allowed: the same boxes (matched; near-tied scores may swap order) and labels."""
    from geopilot.tools.lae_dino import LaeDino

    tool = LaeDino.tiny()
    full = tool.detect(_scene(seed), ["plane", "ship"])
    half = _in_fp16(tool, "lae_dino").detect(_scene(seed), ["plane", "ship"])
    assert len(full) == len(half) > 10
    distance = np.abs(_boxes(full)[:, None] - _boxes(half)[None]).max(-1)
    assert distance.min(axis=1).max() <= 0.01
    assert sorted(d.label for d in full) == sorted(d.label for d in half)


@pytest.mark.parametrize("seed", [0, 1])
def test_segearth_ov_and_remotesam_fp16_give_the_same_masks(seed):
    from geopilot.tools.remotesam import RemoteSam
    from geopilot.tools.segearth_ov import SegEarthOV

    segmenter = SegEarthOV.tiny()
    classes = ["building", "road", "tree"]
    full = [np.asarray(s.mask, bool) for s in segmenter.segment(_scene(seed), classes)]
    half = [np.asarray(s.mask, bool) for s in _in_fp16(segmenter, "segearth_ov").segment(_scene(seed), classes)]
    assert len(full) == len(half) and all((a == b).all() for a, b in zip(full, half, strict=True))

    remotesam = RemoteSam.tiny()
    mask, prob = remotesam.predict(_scene(seed), "the ship on the left")
    half_mask, half_prob = _in_fp16(remotesam, "remotesam").predict(_scene(seed), "the ship on the left")
    assert (mask != half_mask).mean() <= 0.01 and np.abs(prob - half_prob).max() < 0.01


def test_spa_gan_fp16_moves_restored_pixels_by_at_most_2_of_255():
    from geopilot.tools.spa_gan import SpaGan

    tool = SpaGan.tiny(seed=0)
    full = np.asarray(tool.restore(_scene(0)).restored, np.int16)
    half = np.asarray(_in_fp16(tool, "spa_gan").restore(_scene(0)).restored, np.int16)
    assert np.abs(full - half).max() <= 2


def test_denodet_fp16_changes_the_boxes_even_with_its_gate_in_fp32_so_it_is_refused():
    """Why fp16 is refused for DenoDet (the measurement behind docs/tools.md): on seed 1 one box more or less."""
    from geopilot.tools.denodet import DenoDet

    tool = DenoDet.tiny(score_thr=0.0)
    half = _in_fp16(tool, "denodet")
    assert half.model.neck.trans_deno[0].dct_h.dtype == torch.float32  # the fragile part stays fp32
    assert half.model.neck.trans_deno[0].attention.gate[0].weight.dtype == torch.float32
    assert half.model.backbone.conv1.weight.dtype == torch.float16
    assert len(tool.detect(_scene(1))) != len(half.detect(_scene(1)))
    with pytest.raises(ValueError, match="fp16 is refused for denodet"):
        DenoDetOptions(precision="fp16")


def test_denodet_select_block_gate_is_wrong_in_fp16_and_right_as_an_fp32_part():
    """The 1e-15 of upstream's SelectBlock is 0 in fp16: the lowest slot then reads branch 0 twice (issue 23)."""
    from geopilot.tools.denodet import SelectBlock

    torch.manual_seed(0)
    block = SelectBlock(16).eval()
    origin, branches = torch.randn(2, 16, 1), torch.randn(2, 4, 16, 1)
    exact = block(origin, branches)
    half = copy.deepcopy(block).half()(origin.half(), branches.half()).float()
    assert (half - exact).abs().max() > 0.05  # fp16 here is not rounding noise


def test_sam_road_score_maps_stay_fp32_and_fp16_is_refused():
    from geopilot.tools.sam_road import SamRoad

    tool = SamRoad.tiny(seed=0)
    half = _in_fp16(tool, "sam_road")
    assert half.model.map_decoder[0].weight.dtype == torch.float32
    rgb = torch.from_numpy(np.asarray(_scene(0, 64))[:, :64].copy()).permute(2, 0, 1)[None].float()
    masks, _ = half.model.masks_and_features(rgb.half())
    assert masks.dtype == torch.float32
    # why fp16 is refused: the 8-bit scores move (0.6 % of road pixels on this input) and so does the graph
    scene = _scene(1)
    tool = SamRoad.tiny(seed=1)
    assert tool.extract(scene).nodes != _in_fp16(tool, "sam_road").extract(scene).nodes
    with pytest.raises(ValueError, match="fp16 is refused for sam_road"):
        SamRoadOptions(precision="fp16")


def test_a_refused_fp16_in_the_tools_config_is_one_line_naming_the_setting():
    from geopilot.tools.registry import load_tools_config

    with pytest.raises(ConfigError) as err:
        load_tools_config(overrides=["tools.sar_detect_all.options.model.precision=fp16"])
    message = str(err.value)
    assert "\n" not in message and "tools.sar_detect_all.options: model.precision: fp16 is refused" in message
    load_tools_config(overrides=["tools.remove_clouds.options.precision=fp16"])  # allowed: loads


def test_tools_list_json_shows_each_tools_precision(capsys):
    from geopilot.cli import main

    assert main(["tools", "list", "--json", "tools.remove_clouds.options.precision=fp16"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["remove_clouds"]["precision"] == "fp16" and rows["extract_roads"]["precision"] == "fp32"
    assert {row["upstream_precision"] for row in rows.values() if row["backend"] != "segearth_ov"} == {"fp32"}
    assert rows["segment_semantic"]["upstream_precision"] == "fp16"


def test_a_checkpoint_in_another_dtype_is_converted_with_a_note(tmp_path, caplog):
    from safetensors.torch import save_file

    from geopilot.tools.spa_gan import SpaGan

    state = {k: v.half() for k, v in SpaGan.tiny().model.state_dict().items()}
    path = tmp_path / "gen.safetensors"
    save_file(state, str(path))
    with caplog.at_level(logging.WARNING, logger="geopilot.tools"):
        tool = SpaGan.from_weights(path, device="cpu")
    assert next(tool.model.parameters()).dtype == torch.float32
    assert any("float16 are converted to float32 (precision: fp32)" in r.getMessage() for r in caplog.records)
