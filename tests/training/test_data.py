"""Bad data becomes counted, reported skips (or a clear error); the tokenisation cache is keyed on its inputs."""

from __future__ import annotations

import json

import pytest

from geopilot.data_gen.synthetic.samples import write_demo_dataset
from geopilot.model import ModelConfig, build_model, num_image_tokens
from geopilot.render import render_sample
from geopilot.sample import load_samples, write_samples
from geopilot.training.config import DataConfig
from geopilot.training.data import TrainingDataError, build_training_data


@pytest.fixture(scope="module")
def processor_and_tokens():
    model, processor = build_model(ModelConfig(init="tiny"))
    return processor, num_image_tokens(model.config)


def build(files, tmp_path, processor_and_tokens, stage=1, **data):
    processor, tokens = processor_and_tokens
    cfg = DataConfig(files=[str(f) for f in files], **data)
    return build_training_data(cfg, stage, processor.tokenizer, tokens, tmp_path / "cache")


def test_missing_image_is_a_counted_skip(tmp_path, processor_and_tokens):
    path = write_demo_dataset(tmp_path / "d", optical=10, sar=0)
    (tmp_path / "d/images/optical_00003.png").unlink()
    data = build([path], tmp_path, processor_and_tokens, max_skip_fraction=0.2)
    assert data.skipped == {"image": 1}
    assert len(data.dataset) == 9 and "optical/00003" not in " ".join(data.dataset["id"])
    assert "image not found" in data.skip_examples[0]


def test_too_long_sample_is_skipped_not_cut(tmp_path, processor_and_tokens):
    processor, tokens = processor_and_tokens
    path = write_demo_dataset(tmp_path / "d", optical=12, sar=0)
    lengths = sorted(len(render_sample(s, processor.tokenizer, tokens).input_ids) for s in load_samples(path))
    limit = lengths[-3]  # the two longest exceed it (if not tied)
    too_long = sum(n > limit for n in lengths)
    data = build([path], tmp_path, processor_and_tokens, max_length=limit, max_skip_fraction=0.5)
    assert data.skipped == {"too_long": too_long} and too_long >= 1
    assert len(data.dataset) == 12 - too_long
    assert max(data.dataset["length"]) <= limit
    assert "truncating would cut" in data.skip_examples[0]


def test_too_many_skips_is_an_error(tmp_path, processor_and_tokens):
    path = write_demo_dataset(tmp_path / "d", optical=10, sar=0)
    for image in list((tmp_path / "d/images").glob("*.png"))[:3]:
        image.write_bytes(b"not a png")
    with pytest.raises(TrainingDataError, match="more than data.max_skip_fraction"):
        build([path], tmp_path, processor_and_tokens)


def test_empty_after_filtering_is_an_error(tmp_path, processor_and_tokens):
    path = write_demo_dataset(tmp_path / "d", optical=0, sar=6)  # stage 1 trains on optical only
    with pytest.raises(TrainingDataError, match="no training samples left for stage 1"):
        build([path], tmp_path, processor_and_tokens)


def test_bad_json_line_is_a_counted_skip_and_duplicates_are_dropped(tmp_path, processor_and_tokens):
    path = write_demo_dataset(tmp_path / "d", optical=10, sar=0)
    samples = list(load_samples(path))
    write_samples(samples + samples[:1], path)
    with path.open("a") as handle:
        handle.write('{"id": "broken", "messages": []}\n')
    data = build([path], tmp_path, processor_and_tokens, max_skip_fraction=0.5)
    assert data.skipped == {"duplicate_id": 1, "bad_line": 1}
    assert len(data.dataset) == 10


def test_cache_is_reused_and_invalidated_by_its_inputs(tmp_path, processor_and_tokens):
    path = write_demo_dataset(tmp_path / "d", optical=6, sar=0)
    build([path], tmp_path, processor_and_tokens)
    entries = sorted(p.name for p in (tmp_path / "cache").iterdir())
    again = build([path], tmp_path, processor_and_tokens)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == entries and len(entries) == 1
    assert len(again.dataset) == 6
    build([path], tmp_path, processor_and_tokens, max_length=4096)  # a different key
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n")  # a different data file
    shorter = build([path], tmp_path, processor_and_tokens)
    assert len(list((tmp_path / "cache").iterdir())) == 3 and len(shorter.dataset) == 5
    assert json.loads((tmp_path / "cache" / entries[0] / "load_report.json").read_text())["loaded"] == 6


def test_a_two_image_sample_keeps_its_images_in_order_and_a_pair_of_two_sizes_is_a_counted_skip(
    tmp_path, processor_and_tokens
):
    from PIL import Image

    from geopilot.tokenizer import IMAGE_TOKEN

    processor, tokens = processor_and_tokens
    folder = tmp_path / "pairs"
    for name, size in (("A/1.png", (32, 32)), ("B/1.png", (32, 32)), ("A/2.png", (32, 32)), ("B/2.png", (20, 32))):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", size, (len(name) * 9, 80, 120)).save(folder / name)
    lines = [
        {
            "id": f"pair/{n}",
            "images": [f"A/{n}.png", f"B/{n}.png"],
            "messages": [
                {"role": "user", "content": "<image>\n<image>\nWhat changed?"},
                {"role": "assistant", "reasoning": "Compare.", "actions": [], "value": "A new road."},
            ],
        }
        for n in (1, 2)
    ]
    path = folder / "pairs.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    data = build([path], tmp_path, processor_and_tokens, max_skip_fraction=0.5)
    assert data.skipped == {"image": 1} and "image 2 is 20x32 px but image 1 is 32x32" in data.skip_examples[0]
    [row] = data.dataset
    assert row["images"] == [str((folder / "A/1.png").resolve()), str((folder / "B/1.png").resolve())]
    image_id = processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    assert row["input_ids"].count(image_id) == 2 * tokens  # the per-image budget, twice


def test_plans_only_share_ends_the_chosen_tool_samples_at_their_plan(tmp_path, processor_and_tokens):
    from geopilot.render import IGNORE_INDEX
    from geopilot.training.data import chosen_share

    processor, tokens = processor_and_tokens
    path = write_demo_dataset(tmp_path / "d", optical=12, sar=0)
    samples = {s.id: s for s in load_samples(path)}
    whole = build([path], tmp_path / "a", processor_and_tokens)
    half = build([path], tmp_path / "b", processor_and_tokens, plans_only_share=0.5)
    cut = build([path], tmp_path / "c", processor_and_tokens, plans_only_share=1.0)
    end = processor.tokenizer.convert_tokens_to_ids(processor.tokenizer.eos_token)
    for i, sample_id in enumerate(whole.dataset["id"]):
        sample = samples[sample_id]
        calls = any(m.role == "assistant" and m.actions for m in sample.messages)
        full_ids, cut_ids = whole.dataset[i]["input_ids"], cut.dataset[i]["input_ids"]
        if not calls:  # a direct answer has no plan to end at
            assert cut_ids == full_ids
            continue
        plan = next(m for m in sample.messages if m.role == "assistant")
        kept = render_sample(sample.model_copy(update={"messages": sample.messages[:2]}), processor.tokenizer, tokens)
        assert len(cut_ids) < len(full_ids) and cut_ids == kept.input_ids and plan.actions
        assert cut_ids == full_ids[: len(cut_ids)]  # the same plan tokens, nothing after them
        labels = cut.dataset[i]["labels"]
        assert labels[-1] == end and sum(label != IGNORE_INDEX for label in labels) > 3
        chosen = chosen_share(sample_id) < 0.5
        assert half.dataset[i]["input_ids"] == (cut_ids if chosen else full_ids)
    shares = [chosen_share(sample_id) for sample_id in samples]
    assert 0.2 < sum(share < 0.5 for share in shares) / len(shares) < 0.8
