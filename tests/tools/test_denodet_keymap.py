"""DenoDet checkpoints: mmdet/GrokSAR key names (ResNet + FrequencySpatialFPN + GFLHead in an mmengine `state_dict`)
load strictly; wrong or missing checkpoints fail clearly; `geopilot tools list` reports the backend."""

from __future__ import annotations

import json
import math

import pytest
import torch

from geopilot.cli import main
from geopilot.errors import WeightsError
from geopilot.tools.denodet import DenoDet, DenoDetNet, tiny_config, upstream_key_to_ours


def _dct(n: int, inverse: bool) -> torch.Tensor:
    """Upstream's `get_dct_filter` loops (DCT: [v, j]; the inverse layer stores the transpose)."""
    out = torch.zeros(n, n)
    for v in range(n):
        for j in range(n):
            k, i = (j, v) if inverse else (v, j)
            out[v, j] = math.cos(math.pi * (0.5 + i) * k / n) / math.sqrt(n) * (math.sqrt(2) if k else 1.0)
    return out


def upstream_state(model: DenoDetNet, seed: int = 0) -> dict[str, torch.Tensor]:
    """A state dict with mmdet GFL + GrokSAR FrequencySpatialFPN names, shaped for `model`."""
    generator = torch.Generator().manual_seed(seed)
    ours = model.state_dict()
    state = {f"backbone.{k[len('backbone.') :]}": v.clone() for k, v in ours.items() if k.startswith("backbone.")}
    keys = [f"neck.lateral_convs.{i}.conv.{p}" for i in range(3) for p in ("weight", "bias")]
    keys += [f"neck.fpn_convs.{i}.conv.{p}" for i in range(5) for p in ("weight", "bias")]
    for level in (0, 1):
        prefix = f"neck.DCTDenoAttention{level}.1"
        keys += [f"{prefix}.fc{i}.0.{p}" for i in range(1, 9) for p in ("weight", "bias")]
        keys += [f"{prefix}.select1.weight", f"{prefix}.select2.weight"]
    for tower in ("cls", "reg"):
        keys += [f"bbox_head.{tower}_convs.{i}.{m}" for i in range(4) for m in ("conv.weight", "gn.weight", "gn.bias")]
    keys += [f"bbox_head.gfl_{h}.{p}" for h in ("cls", "reg") for p in ("weight", "bias")]
    keys += [f"bbox_head.scales.{i}.scale" for i in range(5)]
    for key in keys:
        state[key] = torch.randn(ours[upstream_key_to_ours(key)].shape, generator=generator)
    for level, size in enumerate(model.config.dct_sizes()):
        prefix = f"neck.DCTDenoAttention{level}"
        state[f"{prefix}.0.dct_x.weight"] = state[f"{prefix}.0.dct_y.weight"] = _dct(size, inverse=False)
        state[f"{prefix}.2.idct_x.weight"] = state[f"{prefix}.2.idct_y.weight"] = _dct(size, inverse=True)
    state["bbox_head.integral.project"] = torch.linspace(0, 16, 17)
    return state


@pytest.fixture(scope="module")
def model() -> DenoDetNet:
    return DenoDetNet(tiny_config(128))


def test_upstream_keys_map_onto_ours_and_the_dct_buffers_agree(model):
    state = upstream_state(model)
    mapped = {upstream_key_to_ours(k) for k in state} - {None}
    assert mapped == set(model.state_dict())
    assert upstream_key_to_ours("neck.DCTDenoAttention0.1.fc6.0.weight") == "neck.trans_deno.0.attention.gate.1.weight"
    assert upstream_key_to_ours("neck.fpn_convs.4.conv.bias") == "neck.extra_convs.1.bias"
    assert upstream_key_to_ours("bbox_head.reg_convs.3.gn.weight") == "head.reg_convs.3.1.weight"
    assert upstream_key_to_ours("neck.DCTDenoAttention1.2.idct_y.weight") is None
    torch.testing.assert_close(model.neck.trans_deno[0].dct_h, state["neck.DCTDenoAttention0.0.dct_y.weight"])


def test_mmengine_checkpoint_with_upstream_names_loads_strictly(tmp_path, model):
    state = upstream_state(model)
    path = tmp_path / "denodet_sardet100k.pth"
    torch.save({"meta": {"epoch": 12, "mmdet_version": "3.0.0"}, "state_dict": state}, path)
    detector = DenoDet.from_weights(tmp_path, architecture="tiny", input_size=128)  # the folder's only .pth
    loaded = detector.model.state_dict()
    assert torch.equal(loaded["head.cls_out.weight"], state["bbox_head.gfl_cls.weight"])
    assert torch.equal(loaded["head.scales.2"], state["bbox_head.scales.2.scale"])
    assert torch.equal(
        loaded["neck.trans_deno.1.attention.select_gate.offsets.weight"],
        state["neck.DCTDenoAttention1.1.select2.weight"],
    )


def test_unexpected_and_missing_keys_are_named(tmp_path, model):
    state = upstream_state(model)
    torch.save({"state_dict": {**state, "bbox_head.atss_centerness.weight": torch.zeros(1)}}, tmp_path / "a.pth")
    with pytest.raises(WeightsError, match=r"unexpected keys \(1\): bbox_head\.atss_centerness\.weight"):
        DenoDet.from_weights(tmp_path / "a.pth", architecture="tiny", input_size=128)
    del state["bbox_head.gfl_reg.bias"]
    torch.save({"state_dict": state}, tmp_path / "b.pth")
    with pytest.raises(WeightsError, match=r"missing keys \(1\): head\.reg_out\.bias"):
        DenoDet.from_weights(tmp_path / "b.pth", architecture="tiny", input_size=128)
    with pytest.raises(WeightsError, match=r"shape mismatches"):  # a 512 px checkpoint into a 256 px model
        DenoDet.from_weights(tmp_path / "b.pth", architecture="tiny", input_size=256)


def test_missing_weights_are_a_clear_error(tmp_path):
    with pytest.raises(WeightsError, match="weights not found"):
        DenoDet.from_weights(tmp_path / "absent.pth")
    with pytest.raises(WeightsError, match="holds no .pth/.safetensors files"):
        DenoDet.from_weights(tmp_path)


def test_tools_list_reports_both_backends_ready_or_weights_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(tmp_path))
    assert main(["tools", "list", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["sar_detect_all"]["backend"] == "denodet" and rows["extract_roads"]["backend"] == "sam_road"
    assert rows["sar_detect_all"]["status"] == "weights missing" and rows["sar_detect_all"]["status_detail"].startswith(
        "weights not found: put denodet at"
    )
    assert rows["extract_roads"]["status"] == "weights missing"
    (tmp_path / "denodet").mkdir()
    (tmp_path / "denodet" / "denodet.pth").write_bytes(b"x")
    (tmp_path / "sam_road").mkdir()
    (tmp_path / "sam_road" / "cityscale_vitb_512_e10.ckpt").write_bytes(b"x")
    assert main(["tools", "list", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["sar_detect_all"]["status"] == rows["extract_roads"]["status"] == "ready"
