"""Weights: local resolution order, safe reading (pickled code refused), strict loading with a clear key list."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from geopilot.errors import WeightsError
from geopilot.tools.weights import (
    load_checkpoint,
    load_strict,
    pick_device,
    read_state_dict,
    remap_keys,
    resolve_weights,
)


class _Payload:
    """Unpickling this would create a file: the shape of a malicious checkpoint."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_explicit_path_wins_over_the_weights_dir(tmp_path, monkeypatch):
    explicit = tmp_path / "mine.pth"
    explicit.write_bytes(b"x")
    (tmp_path / "root" / "spa_gan").mkdir(parents=True)
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(tmp_path / "root"))
    assert resolve_weights("spa_gan", explicit, "RICE1/gen.pth") == explicit


def test_weights_dir_is_used_when_no_explicit_path(tmp_path, monkeypatch):
    target = tmp_path / "spa_gan" / "RICE1" / "gen.pth"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"x")
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(tmp_path))
    assert resolve_weights("spa_gan", None, "RICE1/gen.pth") == target


def test_missing_weights_say_where_to_put_them(tmp_path, monkeypatch):
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(tmp_path))
    with pytest.raises(WeightsError, match=r"weights not found: put spa_gan/RICE1/gen.pth at .*spa_gan/RICE1/gen.pth"):
        resolve_weights("spa_gan", None, "RICE1/gen.pth")
    monkeypatch.delenv("GEOPILOT_WEIGHTS_DIR")
    with pytest.raises(WeightsError, match=r"GEOPILOT_WEIGHTS_DIR"):
        resolve_weights("spa_gan", None, "RICE1/gen.pth")
    with pytest.raises(WeightsError, match=r"does not exist"):
        resolve_weights("spa_gan", tmp_path / "nope.pth")


def test_pickle_with_code_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pth"
    torch.save({"weight": torch.zeros(2), "extra": _Payload(marker)}, path)
    with pytest.raises(WeightsError, match="refused"):
        read_state_dict(path)
    assert not marker.exists()


def test_safetensors_and_containers_are_read(tmp_path):
    tensors = {"a.weight": torch.ones(2, 3)}
    save_file(tensors, tmp_path / "w.safetensors")
    assert torch.equal(read_state_dict(tmp_path / "w.safetensors")["a.weight"], tensors["a.weight"])
    torch.save({"state_dict": tensors, "meta": {"epoch": 3}}, tmp_path / "lightning.ckpt")
    assert list(read_state_dict(tmp_path / "lightning.ckpt")) == ["a.weight"]


def test_non_tensor_entries_are_listed(tmp_path):
    torch.save({"a": torch.ones(1), "epoch": 3}, tmp_path / "mixed.pth")
    with pytest.raises(WeightsError, match="not tensors: epoch"):
        read_state_dict(tmp_path / "mixed.pth")


def test_unexpected_missing_and_mis_shaped_keys_are_listed():
    module = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    state = {k: v.clone() for k, v in module.state_dict().items()}
    state["2.weight"] = torch.zeros(1)
    del state["1.bias"]
    state["0.weight"] = torch.zeros(4, 2)
    with pytest.raises(WeightsError) as err:
        load_strict(module, state, source="ckpt.pth")
    message = str(err.value)
    assert "missing keys (1): 1.bias" in message
    assert "unexpected keys (1): 2.weight" in message
    assert "0.weight (4, 2) vs (3, 2)" in message


def test_remap_then_strict_load_copies_values():
    module = nn.Linear(2, 2)
    upstream = {f"gen.{k}": torch.full_like(v, 0.5) for k, v in module.state_dict().items()}
    load_strict(module, remap_keys(upstream, lambda k: k.removeprefix("gen.")))
    assert torch.all(module.weight == 0.5)


def test_two_keys_mapped_to_one_is_an_error():
    with pytest.raises(WeightsError, match="two checkpoint keys"):
        remap_keys({"a": torch.ones(1), "b": torch.ones(1)}, lambda k: "x")


def test_device_choice():
    assert pick_device("cpu").type == "cpu"
    assert pick_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(WeightsError, match="unknown device"):
        pick_device("tpu9")


def test_load_checkpoint_loads_through_the_backend_loader_and_places_the_module(tmp_path, caplog):
    stored = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4)).half()
    path = tmp_path / "half.pth"
    torch.save(stored.state_dict(), path)
    seen = []

    def load_state(module, state, source):
        seen.append(source)
        load_strict(module, state, source=source)

    with caplog.at_level("WARNING"):
        module = load_checkpoint(nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4)), path, load_state, pick_device("cpu"))
    assert seen == [str(path)] and not module.training
    assert all(p.dtype == torch.float32 for p in module.parameters())
    assert torch.equal(module[0].weight, stored[0].weight.float())
    assert "stored as float16 are converted to float32" in caplog.text
