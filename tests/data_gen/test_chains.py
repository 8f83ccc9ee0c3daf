"""Two-step chains in the generated data: every kind is planned at the configured share, each chain trace runs its
calls through one ChatCalls (the second reads the first), renders with exact loss masks, and the report counts them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from geopilot.data_gen.generate import generate_dataset
from geopilot.data_gen.generate_config import GenerateConfig
from geopilot.data_gen.synthetic.datasets import write_synthetic
from geopilot.errors import ConfigError
from geopilot.render import IGNORE_INDEX, render_sample
from geopilot.sample import load_samples
from geopilot.tokenizer import encode_text
from geopilot.wire import assistant_json

REPO = Path(__file__).resolve().parents[2]
SOURCES = {"dota", "risbench", "openearthmap", "sardet"}


@pytest.fixture(scope="module")
def chain_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth")
    write_synthetic(root, seed=0)
    data = yaml.safe_load((REPO / "configs/data_gen/synth.yaml").read_text())
    data["sources"] = [s for s in data["sources"] if s["reader"] in SOURCES]
    for source in data["sources"]:
        source["root"] = str(root / Path(source["root"]).relative_to("data/synth"))
    data["chains"] = {"share": 0.3}
    out = tmp_path_factory.mktemp("out")
    result = generate_dataset(GenerateConfig.model_validate(data), out)
    samples = [s for shard in result.manifest["shards"] for s in load_samples(out / shard["path"])]
    return result, samples, out


def _chains(samples, kind):
    return [s for s in samples if s.ability == f"chain_{kind}"]


def test_every_chain_kind_is_generated_and_its_second_step_reads_the_first(chain_run):
    result, samples, out = chain_run
    clouds = _chains(samples, "cloud_detection")
    assert clouds and all(len(_chains(samples, k)) for k in ("grounding_segmentation", "detection_in_region"))
    assert _chains(samples, "sar_detection_counting") and all(
        s.modality == "sar" for s in _chains(samples, "sar_detection_counting")
    )
    for sample in clouds:
        think1, tool1, think2, tool2, final = sample.messages[1:]
        assert think1.actions[0].tool == "remove_clouds" and think2.actions[0].params["image"] == "result:1"
        assert tool2.content.computed_on == "result:1" and tool1.content.provenance == "annotations"
        assert (out / sample.image).is_file() and "chain_images" in sample.image  # the synthetic cloudy copy
        n = len(tool2.content.detections)
        assert f" {n} " in final.value  # the answer's count is the detection's
    for sample in _chains(samples, "detection_in_region"):
        data = sample.messages[4].content.data
        assert data["objects_from"] == "result:1" and data["objects"] == len(sample.messages[2].content.detections)
        [region] = sample.messages[3].actions[0].params["classes"]
        assert f"{data['inside'][region]} of the" in sample.messages[5].value


def test_a_chain_sample_renders_with_exact_masks_for_every_assistant_turn(chain_run, tiny_tokenizer):
    _, samples, _ = chain_run
    sample = _chains(samples, "cloud_detection")[0]
    rendered = render_sample(sample, tiny_tokenizer, num_image_tokens=4)
    assistants = [m for m in sample.messages if m.role == "assistant"]
    spans = rendered.trained_spans()
    assert len(spans) == len(assistants) == 3
    for (start, end), message in zip(spans, assistants, strict=True):
        expected = encode_text(tiny_tokenizer, " " + assistant_json(message)) + [tiny_tokenizer.eos_token_id]
        assert rendered.input_ids[start:end] == rendered.labels[start:end] == expected
    assert sum(label != IGNORE_INDEX for label in rendered.labels) == sum(e - s for s, e in spans)


def test_the_report_counts_chains_at_the_configured_share(chain_run):
    result, samples, out = chain_run
    chains = result.report["chains"]
    assert chains["configured_share_pct"] == 30.0
    assert sum(sum(c.values()) for c in chains["by_kind"].values()) == sum(
        s.ability.startswith("chain_") for s in samples
    )
    optical = [s for s in samples if s.modality == "optical"]
    assert chains["share_pct"]["optical"] == pytest.approx(
        100 * sum(s.ability.startswith("chain_") for s in optical) / len(optical), abs=0.01
    )
    assert 25 <= chains["share_pct"]["optical"] <= 35  # the share of stage 1, within rounding of the few scenes
    assert "Two-step tool chains" in (out / "report.md").read_text()
    assert json.loads((out / "report.json").read_text())["chains"] == chains


def test_an_unknown_chain_kind_is_a_clear_config_error():
    with pytest.raises((ConfigError, ValueError), match="unknown chain kinds"):
        GenerateConfig.model_validate({"sources": [{"reader": "dota", "root": "x"}], "chains": {"kinds": ["loop"]}})
