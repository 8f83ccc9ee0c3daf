"""RemoteSAM key remap against the published checkpoint's names, and strict loading of upstream-named state dicts.

`fixtures/remotesam_upstream_keys.json` holds every state-dict name and shape of upstream's `LAVTOne` as published
(Swin-B, window 12, BERT-base without pooler: 1107 entries). It was written once, outside the repo, by building the
model from github:1e12Leon/RemoteSAM at commit 5b72655 (`lib/backbone.py`, `lib/mask_predictor.py`, `bert/`) and
dumping `{name: shape}`; no upstream code is kept here.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from helpers.weights import FIXTURES

from geopilot.errors import WeightsError
from geopilot.tools.remotesam import RemoteSam
from geopilot.tools.remotesam_keymap import upstream_key_to_ours
from geopilot.tools.remotesam_model import RemoteSamConfig, RemoteSamNet

UPSTREAM: dict[str, list[int]] = json.loads((FIXTURES / "remotesam_upstream_keys.json").read_text())


def test_every_published_key_maps_to_our_full_size_model_with_its_shape():
    with torch.device("meta"):
        ours = {k: list(v.shape) for k, v in RemoteSamNet(RemoteSamConfig()).state_dict().items()}
    mapped = {upstream_key_to_ours(k): shape for k, shape in UPSTREAM.items()}
    assert len(UPSTREAM) == 1107 and None not in mapped and len(mapped) == len(UPSTREAM)  # one-to-one
    assert mapped == ours


@pytest.mark.parametrize(
    ("upstream", "ours"),
    [
        (
            "module.backbone.layers.2.fusion.image_lang_att.f_query.0.weight",
            "backbone.stages.2.pwam.attention.query.weight",
        ),
        (
            "backbone.layers.0.visual_residual.repblock.brb_3x3_2.bn2.running_var",
            "backbone.stages.0.receptive.rep2.pointwise_then_3x3.3.running_var",
        ),
        ("backbone.cim.block.0.intra_ff.m.ff4.m.conv2.weight", "neck.block.scale_ffn.ffns.3.mix.weight"),
        ("classifier.conv2_4.rounting_func.fc_theta.weight", "decoder.stages.0.rotated.routing.fc_angle.weight"),
        ("classifier.bn2_2.num_batches_tracked", "decoder.stages.2.norm2.num_batches_tracked"),
        ("text_encoder.pooler.dense.weight", None),
        ("text_encoder.embeddings.position_ids", None),
        ("backbone.something_new.weight", "backbone.something_new.weight"),  # unknown: kept, so strict load names it
    ],
)
def test_single_keys(upstream, ours):
    assert upstream_key_to_ours(upstream) == ours


def _tiny_upstream_checkpoint(tmp_path, seed: int = 3) -> tuple[RemoteSam, dict[str, torch.Tensor]]:
    """A tiny model and its weights under upstream names (the published names of depth-2 stages and 1 BERT layer)."""
    model = RemoteSam.tiny(seed=seed)
    ours = model.net.state_dict()
    deep = re.compile(r"backbone\.layers\.\d+\.blocks\.([2-9]|1\d)\.|text_encoder\.encoder\.layer\.([1-9]|1\d)\.")
    names = [k for k in UPSTREAM if not deep.match(k)]
    state = {k: ours[upstream_key_to_ours(k)].clone() for k in names}
    assert len(state) == len(ours)
    model.tokenizer.save_pretrained(str(tmp_path / "bert-base-uncased"))
    return model, state


def test_checkpoint_with_upstream_names_loads_strictly_and_reproduces_the_model(tmp_path):
    model, state = _tiny_upstream_checkpoint(tmp_path)
    torch.save({"model": state, "epoch": 3}, tmp_path / "checkpoint.pth")
    loaded = RemoteSam.from_weights(tmp_path, architecture="tiny")
    image = torch.rand(1, 3, 64, 64)
    ids, mask = model.tokens("two ships")
    with torch.no_grad():
        assert torch.equal(loaded.net(image, ids, mask), model.net(image, ids, mask))


def test_unexpected_and_missing_checkpoint_keys_are_named(tmp_path):
    _, state = _tiny_upstream_checkpoint(tmp_path)
    state["backbone.layers.0.fusion.extra.weight"] = torch.zeros(1)
    del state["classifier.conv1_1.bias"]
    torch.save({"model": state}, tmp_path / "checkpoint.pth")
    with pytest.raises(WeightsError) as err:
        RemoteSam.from_weights(tmp_path, architecture="tiny")
    assert "missing keys (1): decoder.classifier.bias" in str(err.value)
    assert "unexpected keys (1): backbone.layers.0.fusion.extra.weight" in str(err.value)


def test_missing_weights_and_vocabulary_are_clear_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("GEOPILOT_WEIGHTS_DIR", raising=False)
    with pytest.raises(WeightsError, match=r"put remotesam/checkpoint\.pth under the folder \$GEOPILOT_WEIGHTS_DIR"):
        RemoteSam.from_weights(None)
    with pytest.raises(WeightsError, match="put checkpoint.pth in"):
        RemoteSam.from_weights(tmp_path)
    (tmp_path / "checkpoint.pth").write_bytes(b"x")
    with pytest.raises(WeightsError, match="put the BERT vocabulary at"):
        RemoteSam.from_weights(tmp_path)
