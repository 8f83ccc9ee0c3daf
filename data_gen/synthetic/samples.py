"""A small synthetic training set in the real on-disk format: JSONL samples + PNG images, optical and SAR.

Tool-free answers, single tool calls with 1-12 detections, and two-round dialogues, so sample lengths vary the way
tool traces do. For smoke runs, tests and `benchmarks/train_throughput.py`; no content is meaningful.

    python -m geopilot.data_gen.synthetic.samples --out runs/tiny/data --optical 48 --sar 24
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np
from PIL import Image

from geopilot.sample import IMAGE_PLACEHOLDER, Action, AssistantMessage, Sample, ToolMessage, UserMessage, write_samples
from geopilot.tool_output import Detection, ToolOutput

OPTICAL = {
    "sources": ["DOTA", "DIOR", "RSVQA-HR"],
    "tool": "detect_objects",
    "labels": ["plane", "ship", "vehicle", "tank"],
}
SAR = {"sources": ["SARDet-100K", "SSDD"], "tool": "sar_detect_all", "labels": ["ship", "aircraft", "bridge", "tank"]}


def _image(path: Path, modality: str, rng: random.Random, size: int) -> None:
    generator = np.random.default_rng(rng.randrange(2**32))
    if modality == "sar":  # one band, like a SAR amplitude chip
        Image.fromarray(generator.integers(0, 255, (size, size), dtype=np.uint8), "L").save(path)
    else:
        Image.fromarray(generator.integers(0, 255, (size, size, 3), dtype=np.uint8), "RGB").save(path)


def _detections(rng: random.Random, labels: list[str], count: int) -> list[Detection]:
    out = []
    for _ in range(count):
        x, y = rng.uniform(0, 0.8), rng.uniform(0, 0.8)
        box = (round(x, 3), round(y, 3), round(x + rng.uniform(0.05, 0.2), 3), round(y + rng.uniform(0.05, 0.2), 3))
        out.append(Detection(label=rng.choice(labels), box=box, score=round(rng.uniform(0.3, 1.0), 2)))
    return out


def make_sample(index: int, modality: str, image: str, rng: random.Random) -> Sample:
    spec = OPTICAL if modality == "optical" else SAR
    label = rng.choice(spec["labels"])
    question = UserMessage(content=f"{IMAGE_PLACEHOLDER}\nHow many {label}s are in the image?")
    kind = rng.choice(["direct", "tool", "tool", "two_rounds"])
    if kind == "direct":
        messages = [
            question,
            AssistantMessage(reasoning="I can answer directly.", value=f"There are {rng.randint(0, 9)}."),
        ]
    else:
        found = _detections(rng, spec["labels"], rng.randint(1, 12))
        params = {"categories": [label]} if spec["tool"] == "detect_objects" else {}
        messages = [
            question,
            AssistantMessage(
                reasoning=f"I will use {spec['tool']} to count.", actions=[Action(tool=spec["tool"], params=params)]
            ),
            ToolMessage(name=spec["tool"], content=ToolOutput(detections=found)),
            AssistantMessage(
                reasoning="Counting the boxes.", value=f"There are {sum(d.label == label for d in found)} {label}s."
            ),
        ]
        if kind == "two_rounds":
            messages += [
                UserMessage(content="Where is the largest one?"),
                AssistantMessage(reasoning="From the boxes.", value="Near the top left of the image."),
            ]
    source = rng.choice(spec["sources"])
    return Sample(
        id=f"{source.lower()}/{modality}/{index:05d}",
        image=image,
        modality=modality,
        source=source,
        ability="counting",
        messages=messages,
    )


def write_demo_dataset(
    out_dir: str | Path,
    optical: int = 48,
    sar: int = 24,
    seed: int = 0,
    image_size: int = 32,
    file_name: str = "train.jsonl",
) -> Path:
    out_dir = Path(out_dir)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    samples = []
    for index, modality in enumerate(["optical"] * optical + ["sar"] * sar):
        image = f"images/{modality}_{index:05d}.png"
        _image(out_dir / image, modality, rng, image_size)
        samples.append(make_sample(index, modality, image, rng))
    path = out_dir / file_name
    write_samples(samples, path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--optical", type=int, default=48)
    parser.add_argument("--sar", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write_demo_dataset(args.out, args.optical, args.sar, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
