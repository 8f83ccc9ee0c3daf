"""synth -> generate (template backend) -> every sample validates and renders; Table 2 report; determinism."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from helpers.traces import all_records, fake_readers
from pydantic import ValidationError

from geopilot.cli import main as cli_main
from geopilot.config import load_config
from geopilot.data_gen.generate import generate_dataset
from geopilot.data_gen.generate_config import GenerateConfig
from geopilot.data_gen.synthetic.datasets import write_synthetic
from geopilot.errors import ConfigError
from geopilot.render import render_sample
from geopilot.sample import load_samples
from geopilot.wire import chat_turns, format_tool_turn

REPO = Path(__file__).resolve().parents[2]
ID_PATTERN = re.compile(r"^[a-z0-9-]+/[^/]+(/[^/]+)*/[a-z_]+/\d+$")


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("synth")
    write_synthetic(root, seed=0)
    return root


def synth_config(root: Path, **overrides) -> GenerateConfig:
    """configs/data_gen/synth.yaml with its roots pointed at `root`."""
    data = yaml.safe_load((REPO / "configs/data_gen/synth.yaml").read_text())
    for source in data["sources"]:
        source["root"] = str(root / Path(source["root"]).relative_to("data/synth"))
    data.update(overrides)
    return GenerateConfig.model_validate(data)


def shard_samples(out: Path) -> list:
    manifest = json.loads((out / "manifest.json").read_text())
    return [s for shard in manifest["shards"] for s in load_samples(out / shard["path"])]


def test_synth_to_generate_every_sample_validates_and_renders(synth_root, tmp_path, tiny_tokenizer):
    out = tmp_path / "out"
    result = generate_dataset(synth_config(synth_root), out)
    samples = shard_samples(out)  # load_samples raises on the first sample that breaks the schema
    assert len(samples) == result.manifest["samples"] == result.report["kept"] > 50
    assert len({s.id for s in samples}) == len(samples)
    abilities = {(s.modality, s.ability) for s in samples}
    assert abilities == {
        ("optical", a)
        for a in [
            "panoptic_detection",
            "object_detection",
            "visual_grounding",
            "semantic_segmentation",
            "referring_segmentation",
            "road_extraction",
            "cloud_removal",
        ]
    } | {("sar", "general_understanding"), ("sar", "panoptic_detection"), ("sar", "visual_grounding")}
    for sample in samples:
        assert ID_PATTERN.match(sample.id) and sample.id.split("/")[-2] == sample.ability
        assert (out / sample.image).is_file()  # relative to the shard's folder
        rendered = render_sample(sample, tiny_tokenizer, num_image_tokens=4)
        assert rendered.num_trained > 0
        tools = [m for m in sample.messages if m.role == "tool"]
        if sample.ability == "general_understanding":
            assert not tools and all(not m.actions for m in sample.messages if m.role == "assistant")
            continue
        # four stages: query, think turn with one call, ground-truth tool output, grounded answer
        user, think, tool, answer = sample.messages
        assert len(think.actions) == 1 and think.actions[0].tool == tool.name and think.value is None
        assert tool.content.provenance == "annotations"
        assert answer.value and not answer.actions
        assert (sample.modality == "sar") == tool.name.startswith("sar_")
        # the tool turn the model trains on is the ONE formatter's text of the stored canonical output
        question = user.content.replace("<image>", "").strip()
        assert chat_turns(sample.messages)[2] == ("user", format_tool_turn([(tool.name, tool.content)], question))
    report = result.report
    assert report["complete"] and report["schema_invalid_kept"] == 0 and report["pending"] == 0
    assert sum(row["size"] for row in report["table2"]) == report["total"] == len(samples)
    assert report["modality_split"]["optical"]["samples"] + report["modality_split"]["sar"]["samples"] == len(samples)
    assert set(report["first_pass_validity"]) == {
        "query_answerability",
        "tool_call_correctness",
        "parameter_consistency",
        "final_answer_faithfulness",
        "overall",
    }
    markdown = (out / "report.md").read_text()
    assert "Table 2" in markdown and "| SAR Tasks | General Understanding | - | SARLANG-1M |" in markdown
    manifest = result.manifest
    assert set(manifest["prompt_versions"]) == {"plan", "answer", "reasoning", "caption_dialogue"}
    provenance = [json.loads(line) for line in (out / "provenance" / "shard-00000.jsonl").read_text().splitlines()]
    assert provenance[0]["prompt_versions"] and provenance[0]["backend"] == "template"


def test_general_understanding_filters_grounding_and_keeps_dialogues(tmp_path):
    records = all_records(tmp_path / "data")
    config = GenerateConfig(
        sources=[{"reader": "fake", "root": str(tmp_path / "data")}], abilities=["general_understanding"]
    )
    result = generate_dataset(config, tmp_path / "out", readers=fake_readers(records))
    samples = {s.id: s for s in shard_samples(tmp_path / "out")}
    assert result.report["generator_skips_by_cause"] == {"grounding_centred": 1, "no_usable_annotation": 7}
    assert result.report["reader_skips_by_cause"] == {"fake": {"missing_image": 1}}
    geochat = samples["geochat-instruct/P0003_0004/general_understanding/0"]
    assert [m.role for m in geochat.messages] == ["user", "assistant", "user", "assistant"]
    assert [m.value for m in geochat.messages if m.role == "assistant"] == ["Urban", "There are two tennis courts."]
    assert all(m.reasoning and not m.actions for m in geochat.messages if m.role == "assistant")
    caption = samples["sarlang-1m/Nice_3/general_understanding/0"]
    assert len(caption.messages) == 2 and caption.messages[1].value.startswith("A coastal city")
    assert caption.modality == "sar" and caption.messages[0].content.startswith("<image>\n")


def test_same_seed_same_bytes_other_seed_other_samples(tmp_path):
    records = all_records(tmp_path / "data")
    readers = fake_readers(records)

    def run(name: str, seed: int) -> bytes:
        config = GenerateConfig(
            sources=[{"reader": "fake", "root": str(tmp_path / "data")}], seed=seed, samples_per_record=2
        )
        generate_dataset(config, tmp_path / name, readers=readers)
        return b"".join(p.read_bytes() for p in sorted((tmp_path / name).glob("shard-*.jsonl")))

    assert run("a", 0) == run("b", 0)
    assert run("c", 1) != run("a", 0)


def test_every_data_gen_config_loads():
    paths = sorted((REPO / "configs/data_gen").glob("*.yaml"))
    assert len(paths) >= 2
    for path in paths:
        load_config(GenerateConfig, path)


def test_bad_config_is_a_clear_error(tmp_path):
    with pytest.raises(ValidationError, match="unknown abilities"):  # a validator: no config object exists with them
        GenerateConfig(sources=[{"reader": "dota", "root": "x"}], abilities=["telepathy"])
    with pytest.raises(ConfigError, match=r"backend: url is required for kind: openai"):
        load_config(GenerateConfig, None, ["sources=[{reader: dota, root: x}]", "backend.kind=openai"])
    with pytest.raises(ConfigError, match="unknown reader 'nope'"):
        generate_dataset(GenerateConfig(sources=[{"reader": "nope", "root": str(tmp_path)}]), tmp_path / "out")
    config = tmp_path / "bad.yaml"
    config.write_text("sources: [{reader: dota, root: /nonexistent}]\nbackend: {kind: openai}\n")
    assert cli_main(["generate", "--config", str(config), "--out", str(tmp_path / "o")]) == 2  # url missing
    config.write_text("sources: [{reader: dota, root: /nonexistent/DOTA}]\n")
    assert cli_main(["generate", "--config", str(config), "--out", str(tmp_path / "o2")]) == 2  # no dataset root
    config.write_text("sources: [{reader: dota, root: x, limt: 3}]\n")
    assert cli_main(["generate", "--config", str(config), "--out", str(tmp_path / "o3")]) == 2  # misspelt key


def test_cli_generate_writes_shards_manifest_and_report(synth_root, tmp_path, capsys):
    config = tmp_path / "synth.yaml"
    config.write_text(yaml.safe_dump(synth_config(synth_root).model_dump(mode="json")))
    out = tmp_path / "out"
    assert cli_main(["generate", "--config", str(config), "--out", str(out), "--quiet", "shard_size=20"]) == 0
    assert "samples in" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and len(manifest["shards"]) > 1
    assert all(len(load_samples_list(out / s["path"])) == s["samples"] for s in manifest["shards"])
    assert (out / "report.json").is_file() and (out / "report.md").is_file()


def load_samples_list(path: Path) -> list:
    return list(load_samples(path))


def test_geochat_instruct_file_keeps_dialogues_that_are_neither_grounding_nor_counting(tmp_path):
    from PIL import Image

    root = tmp_path / "GeoChat"
    (root / "images").mkdir(parents=True)
    for name in ("P0003_0004.png", "P0010_0001.png", "airport_12.jpg"):
        Image.new("RGB", (50, 40)).save(root / "images" / name)
    entries = [
        {
            "id": "P0003_0004",
            "image": "P0003_0004.png",
            "conversations": [
                {
                    "from": "human",
                    "value": "<image>\nIs it a rural or an urban area? Answer in one word or a short phrase.",
                },
                {"from": "gpt", "value": "Urban"},
            ],
        },
        {
            "id": "P0003_0004",
            "image": "P0003_0004.png",
            "conversations": [
                {
                    "from": "human",
                    "value": "<image>\n[refer] give me the location of <p>the small vehicle on the left</p>",
                },
                {"from": "gpt", "value": "{<12><40><15><44>|<35>}"},
            ],
        },
        {
            "id": "P0010_0001",
            "image": "P0010_0001.png",
            "conversations": [
                {"from": "human", "value": "<image>\nDescribe the image in detail."},
                {"from": "gpt", "value": "Two <p>planes</p> {<10><10><20><20>|<0>}{<30><30><40><40>|<0>} are parked."},
            ],
        },
        {
            "id": "airport_12",
            "image": "airport_12.jpg",
            "conversations": [
                {
                    "from": "human",
                    "value": "<image>\nClassify the given image in one of the following classes. Classes: airport, beach. Answer in one word or a short phrase.",
                },
                {"from": "gpt", "value": "airport"},
            ],
        },
        {
            "id": "airport_12",
            "image": "airport_12.jpg",
            "conversations": [
                {
                    "from": "human",
                    "value": "<image>\nHow many planes are there in the image? Answer in one word or a short phrase.",
                },
                {"from": "gpt", "value": "3"},
            ],
        },
    ]
    (root / "GeoChat_Instruct.json").write_text(json.dumps(entries))
    config = GenerateConfig(
        sources=[{"reader": "geochat_instruct", "root": str(root), "abilities": ["general_understanding"]}]
    )
    result = generate_dataset(config, tmp_path / "out")
    samples = shard_samples(tmp_path / "out")
    assert sorted(s.id for s in samples) == [
        "geochat-instruct/P0003_0004/general_understanding/0",
        "geochat-instruct/airport_12/general_understanding/0",
    ]
    assert result.report["generator_skips_by_cause"]["grounding_centred"] == 2
    assert result.report["generator_skips_by_cause"]["counting_centred"] == 1  # the detectors count; no guessed count
    assert all(s.messages[1].reasoning and s.messages[1].value in {"Urban", "airport"} for s in samples)


def test_an_unusable_annotation_drops_only_its_sample(tmp_path):
    records = all_records(tmp_path / "data")
    (tmp_path / "data" / "aachen_1_label.png").unlink()  # the semantic mask the record points at
    config = GenerateConfig(sources=[{"reader": "fake", "root": str(tmp_path / "data")}])
    result = generate_dataset(config, tmp_path / "out", readers=fake_readers(records))
    assert result.report["dropped_by_reason"] == {"annotation_unusable": 1}
    assert result.report["kept"] == result.report["jobs"] - 1 and result.manifest["complete"]
    meta = [
        json.loads(line)
        for p in (tmp_path / "out" / "provenance").glob("*.jsonl")
        for line in p.read_text().splitlines()
    ]
    dropped = [m for m in meta if m["status"] == "dropped"]
    assert dropped[0]["id"] == "openearthmap/aachen_1/semantic_segmentation/0"
    assert "aachen_1_label.png" in dropped[0]["drop_detail"]


@pytest.mark.parametrize("name", ["paper.yaml", "synth.yaml", "change.yaml", "synth_change.yaml"])
def test_shipped_configs_name_real_readers_and_abilities(name):
    from geopilot.data_gen.abilities import ABILITIES
    from geopilot.data_gen.readers import READERS

    path = Path(__file__).resolve().parents[2] / "configs" / "data_gen" / name
    config = load_config(GenerateConfig, path)
    assert {s.reader for s in config.sources} <= set(READERS)
    assert all(set(s.abilities or []) <= set(ABILITIES) for s in config.sources)
    pairs = {"levir_cd", "levir_cc"}  # the bi-temporal sources, beyond the paper's Table 2
    if name == "paper.yaml":  # the paper's Table 2: every other reader is used
        assert {s.reader for s in config.sources} == set(READERS) - pairs
    if name == "change.yaml":
        assert {s.reader for s in config.sources} == pairs


def test_tool_turns_are_dispatched_through_the_tool_registry(tmp_path, monkeypatch):
    """Plans are validated and the annotation's call is run by `ToolRegistry` (the dispatcher inference uses), built
    with the annotation backend: every kept tool turn is what `ToolRegistry.call` returned, labelled as annotations."""
    from geopilot.tool_protocol import ToolRegistry
    from geopilot.tools.annotations import AnnotationBackend

    calls, validations = [], []
    real_call, real_validate = ToolRegistry.call, ToolRegistry.validate

    def spy_call(self, action, image, modality=None, timeout_s=None):
        result = real_call(self, action, image, modality, timeout_s)
        calls.append((action.tool, modality, result))
        return result

    def spy_validate(self, action, modality=None):
        validations.append((action.tool, modality))
        return real_validate(self, action, modality)

    def no_side_door(self, tool, params=None):
        raise AssertionError("data_gen called AnnotationBackend.call directly instead of the registry")

    monkeypatch.setattr(ToolRegistry, "call", spy_call)
    monkeypatch.setattr(ToolRegistry, "validate", spy_validate)
    monkeypatch.setattr(AnnotationBackend, "call", no_side_door)
    records = all_records(tmp_path / "data")
    config = GenerateConfig(sources=[{"reader": "fake", "root": str(tmp_path / "data")}])
    result = generate_dataset(config, tmp_path / "out", readers=fake_readers(records))
    samples = shard_samples(tmp_path / "out")
    tool_messages = [m for s in samples for m in s.messages if m.role == "tool"]
    assert tool_messages and result.report["kept"] == len(samples)
    assert len(calls) == len(tool_messages) and all(result.ok for _, _, result in calls)
    assert {tool for tool, _ in validations} >= {tool for tool, _, _ in calls}
    assert {m.content.model_dump_json() for m in tool_messages} == {r.output.model_dump_json() for _, _, r in calls}
    assert all(m.content.provenance == "annotations" for m in tool_messages)
    by_modality = {modality for _, modality, _ in calls}
    assert by_modality <= {"optical", "sar"} and None not in by_modality  # the record's modality gates the call
