"""Training data: JSONL samples -> rendered ids + labels (cached with `datasets`) -> the stage's mixture.

    load + render each file (cached)  ->  drop skips (too long, bad image, duplicate id)  ->  select the stage

The cache key is the data file's sha256 + the tokenizer's fingerprint + the renderers' source hash + what the
image-token counts depend on (`ImageTokens.key`) + max_length + plans_only_share, so changing any of them re-renders and nothing stale is reused. Every skip is counted
by cause and reported; too many skips, or none left, is an error rather than a silently smaller run.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from geopilot.boxes import BoxCodec
from geopilot.errors import GeoPilotInputError, ImageInputError, SampleError
from geopilot.families import family_of_processor, llava, qwen2_5_vl
from geopilot.fileio import fingerprint
from geopilot.image import check_same_size, load_image
from geopilot.sample import LoadReport, load_samples
from geopilot.training.config import DataConfig
from geopilot.training.mixture import Mixture, select_stage

COLUMNS = ("id", "images", "modality", "source", "ability", "input_ids", "labels", "length", "skip")
MAX_REPORTED_EXAMPLES = 20


class TrainingDataError(GeoPilotInputError):
    """The training set cannot be built: no samples left, or more skipped than allowed."""


@dataclass(frozen=True)
class ImageTokens:
    """How many image tokens a sample's image takes under the model's family (LLaVA: one fixed count; Qwen2.5-VL:
    by the image's size), the family whose renderer writes them, what the counts depend on (`key`), and how the
    renderer writes the image's boxes (`boxes`: the family's `BoxCodec` for the image; None for LLaVA)."""

    family: ModuleType
    count: Callable[[str], int]  # image path -> image tokens
    key: str
    boxes: Callable[[str], BoxCodec | None] = lambda path: None  # image path -> its box codec

    @classmethod
    def of(cls, processor, max_pixels: int) -> ImageTokens:
        family = family_of_processor(processor)
        return cls(
            family,
            # samples share images (one scene, many questions): each image is opened once
            functools.cache(lambda path: family.sample_image_tokens(processor, path, max_pixels)),
            family.image_tokens_key(processor),
            functools.cache(lambda path: family.sample_boxes(processor, path, max_pixels)),
        )

    @classmethod
    def fixed(cls, count: int) -> ImageTokens:
        """What a plain number of image tokens means: LLaVA's renderer, that count for every image."""
        return cls(llava, lambda path: count, str(count))


def _image_tokens(value: int | ImageTokens) -> ImageTokens:
    return ImageTokens.fixed(value) if isinstance(value, int) else value


@dataclass
class TrainingData:
    dataset: object  # datasets.Dataset with COLUMNS (minus "skip"), in file/line order of the selection
    mixture: Mixture
    loaded: int  # valid samples read from the files
    skipped: Counter = field(default_factory=Counter)  # cause -> count
    skip_examples: list[str] = field(default_factory=list)

    def counts(self) -> dict:
        """Samples trained on, per source and per modality (written into checkpoints and the export)."""
        by_source = Counter(self.dataset["source"])
        by_modality = Counter(self.dataset["modality"])
        return {
            "total": len(self.dataset),
            "by_source": dict(sorted(by_source.items())),
            "by_modality": dict(by_modality),
        }

    def report(self) -> dict:
        return {
            "loaded": self.loaded,
            "skipped": dict(self.skipped),
            "skip_examples": self.skip_examples,
            "mixture": self.mixture.summary(),
            "trained": self.counts(),
        }


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tokenizer_fingerprint(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    specials = json.dumps([str(tokenizer.special_tokens_map), len(tokenizer)])
    return hashlib.sha256((text + specials).encode()).hexdigest()[:16]


def render_version() -> str:
    """Hash of the code that turns a sample into tokens: a change there invalidates every cache entry."""
    from geopilot import boxes, render, sample, tokenizer, tool_output, wire

    modules = (render, wire, boxes, tokenizer, tool_output, sample, llava, qwen2_5_vl)
    source = "".join(inspect.getsource(module) for module in modules)
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def chosen_share(sample_id: str) -> float:
    """A sample's fixed place in [0, 1) (its id's hash): a share of the samples is the ids below it, on any run."""
    return int(hashlib.sha256(sample_id.encode()).hexdigest()[:8], 16) / 16**8


def through_last_plan(sample):
    """The sample up to its last think turn that calls tools (a tool-free sample as it is): no tool output, no
    answer, the plan trained as in the whole trace."""
    plans = [i for i, m in enumerate(sample.messages) if m.role == "assistant" and m.actions]
    return sample.model_copy(update={"messages": sample.messages[: plans[-1] + 1]}) if plans else sample


def _render_file(path: Path, tokenizer, image_tokens: ImageTokens, cfg: DataConfig) -> tuple[dict, dict]:
    """One JSONL file -> columns (every valid sample, with a `skip` reason for the unrenderable) + load report."""
    report = LoadReport()
    columns: dict[str, list] = {name: [] for name in COLUMNS}
    for sample in load_samples(path, on_error=cfg.on_bad_line, report=report):
        if chosen_share(sample.id) < cfg.plans_only_share:
            sample = through_last_plan(sample)
        image_paths = sample.image_paths(path.parent)
        first = str(image_paths[0]) if image_paths else None  # a sample's images share one size: the first's
        try:  # counts and box codec stand for each image
            count = image_tokens.count(first) if first else 0
            boxes = image_tokens.boxes(first) if first else None
        except ImageInputError:  # an unreadable image: the image check drops the sample (data.check_images)
            count, boxes = 0, None
        try:
            rendered = image_tokens.family.render_sample(sample, tokenizer, count, cfg.max_length, boxes)
            ids, labels, skip = rendered.input_ids, rendered.labels, ""
        except SampleError as err:
            ids, labels, skip = [], [], f"too_long: {err}"
        row = {
            "id": sample.id,
            "images": [str(image_path.resolve()) for image_path in image_paths],  # in order
            "modality": sample.modality,
            "source": sample.source,
            "ability": sample.ability,
            "input_ids": ids,
            "labels": labels,
            "length": len(ids),
            "skip": skip,
        }
        for name in COLUMNS:
            columns[name].append(row[name])
    return columns, {
        "loaded": report.loaded,
        "bad_lines": report.skipped,
        "errors": report.errors[:MAX_REPORTED_EXAMPLES],
    }


def tokenised_file(path: str | Path, tokenizer, num_image_tokens: int | ImageTokens, cfg: DataConfig, cache_root: Path):
    """The cached rendering of one file: (datasets.Dataset, load report). Written aside, then renamed.
    `num_image_tokens`: a number (LLaVA, every image) or the model's `ImageTokens.of(processor, max_pixels)`."""
    import datasets

    image_tokens = _image_tokens(num_image_tokens)
    path = Path(path)
    if not path.is_file():
        raise TrainingDataError(f"data file not found: {path}")
    key_parts = [
        _sha256_file(path),
        tokenizer_fingerprint(tokenizer),
        render_version(),
        image_tokens.key,
        str(cfg.max_length),
        str(cfg.plans_only_share),
        cfg.on_bad_line,
        str(path.parent.resolve()),
    ]
    key = fingerprint(key_parts)
    entry = cache_root / f"{path.stem}-{key}"
    if (entry / "load_report.json").is_file():
        return datasets.load_from_disk(str(entry / "dataset")), json.loads((entry / "load_report.json").read_text())
    columns, load_report = _render_file(path, tokenizer, image_tokens, cfg)
    features = datasets.Features(
        {
            "id": datasets.Value("string"),
            "images": datasets.Sequence(datasets.Value("string")),
            "modality": datasets.Value("string"),
            "source": datasets.Value("string"),
            "ability": datasets.Value("string"),
            "input_ids": datasets.Sequence(datasets.Value("int32")),
            "labels": datasets.Sequence(datasets.Value("int32")),
            "length": datasets.Value("int32"),
            "skip": datasets.Value("string"),
        }
    )
    dataset = datasets.Dataset.from_dict(columns, features=features)
    if len(dataset) == 0:  # no valid sample in this file: nothing to cache (`datasets` cannot reload zero shards)
        return dataset, load_report
    cache_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=cache_root))
    dataset.save_to_disk(str(staging / "dataset"))
    (staging / "load_report.json").write_text(json.dumps(load_report))  # written last: marks the entry complete
    try:
        os.replace(staging, entry)
    except OSError:  # another process published the same entry first; it is identical
        shutil.rmtree(staging, ignore_errors=True)
    return datasets.load_from_disk(str(entry / "dataset")), load_report


def _image_problem(images: list[str], max_pixels: int) -> str | None:
    """Why a sample's images cannot be trained on (unreadable, or several of different sizes), else None."""
    try:
        loaded = [load_image(image, max_pixels=max_pixels) for image in images]
        if len(loaded) > 1:
            check_same_size(loaded)
    except ImageInputError as err:
        return str(err)
    return None


def build_training_data(
    cfg: DataConfig, stage: int, tokenizer, num_image_tokens: int | ImageTokens, cache_root: Path
) -> TrainingData:
    import datasets

    parts, loaded, skipped, examples = [], 0, Counter(), []
    for file in cfg.files:
        dataset, load_report = tokenised_file(file, tokenizer, num_image_tokens, cfg, cache_root)
        parts.append(dataset)
        loaded += load_report["loaded"]
        if load_report["bad_lines"]:
            skipped["bad_line"] += load_report["bad_lines"]
            examples += [f"{file}: {e}" for e in load_report["errors"]]
    if loaded == 0:  # empty, blank-only or all-bad files: say so, before `datasets` fails on zero rows
        raise TrainingDataError(
            f"no training samples in {', '.join(cfg.files)}: the files hold no valid sample "
            f"({skipped['bad_line']} bad line(s){'; first: ' + examples[0] if examples else ''})"
        )
    rows = datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]

    keep, seen = [], set()
    for index, (sample_id, images, skip) in enumerate(zip(rows["id"], rows["images"], rows["skip"], strict=True)):
        problem = None
        if sample_id in seen:
            problem = ("duplicate_id", f"sample {sample_id!r}: duplicate id, the first occurrence is kept")
        elif skip:
            problem = ("too_long", skip.removeprefix("too_long: "))
        elif cfg.check_images and (reason := _image_problem(images, cfg.max_pixels)):
            problem = ("image", f"sample {sample_id!r}: {reason}")
        seen.add(sample_id)
        if problem:
            skipped[problem[0]] += 1
            examples.append(problem[1])
        else:
            keep.append(index)
    usable = rows.select(keep)
    mixture = select_stage(usable["modality"], stage, cfg.replay_alpha, cfg.mixture_seed)
    data = TrainingData(
        usable.select(mixture.indices).remove_columns("skip"),
        mixture,
        loaded,
        skipped,
        examples[:MAX_REPORTED_EXAMPLES],
    )
    _check_enough(data, cfg, stage)
    return data


def _check_enough(data: TrainingData, cfg: DataConfig, stage: int) -> None:
    total_seen = data.loaded + data.skipped["bad_line"]
    fraction = sum(data.skipped.values()) / max(1, total_seen)
    if fraction > cfg.max_skip_fraction:
        raise TrainingDataError(
            f"{sum(data.skipped.values())} of {total_seen} samples skipped ({dict(data.skipped)}), more than "
            f"data.max_skip_fraction={cfg.max_skip_fraction}; first: {data.skip_examples[0] if data.skip_examples else '-'}"
        )
    if len(data.dataset) == 0:
        wanted = "optical samples" if stage == 1 else "SAR samples or optical replay (alpha > 0)"
        raise TrainingDataError(
            f"no training samples left for stage {stage} after filtering (stage {stage} needs {wanted}); "
            f"loaded {data.loaded}, skipped {dict(data.skipped)}, available {data.mixture.available}"
        )
