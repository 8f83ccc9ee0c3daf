"""Each tool backend in its configured precision vs float32, same random weights, same input: what the tool returns.

Used by `benchmarks/gpu_check.py` (section `specialists`); also runs on its own:

    python benchmarks/specialists_check.py            # full-size architectures on CUDA
    python benchmarks/specialists_check.py --tiny     # the tiny architectures on CPU (the dry run)

The comparison is on outputs, not tensors: boxes (max corner difference, normalised), road points (max distance
and whether the graph is the same), masks (fraction of pixels that differ), restored pixels (max difference on
0..255). Tolerances are the ones docs/tools.md states for each backend.
"""

from __future__ import annotations

import argparse
import copy
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

# Largest accepted difference per output kind between the reduced precision and float32 (docs/tools.md).
TOLERANCES = {"boxes": 0.01, "points": 2.0, "mask": 0.01, "pixels": 2.0}


@dataclass
class Backend:
    name: str
    kind: str  # which TOLERANCES entry applies
    build: Callable[[bool], object]  # full_size -> a tool object on CPU in float32
    run: Callable[[object, Image.Image], object]  # tool, image -> output
    image_size: int


def _scene(size: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(
        rng.integers(0, 255, (size, size * 3 // 2, 3), dtype=np.uint8)
    )  # not square: padding paths run


def _denodet(full: bool):
    from geopilot.tools.adapters import DenoDetOptions
    from geopilot.tools.denodet import DenoDet, DenoDetConfig, DenoDetNet

    if not full:
        return DenoDet.tiny(score_thr=0.0)
    torch.manual_seed(0)
    return DenoDet(DenoDetNet(DenoDetConfig()).eval(), DenoDetOptions(score_thr=0.0), torch.device("cpu"))


def _sam_road(full: bool):
    from geopilot.tools.adapters import SamRoadOptions
    from geopilot.tools.sam_road import SamRoad, SamRoadNet, _preset, vit_b_config

    if not full:
        return SamRoad.tiny()
    torch.manual_seed(0)
    preset = _preset("cityscale")
    return SamRoad(SamRoadNet(vit_b_config(preset.patch_size)).eval(), preset, SamRoadOptions(), torch.device("cpu"))


def _spa_gan(full: bool):
    from geopilot.tools.spa_gan import SpaGan

    return SpaGan.tiny(seed=0)  # the real generator is small: the same network at either size


def _lae_dino(full: bool):
    from geopilot.tools.adapters import LaeDinoOptions
    from geopilot.tools.lae_dino import LaeDino, LaeDinoForObjectDetection, swin_t_config, tiny_tokenizer

    if not full:
        return LaeDino.tiny()
    torch.manual_seed(0)
    model = LaeDinoForObjectDetection(swin_t_config()).eval()  # the in-memory BERT vocabulary fits its embedding
    options = LaeDinoOptions(box_threshold=0.0, text_threshold=0.0)
    return LaeDino(model, tiny_tokenizer(), options, torch.device("cpu"))


def _segearth_ov(full: bool):
    import open_clip

    from geopilot.tools.segearth_ov import UPSAMPLERS, SegEarthOptions, SegEarthOV

    if not full:
        return SegEarthOV.tiny()
    torch.manual_seed(0)
    opts = SegEarthOptions()
    clip = open_clip.create_model(opts.model_name, pretrained=None, force_quick_gelu=opts.quick_gelu).eval()
    upsampler = None if opts.upsampler == "bilinear" else UPSAMPLERS[opts.upsampler](clip.visual.output_dim).eval()
    tokenizer = open_clip.get_tokenizer(opts.model_name)
    return SegEarthOV(clip, tokenizer, upsampler, opts, torch.device("cpu"))


def _remotesam(full: bool):
    from geopilot.tools.lae_dino import tiny_tokenizer
    from geopilot.tools.remotesam import ARCHITECTURES, RemoteSam, RemoteSamNet

    if not full:
        return RemoteSam.tiny()
    torch.manual_seed(0)
    tokenizer = tiny_tokenizer()
    net = RemoteSamNet(ARCHITECTURES["swin-b"](len(tokenizer.get_vocab()))).eval()
    return RemoteSam(net, tokenizer, torch.device("cpu"))


def _boxes(detections) -> np.ndarray:
    return np.array([d.box for d in detections], dtype=np.float64).reshape(-1, 4)


def _points(graph) -> np.ndarray:
    return np.array([(p.x, p.y) if hasattr(p, "x") else tuple(p) for p in graph.nodes], dtype=np.float64).reshape(-1, 2)


def _label_map(segments, size: tuple[int, int]) -> np.ndarray:
    """Per-pixel class index (0 = none) from a list of SegmentClass masks."""
    labels = np.zeros(size[::-1], dtype=np.float64)
    for index, segment in enumerate(segments, 1):
        labels[np.asarray(segment.mask, dtype=bool)] = index
    return labels


BACKENDS = [
    Backend("lae_dino", "boxes", _lae_dino, lambda tool, image: _boxes(tool.detect(image, ["plane", "ship"])), 800),
    Backend(
        "segearth_ov",
        "mask",
        _segearth_ov,
        lambda tool, image: _label_map(tool.segment(image, ["building", "road", "tree"]), image.size),
        448,
    ),
    Backend(
        "remotesam", "boxes", _remotesam, lambda tool, image: _boxes(tool.ground(image, "the ship on the left")), 896
    ),
    Backend("denodet", "boxes", _denodet, lambda tool, image: _boxes(tool.detect(image)), 512),
    Backend("sam_road", "points", _sam_road, lambda tool, image: _points(tool.extract(image)), 1024),
    Backend(
        "spa_gan", "pixels", _spa_gan, lambda tool, image: np.asarray(tool.restore(image).restored, np.float64), 512
    ),
]


def moved(tool, device: torch.device, dtype: torch.dtype, backend: str | None = None):
    """A copy of `tool` whose networks live on `device` in `dtype`, as the backend's loader places them: the
    backend's fp32 parts (`geopilot.tools.precision`) stay float32."""
    from geopilot.tools.precision import PRECISIONS

    parts = PRECISIONS[backend].fp32_parts if backend else ()
    other = copy.deepcopy(tool)
    for name, value in vars(other).items():
        if isinstance(value, torch.nn.Module):
            value = value.to(device, dtype)
            for part in parts:
                try:
                    value.get_submodule(part).float()
                except AttributeError:  # another network of the tool, without that part
                    continue
            setattr(other, name, value)
    other.device = device
    if "dtype" in vars(other):  # backends that cache their dtype (the others read it off their weights)
        other.dtype = dtype
    return other


def difference(kind: str, reference: np.ndarray, reduced: np.ndarray) -> tuple[float, str]:
    if reference.shape != reduced.shape:
        return float("inf"), f"{len(reduced)} vs {len(reference)} outputs"
    if kind == "mask":  # label maps: the fraction of pixels whose class differs
        changed = float((reference != reduced).mean())
        return changed, f"{changed:.2%} of pixels differ"
    if reference.size == 0:
        return 0.0, "no outputs in either"
    largest = float(np.abs(reference - reduced).max())
    return largest, f"max diff {largest:.4g} over {len(reference)}"


def compare_backends(full_size: bool, device: str, precision: str = "float16") -> dict:
    target = torch.device(device)
    dtype = getattr(torch, precision) if target.type == "cuda" else torch.bfloat16
    results = {}
    for backend in BACKENDS:
        tool = backend.build(full_size)
        image = _scene(backend.image_size if full_size else 96)
        reference = backend.run(moved(tool, target, torch.float32), image)
        reduced = backend.run(moved(tool, target, dtype, backend.name), image)
        value, summary = difference(backend.kind, reference, reduced)
        tolerance = TOLERANCES[backend.kind]
        results[backend.name] = {
            "precision": str(dtype).removeprefix("torch."),
            "max_difference": value,
            "summary": summary,
            "tolerance": f"<= {tolerance}",
            "within": value <= tolerance,
        }
    failed = [name for name, r in results.items() if not r["within"]]
    return {"backends": results, "outside_tolerance": failed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny architectures on CPU")
    args = parser.parse_args(argv)
    device = "cpu" if args.tiny else "cuda"
    print(json.dumps(compare_backends(not args.tiny, device), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
