"""BIT against upstream's network in fp32 (issue 46): same random weights, same change logits; upstream's training
checkpoint format loads strictly and runs through `geopilot tools run detect_changes`.

Upstream: github.com/justchenhao/BIT_CD at adcd7ae. Its modules import torchvision's private `models.utils` and
einops, so they are reimplemented below with upstream's module and parameter names (the state dict is upstream's,
key for key, layer4 and fc included) and upstream's forward step for step (einops `rearrange` spelt as reshapes):
- `models/resnet.py` L35-73 `BasicBlock` (L45-46: a dilation > 1 is silently set to 1), L125-204 `ResNet`
  (`replace_stride_with_dilation=[False, True, True]` from `networks.py` L160-161: layer3 and layer4 at stride 1);
- `models/help_funcs.py` L7-15 `TwoLayerConv2d`, L18-49 `Residual`/`Residual2`/`PreNorm`/`PreNorm2` (PreNorm2 puts
  both inputs through the same norm), L52-63 `FeedForward`, L66-114 `Cross_Attention`, L117-151 `Attention`
  (both scale by `dim ** -0.5`), L154-186 `Transformer`, `TransformerDecoder`;
- `models/networks.py` L149-230 `ResNet` (`forward_single`: 4 stages, nearest x2, `conv_pred`), L233-365
  `BASE_Transformer` (`_forward_semantic_tokens` L285-293, `_forward_transformer` L306-310 with the learned
  `pos_embedding`, `_forward_transformer_decoder` L312-321 without a decoder position embedding, `forward` L332-365:
  |x1 - x2|, bilinear x4, classifier); `define_G` L131-137: `base_transformer_pos_s4_dd8` (decoder heads of 64)
  and `base_transformer_pos_s4_dd8_dedim8` (of 8, the released BIT_LEVIR).
Our `BitNet` takes upstream's state dict through `geopilot.tools.bit_cd.upstream_key_to_ours` (keymap rules).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.weights import bit_cd_checkpoint
from PIL import Image
from torch import nn

from geopilot.cli import main
from geopilot.errors import WeightsError
from geopilot.tool_output import ToolOutput, decode_mask
from geopilot.tools.bit_cd import CROP, BitCd, BitNet, normalise, upstream_key_to_ours
from geopilot.tools.weight_files import BIT_CD_CHECKPOINT
from geopilot.tools.weights import load_strict, remap_keys

FP32_TOLERANCE = 1e-4  # same float32 maths, a fused attention kernel instead of einsums: measured 7e-7


class UpstreamBasicBlock(nn.Module):  # resnet.py L35-73
    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)  # L49: conv3x3, dilation dropped
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class UpstreamResNet18(nn.Module):  # resnet.py L125-204 with [2, 2, 2, 2] and dilation [False, True, True]
    def __init__(self):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(64, 1)
        self.layer2 = self._make_layer(128, 2)
        self.layer3 = self._make_layer(256, 1)  # L186-188: dilate -> stride 1
        self.layer4 = self._make_layer(512, 1)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, 1000)

    def _make_layer(self, planes, stride):  # L182-204
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))
        layers = [UpstreamBasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers.append(UpstreamBasicBlock(planes, planes))
        return nn.Sequential(*layers)


class TwoLayerConv2d(nn.Sequential):  # help_funcs.py L7-15
    def __init__(self, in_channels, out_channels, kernel_size=3):
        super().__init__(
            nn.Conv2d(in_channels, in_channels, kernel_size, padding=kernel_size // 2, stride=1, bias=False),
            nn.BatchNorm2d(in_channels),
            nn.ReLU(),
            nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, stride=1),
        )


class Residual(nn.Module):  # L18-23
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, **kwargs):
        return self.fn(x, **kwargs) + x


class Residual2(nn.Module):  # L26-31
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, x2, **kwargs):
        return self.fn(x, x2, **kwargs) + x


class PreNorm(nn.Module):  # L34-40
    def __init__(self, dim, fn):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fn = fn

    def forward(self, x, **kwargs):
        return self.fn(self.norm(x), **kwargs)


class PreNorm2(nn.Module):  # L43-49
    def __init__(self, dim, fn):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fn = fn

    def forward(self, x, x2, **kwargs):
        return self.fn(self.norm(x), self.norm(x2), **kwargs)


class FeedForward(nn.Module):  # L52-63
    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden_dim), nn.GELU(), nn.Dropout(0), nn.Linear(hidden_dim, dim))
        self.net.append(nn.Dropout(0))

    def forward(self, x):
        return self.net(x)


def _heads(t, h):  # rearrange(t, 'b n (h d) -> b h n d', h=h)
    b, n, _ = t.shape
    return t.reshape(b, n, h, -1).permute(0, 2, 1, 3)


def _merge(t):  # rearrange(out, 'b h n d -> b n (h d)')
    b, h, n, d = t.shape
    return t.permute(0, 2, 1, 3).reshape(b, n, h * d)


class Cross_Attention(nn.Module):  # noqa: N801 - L66-114
    def __init__(self, dim, heads=8, dim_head=64):
        super().__init__()
        inner_dim = dim_head * heads
        self.heads = heads
        self.scale = dim**-0.5
        self.to_q = nn.Linear(dim, inner_dim, bias=False)
        self.to_k = nn.Linear(dim, inner_dim, bias=False)
        self.to_v = nn.Linear(dim, inner_dim, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner_dim, dim), nn.Dropout(0))

    def forward(self, x, m):
        q, k, v = (_heads(t, self.heads) for t in (self.to_q(x), self.to_k(m), self.to_v(m)))
        dots = torch.einsum("bhid,bhjd->bhij", q, k) * self.scale
        attn = dots.softmax(dim=-1)
        return self.to_out(_merge(torch.einsum("bhij,bhjd->bhid", attn, v)))


class Attention(nn.Module):  # L117-151
    def __init__(self, dim, heads=8, dim_head=64):
        super().__init__()
        inner_dim = dim_head * heads
        self.heads = heads
        self.scale = dim**-0.5
        self.to_qkv = nn.Linear(dim, inner_dim * 3, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner_dim, dim), nn.Dropout(0))

    def forward(self, x):
        q, k, v = (_heads(t, self.heads) for t in self.to_qkv(x).chunk(3, dim=-1))
        dots = torch.einsum("bhid,bhjd->bhij", q, k) * self.scale
        attn = dots.softmax(dim=-1)
        return self.to_out(_merge(torch.einsum("bhij,bhjd->bhid", attn, v)))


class Transformer(nn.Module):  # L154-167
    def __init__(self, dim, depth, heads, dim_head, mlp_dim):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.ModuleList(
                [
                    Residual(PreNorm(dim, Attention(dim, heads=heads, dim_head=dim_head))),
                    Residual(PreNorm(dim, FeedForward(dim, mlp_dim))),
                ]
            )
            for _ in range(depth)
        )

    def forward(self, x):
        for attn, ff in self.layers:
            x = ff(attn(x))
        return x


class TransformerDecoder(nn.Module):  # L170-186
    def __init__(self, dim, depth, heads, dim_head, mlp_dim):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.ModuleList(
                [
                    Residual2(PreNorm2(dim, Cross_Attention(dim, heads=heads, dim_head=dim_head))),
                    Residual(PreNorm(dim, FeedForward(dim, mlp_dim))),
                ]
            )
            for _ in range(depth)
        )

    def forward(self, x, m):
        for attn, ff in self.layers:
            x = ff(attn(x, m))
        return x


class BASE_Transformer(nn.Module):  # noqa: N801 - networks.py L149-230 (ResNet) + L233-365, stages 4, token_len 4
    def __init__(self, decoder_dim_head: int):
        super().__init__()
        self.resnet = UpstreamResNet18()
        self.upsamplex2 = nn.Upsample(scale_factor=2)
        self.upsamplex4 = nn.Upsample(scale_factor=4, mode="bilinear")
        self.classifier = TwoLayerConv2d(in_channels=32, out_channels=2)
        self.conv_pred = nn.Conv2d(256, 32, kernel_size=3, padding=1)
        self.token_len = 4
        self.conv_a = nn.Conv2d(32, self.token_len, kernel_size=1, padding=0, bias=False)
        self.pos_embedding = nn.Parameter(torch.randn(1, self.token_len * 2, 32))
        self.transformer = Transformer(dim=32, depth=1, heads=8, dim_head=64, mlp_dim=64)
        self.transformer_decoder = TransformerDecoder(dim=32, depth=8, heads=8, dim_head=decoder_dim_head, mlp_dim=64)

    def forward_single(self, x):  # L206-230
        x = self.resnet.maxpool(self.resnet.relu(self.resnet.bn1(self.resnet.conv1(x))))
        x_8 = self.resnet.layer3(self.resnet.layer2(self.resnet.layer1(x)))
        return self.conv_pred(self.upsamplex2(x_8))

    def _forward_semantic_tokens(self, x):  # L285-293
        b, c, h, w = x.shape
        spatial_attention = self.conv_a(x).view([b, self.token_len, -1]).contiguous()
        spatial_attention = torch.softmax(spatial_attention, dim=-1)
        x = x.view([b, c, -1]).contiguous()
        return torch.einsum("bln,bcn->blc", spatial_attention, x)

    def _forward_transformer_decoder(self, x, m):  # L312-321, with_decoder_pos None
        b, c, h, w = x.shape
        x = x.reshape(b, c, h * w).permute(0, 2, 1)  # 'b c h w -> b (h w) c'
        x = self.transformer_decoder(x, m)
        return x.permute(0, 2, 1).reshape(b, c, h, w)  # 'b (h w) c -> b c h w'

    def forward(self, x1, x2):  # L332-365
        x1, x2 = self.forward_single(x1), self.forward_single(x2)
        token1, token2 = self._forward_semantic_tokens(x1), self._forward_semantic_tokens(x2)
        tokens_ = torch.cat([token1, token2], dim=1)
        tokens_ += self.pos_embedding  # L308, in place as upstream
        token1, token2 = self.transformer(tokens_).chunk(2, dim=1)
        x1 = self._forward_transformer_decoder(x1, token1)
        x2 = self._forward_transformer_decoder(x2, token2)
        x = self.upsamplex4(torch.abs(x1 - x2))
        return self.classifier(x)


def random_upstream(seed: int, decoder_dim_head: int = 8) -> BASE_Transformer:
    """Upstream's network with random weights and non-trivial BatchNorm statistics (eval mode uses them)."""
    torch.manual_seed(seed)
    model = BASE_Transformer(decoder_dim_head).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.normal_(0.0, 0.2)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
            if isinstance(module, (nn.BatchNorm2d, nn.Linear, nn.Conv2d)) and module.bias is not None:
                module.bias.uniform_(-0.2, 0.2)
    return model


def ours_from(upstream: nn.Module) -> BitNet:
    state = upstream.state_dict()
    ours = BitNet(state["transformer_decoder.layers.0.0.fn.fn.to_q.weight"].shape[0] // 8).eval()
    load_strict(ours, remap_keys(state, upstream_key_to_ours), source="upstream state dict")
    return ours


def _pair(seed: int, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    return tuple(torch.from_numpy(rng.uniform(-1, 1, (2, 3, height, width)).astype(np.float32)) for _ in range(2))


@pytest.mark.parametrize("decoder_dim_head", [8, 64])
def test_same_random_weights_give_upstreams_logits_in_fp32(decoder_dim_head):
    upstream = random_upstream(46, decoder_dim_head)
    ours = ours_from(upstream)
    for seed, (h, w) in enumerate(((64, 64), (48, 80))):
        before, after = _pair(seed, h, w)
        with torch.no_grad():
            expected = upstream(before.clone(), after.clone())
            got = ours(before, after)
        assert got.shape == expected.shape == (2, 2, h, w)
        assert (got - expected).abs().max().item() <= FP32_TOLERANCE
        assert expected.std().item() > 0.05  # the logits vary: the comparison sees the weights
        assert (got.argmax(1) == expected.argmax(1)).all()


def test_the_comparison_sees_a_changed_decoder_layer():
    """The comparison can fail: a larger weight in the last decoder layer moves the logits past the tolerance."""
    upstream = random_upstream(46)
    ours = ours_from(upstream)
    before, after = _pair(0, 64, 64)
    with torch.no_grad():
        expected = upstream(before.clone(), after.clone())
        ours.decoder[7].attention.v.weight.mul_(1.5)
        moved = ours(before, after)
    assert (moved - expected).abs().max().item() > 100 * FP32_TOLERANCE


def test_detect_stitches_upstreams_argmax_of_its_256_crops():
    """LEVIR-CD's evaluation runs on 256 x 256 crops of the 1024 tiles; `detect` stitches exactly those."""
    upstream = random_upstream(7)
    rng = np.random.default_rng(3)
    images = [Image.fromarray(rng.integers(0, 256, (256, 512, 3), dtype=np.uint8)) for _ in range(2)]
    a, b = (torch.from_numpy(normalise(im))[None] for im in images)
    crops = [(a[..., :, x : x + CROP], b[..., :, x : x + CROP]) for x in (0, CROP)]
    with torch.no_grad():
        first = upstream(crops[0][0].clone(), crops[0][1].clone())[0]
        upstream.classifier[3].bias[1] -= (first[1] - first[0]).median()  # about half the pixels changed
        margin = torch.cat([upstream(x1.clone(), x2.clone())[0] for x1, x2 in crops], dim=2)
    margin = (margin[1] - margin[0]).numpy()
    changed = BitCd(ours_from(upstream), torch.device("cpu")).detect(*images)
    assert changed.shape == (256, 512) and changed.dtype == bool
    clear = np.abs(margin) > FP32_TOLERANCE  # a near-tie may fall either way within the fp32 tolerance
    assert clear.mean() > 0.5
    assert np.array_equal(changed[clear], margin[clear] > 0)
    assert 0.2 < changed.mean() < 0.8


def test_preprocessing_is_upstreams_to_tensor_and_normalize():
    """`normalise` = torchvision `to_tensor` then `normalize(mean=0.5, std=0.5)` (data_utils.py L120-127)."""
    tf = pytest.importorskip("torchvision.transforms.functional")
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8))
    expected = tf.normalize(tf.to_tensor(image), mean=[0.5] * 3, std=[0.5] * 3).numpy()
    assert np.abs(normalise(image) - expected).max() < 1e-6


def test_upstream_state_dict_keys_map_onto_ours_exactly():
    for head in (8, 64):
        state = BASE_Transformer(head).state_dict()
        mapped = {upstream_key_to_ours(k) for k in state} - {None}
        assert mapped == set(BitNet(head).state_dict())
        dropped = sorted(k for k in state if upstream_key_to_ours(k) is None)
        assert dropped and all(k.startswith(("resnet.layer4.", "resnet.fc.")) for k in dropped)
    assert upstream_key_to_ours("transformer_decoder.layers.3.0.fn.fn.to_q.weight") == "decoder.3.attention.q.weight"
    assert upstream_key_to_ours("transformer.layers.0.1.fn.fn.net.3.bias") == "encoder.mlp.2.bias"
    assert upstream_key_to_ours("classifier.1.running_var") == "head.1.running_var"


def save_upstream_checkpoint(path: Path, upstream: nn.Module) -> Path:
    """What upstream's trainer writes (`models/trainer.py` L141-149): the network's state dict beside numpy float64
    bookkeeping (`best_val_acc` is `cm2score`'s mF1) and the optimizer's state."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "epoch_id": 199,
            "best_val_acc": np.float64(0.9),
            "best_epoch_id": 187,
            "model_G_state_dict": upstream.state_dict(),
            "optimizer_G_state_dict": {"state": {}, "param_groups": [{"lr": 0.01, "momentum": 0.9, "params": [0]}]},
        },
        path,
    )
    return path


def _pair_pixels() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    before = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
    after = before.copy()
    after[40:120, 60:200] = 255
    return before, after


def balanced(upstream: BASE_Transformer, before: np.ndarray, after: np.ndarray) -> BASE_Transformer:
    """Move the "changed" bias so that about half of this pair's pixels change (a random net says all or none)."""
    a, b = (torch.from_numpy(normalise(Image.fromarray(x)))[None] for x in (before, after))
    with torch.no_grad():
        logits = upstream(a, b)[0]
        upstream.classifier[3].bias[1] -= (logits[1] - logits[0]).median()
    return upstream


@pytest.fixture(scope="module")
def upstream_weights(tmp_path_factory) -> tuple[Path, BASE_Transformer]:
    """$GEOPILOT_WEIGHTS_DIR-style folder holding a random upstream network as bit_cd/BIT_LEVIR/best_ckpt.pt."""
    upstream = balanced(random_upstream(11), *_pair_pixels())
    root = tmp_path_factory.mktemp("weights")
    save_upstream_checkpoint(root / "bit_cd" / BIT_CD_CHECKPOINT, upstream)
    return root, upstream


def test_upstreams_training_checkpoint_loads_strictly(upstream_weights):
    root, upstream = upstream_weights
    detector = BitCd.from_weights(root / "bit_cd" / BIT_CD_CHECKPOINT, device="cpu")
    assert sum(p.numel() for p in detector.model.parameters()) == 3_037_026
    loaded = detector.model.state_dict()
    assert torch.equal(
        loaded["decoder.5.attention.k.weight"], upstream.transformer_decoder.layers[5][0].fn.fn.to_k.weight
    )
    assert torch.equal(
        loaded["trunk.layer3.0.downsample.1.running_var"], upstream.resnet.layer3[0].downsample[1].running_var
    )


def test_a_checkpoint_with_an_extra_key_or_pickled_code_is_refused(tmp_path):
    upstream = random_upstream(0)
    state = upstream.state_dict()
    state["transformer.layers.1.0.fn.norm.weight"] = torch.ones(32)
    torch.save({"model_G_state_dict": state}, tmp_path / "extra.pt")
    with pytest.raises(WeightsError, match=r"unexpected keys \(1\): transformer\.layers\.1\.0\.fn\.norm\.weight"):
        BitCd.from_weights(tmp_path / "extra.pt")
    torch.save({"model_G_state_dict": upstream.state_dict(), "hook": print}, tmp_path / "code.pt")
    with pytest.raises(WeightsError, match="not a readable BIT checkpoint"):
        BitCd.from_weights(tmp_path / "code.pt")


def test_released_checkpoint_loads_and_finds_change():
    """The real BIT_LEVIR (skips without it): it loads strictly and marks a pasted block as changed, not noise."""
    detector = BitCd.from_weights(bit_cd_checkpoint(), device="cpu")
    rng = np.random.default_rng(0)
    before = np.clip(rng.normal(110, 8, (256, 256, 3)), 0, 255).astype(np.uint8)
    after = before.copy()
    after[96:160, 96:160] = (200, 60, 40)
    changed = detector.detect(Image.fromarray(before), Image.fromarray(after))
    assert changed[112:144, 112:144].mean() > 0.5 and changed.mean() < 0.2


def _pair_files(folder: Path) -> tuple[Path, Path]:
    paths = folder / "before.png", folder / "after.png"
    for path, pixels in zip(paths, _pair_pixels(), strict=True):
        Image.fromarray(pixels).save(path)
    return paths


def test_cli_detect_changes_runs_the_checkpoint_on_two_images(tmp_path, upstream_weights, monkeypatch, capsys):
    root, upstream = upstream_weights
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(root))
    before, after = _pair_files(tmp_path)
    out = tmp_path / "out"
    args = ["tools", "run", "detect_changes", "--image", str(before), "--image", str(after), "--out", str(out)]
    assert main([*args, "device=cpu"]) == 0, capsys.readouterr().err
    report = json.loads((out / "output.json").read_text())
    output = ToolOutput.model_validate(report["output"])
    detector = BitCd(ours_from(upstream), torch.device("cpu"))
    expected = detector.detect(Image.open(before), Image.open(after))
    (segment,) = output.segments
    assert np.array_equal(decode_mask(segment.mask).astype(bool), expected) and 0.2 < expected.mean() < 0.8
    assert output.data == {
        "changed_fraction": round(float(expected.mean()), 6),
        "changed_objects": len(output.detections),
    }
    assert all(d.label == "building" and d.mask is not None for d in output.detections)
    image_artifact, mask_artifact = output.artifacts
    assert (image_artifact.kind, mask_artifact.kind) == ("image", "mask")
    assert np.array_equal(np.asarray(Image.open(mask_artifact.path)) > 0, expected)
    regions = np.asarray(Image.open(image_artifact.path))
    assert np.array_equal(regions[~expected], np.zeros_like(regions[~expected]))
    assert np.array_equal(regions[expected], np.asarray(Image.open(after).convert("RGB"))[expected])


def test_cli_one_image_or_two_sizes_or_an_unknown_class_is_one_line(tmp_path, upstream_weights, monkeypatch, capsys):
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(upstream_weights[0]))
    before, after = _pair_files(tmp_path)
    assert main(["tools", "run", "detect_changes", "--image", str(before), "device=cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("this chat has 1: image 2 is missing") and "\n" not in err
    small = tmp_path / "small.png"
    Image.new("RGB", (100, 80)).save(small)
    assert main(["tools", "run", "detect_changes", "--image", str(before), "--image", str(small), "device=cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "image 2 is 100x80 px but image 1 is 256x256" in err and "\n" not in err
    params = ["--params", '{"classes": ["road"]}']
    assert main(["tools", "run", "detect_changes", "--image", str(before), "--image", str(after), *params]) == 1
    err = capsys.readouterr().err.strip()
    assert "detects building change only; it cannot look for ['road']" in err and "\n" not in err


def test_eval_change_masks_scores_the_checkpoint_on_a_levir_cd_split(tmp_path, upstream_weights, monkeypatch, capsys):
    from geopilot.data_gen.synthetic.change import change_pairs, write_levir_cd
    from geopilot.eval.task_metrics.change import ChangeConfusion

    root, upstream = upstream_weights
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(root))
    pairs = change_pairs(seed=4, count=2)
    write_levir_cd(tmp_path / "LEVIR-CD", pairs)
    args = ["eval", "change-masks", "--data", str(tmp_path / "LEVIR-CD"), "--split", "train", "--out", str(tmp_path)]
    assert main([*args, "device=cpu"]) == 0, capsys.readouterr().err
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    detector, expected = BitCd(ours_from(upstream), torch.device("cpu")), ChangeConfusion()
    for pair in pairs:
        expected.add(detector.detect(Image.fromarray(pair.before), Image.fromarray(pair.after)), pair.label)
    assert {k: metrics[k] for k in ("precision", "recall", "f1", "iou", "oa", "pixels")} == expected.scores()
    assert metrics["pairs"] == 2 and metrics["failed"] == 0 and "f1" in capsys.readouterr().out
