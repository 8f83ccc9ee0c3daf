"""`geopilot demo`: the out-folder rules (refuse, reuse, resume), the disk check, the held-out subset, the routing
metric (fast), and the whole `--quick` recipe end to end, twice with one seed, with an interruption (slow)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from geopilot.cli import main
from geopilot.data_gen.chains import CHAIN_KINDS
from geopilot.demo import pipeline
from geopilot.demo.report import QUICK_NOTICE, worked_example_lines
from geopilot.demo.run import check_disk, check_out_dir, read_results, run_demo, run_dir
from geopilot.demo.settings import PHASES, DemoSettings, Layout
from geopilot.errors import GeoPilotInputError
from geopilot.eval.cases import Case
from geopilot.fileio import fingerprint

REPO = Path(__file__).resolve().parents[2]
# what the libraries print unless --verbose: transformers' and datasets' bars, DeepSpeed's CPU warning, accelerate's
# per-checkpoint lines, any tqdm bar
LIBRARY_NOISE = (
    "Loading weights",
    "Writing model shards",
    "Saving the dataset",
    "Setting accelerator",
    "it/s]",
    "[RANK 0]",
)


def _start(layout: Layout, settings: DemoSettings) -> None:
    layout.out.mkdir(parents=True, exist_ok=True)
    record = {"fingerprint": settings.fingerprint(), "settings": settings.model_dump(mode="json")}
    layout.settings.write_text(json.dumps(record), encoding="utf-8")


def test_a_fresh_or_empty_folder_is_accepted(tmp_path):
    settings = DemoSettings.preset(quick=True)
    assert check_out_dir(Layout(tmp_path / "new"), settings) is False
    (tmp_path / "empty").mkdir()
    assert check_out_dir(Layout(tmp_path / "empty"), settings) is False


def test_a_folder_that_is_not_a_demo_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(GeoPilotInputError, match="holds no demo run"):
        check_out_dir(Layout(tmp_path), DemoSettings.preset(quick=True))
    with pytest.raises(GeoPilotInputError, match="not a folder"):
        check_out_dir(Layout(tmp_path / "notes.txt"), DemoSettings.preset(quick=True))


def test_other_settings_are_refused_never_mixed(tmp_path):
    layout = Layout(tmp_path)
    _start(layout, DemoSettings.preset(quick=True, seed=0))
    with pytest.raises(GeoPilotInputError, match="other settings .*seed"):
        check_out_dir(layout, DemoSettings.preset(quick=True, seed=1))
    with pytest.raises(GeoPilotInputError, match="other settings"):
        check_out_dir(layout, DemoSettings.preset(quick=False, seed=0))


def test_a_folder_from_before_chains_is_refused_naming_the_chain_settings(tmp_path):
    """Its model never saw a chain and it has no chain_eval phase: resuming it would mix two recipes."""
    layout, settings = Layout(tmp_path), DemoSettings.preset(quick=True)
    before = {k: v for k, v in settings.model_dump(mode="json").items() if k not in ("chain_share", "chain_cases")}
    record = {"fingerprint": fingerprint(before), "settings": before}
    layout.settings.write_text(json.dumps(record), encoding="utf-8")
    with pytest.raises(GeoPilotInputError, match=r"chain_cases: \(not set\) -> 8, chain_share: \(not set\) -> 0.1"):
        check_out_dir(layout, settings)


def test_same_settings_resume_and_a_finished_run_is_reused(tmp_path):
    layout, settings = Layout(tmp_path), DemoSettings.preset(quick=True)
    _start(layout, settings)
    assert check_out_dir(layout, settings) is False  # started, not finished: resume
    for phase in PHASES:
        pipeline._json(layout.marker(phase), {"result": {"report": "x"}, "seconds": 1.0})
    assert check_out_dir(layout, settings) is True
    assert run_demo(tmp_path, settings) == layout.report  # reused: nothing runs


def test_too_little_disk_space_is_a_clear_error(tmp_path):
    with pytest.raises(GeoPilotInputError, match="not enough free disk space"):
        check_disk(tmp_path / "not" / "yet", needed=shutil.disk_usage(tmp_path).free * 1000)
    check_disk(tmp_path / "not" / "yet", needed=1)


def test_cli_bad_out_exits_2(tmp_path, capsys):
    (tmp_path / "file").write_text("x", encoding="utf-8")
    assert main(["demo", "--out", str(tmp_path / "file"), "--quick"]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_held_out_subset_keeps_the_planning_set_proportions():
    from geopilot.eval.planning_set import PLANNING_FILE

    cases = [json.loads(line) for line in PLANNING_FILE.read_text(encoding="utf-8").splitlines()]
    subset = pipeline.held_out_subset(cases, 100)
    assert len(subset) == 100 and len({c["id"] for c in subset}) == 100
    assert Counter(c["category"] for c in subset) == {
        k: v // 5 for k, v in Counter(c["category"] for c in cases).items()
    }
    difficulties = Counter(c["difficulty"] for c in subset)
    assert abs(difficulties["easy"] - 40) <= 3 and abs(difficulties["medium"] - 40) <= 3
    assert abs(difficulties["hard"] - 20) <= 3
    assert abs(sum(c["modality"] == "sar" for c in subset) - 14) <= 3  # 70 of 500
    assert pipeline.held_out_subset(cases, 500) == cases


def test_held_out_subset_has_exactly_the_cases_asked_for():
    """The quick preset asked for 27 and scored 31: every group got one, then the categories' shares added more."""
    from geopilot.eval.planning_set import PLANNING_FILE

    cases = [json.loads(line) for line in PLANNING_FILE.read_text(encoding="utf-8").splitlines()]
    for n in (27, 28, 31, 37, 41, 44, 63, 100, 499):
        subset = pipeline.held_out_subset(cases, n)
        assert len(subset) == n and len({c["id"] for c in subset}) == n
        assert {(c["category"], c["difficulty"]) for c in subset} == {(c["category"], c["difficulty"]) for c in cases}
    quick = DemoSettings.preset(quick=True)
    assert len(pipeline.held_out_subset(cases, quick.eval_cases)) == quick.eval_cases


def _case(case_id: str, modality: str, tools: list[str]) -> Case:
    return Case(
        id=case_id,
        query="q",
        image=None,
        modality=modality,
        category="c",
        difficulty="easy",
        expected_tools=tools,
        max_rounds=1,
    )


def test_routing_counts_the_modality_of_detection_and_grounding_calls():
    cases = {
        "a": _case("a", "sar", ["sar_detect_all"]),
        "b": _case("b", "sar", ["sar_ground"]),
        "c": _case("c", "optical", ["ground"]),
        "d": _case("d", "optical", ["segment_semantic"]),  # not a detection/grounding case: not counted
    }
    calls = {"a": ["sar_detect_all"], "b": ["ground"], "c": ["ground", "sar_ground"], "d": ["detect_all"]}
    rows = [{"case_id": k, "run": {"calls": [{"tool": t} for t in v]}} for k, v in calls.items()]
    assert pipeline.routing(rows, cases) == {
        "accuracy": pytest.approx(1 / 3),
        "correct": {"optical": 0, "sar": 1},
        "total": {"optical": 1, "sar": 2},
    }


def test_the_stage_configs_are_valid_train_configs(tmp_path):
    from geopilot.training.config import TrainConfig

    layout, settings = Layout(tmp_path), DemoSettings()
    one = TrainConfig.model_validate(pipeline.train_config(layout, settings, 1))
    two = TrainConfig.model_validate(pipeline.train_config(layout, settings, 2))
    assert one.freeze.vision_tower is False and one.model.tokenizer_path == str(layout.tokenizer)
    assert two.data.replay_alpha == 0.2 and two.model.llava_path == str(layout.stage1 / "export")


def test_the_qwen_stage_configs_build_a_tiny_qwen2_5_vl_then_read_its_export(tmp_path):
    from geopilot.training.config import TrainConfig

    layout, settings = Layout(tmp_path), DemoSettings.preset(quick=True, model_family="qwen2_5_vl")
    one = TrainConfig.model_validate(pipeline.train_config(layout, settings, 1))
    two = TrainConfig.model_validate(pipeline.train_config(layout, settings, 2))
    assert (one.model.family, one.model.init, one.model.max_pixels) == ("qwen2_5_vl", "tiny", settings.qwen_max_pixels)
    assert one.model.tiny_qwen == settings.qwen_model and one.freeze.vision_tower is False
    assert (two.model.family, two.model.init, two.model.path) == (
        "qwen2_5_vl",
        "pretrained",
        str(layout.stage1 / "export"),
    )
    assert settings.preset_name() == "quick" and settings.fingerprint() != DemoSettings.preset(quick=True).fingerprint()


def test_a_relative_out_resumed_from_another_directory_is_the_same_training_run(tmp_path, monkeypatch):
    """train.py refuses to resume a run whose settings differ, paths included: the demo's stage configs hold absolute
    paths, so `--out runs/demo` from the clone and `--out demo` from runs/ give the same training runs."""
    from geopilot.training.config import TrainConfig, result_settings

    (tmp_path / "runs").mkdir()
    settings = DemoSettings.preset(quick=True)
    identity = {}
    for cwd, out in ((tmp_path, "runs/demo"), (tmp_path / "runs", "demo")):
        monkeypatch.chdir(cwd)
        identity[out] = [
            result_settings(TrainConfig.model_validate(pipeline.train_config(Layout(Path(out)), settings, stage)))
            for stage in (1, 2)
        ]
    assert identity["runs/demo"] == identity["demo"]
    assert identity["demo"][0]["data.files"] == [str(tmp_path / "runs/demo/data/traces/shard-00000.jsonl")]


def test_the_generate_config_reads_the_synthetic_roots_under_the_out_folder(tmp_path):
    config = pipeline.generate_config(Layout(tmp_path), DemoSettings(seed=3))
    assert config.backend.kind == "template" and config.seed == 3
    assert config.chains.share == 0.1 and config.chains.kinds == list(CHAIN_KINDS)  # chains in both stages
    assert pipeline.generate_config(Layout(tmp_path), DemoSettings(chain_share=0.25)).chains.share == 0.25
    assert {s.root.parent for s in config.sources} == {tmp_path / "data" / "synth"}
    abilities = {a for s in config.sources for a in s.abilities}
    assert {"instance_segmentation", "general_understanding", "semantic_segmentation"} <= abilities


def test_the_chain_subset_covers_every_kind_with_the_suites_own_images(tmp_path):
    from geopilot.eval.cases import load_cases
    from geopilot.eval.chain_set import CHAINS_FILE

    layout = Layout(tmp_path)
    quick = load_cases(pipeline.chain_subset(layout, DemoSettings.preset(quick=True)))
    assert len(quick.cases) == 8
    assert Counter(c.category for c in quick.cases) == {
        "chain_cloud_detection": 3,
        "chain_grounding_segmentation": 2,
        "chain_detection_in_region": 2,
        "chain_sar_detection_counting": 1,
    }
    assert all(Path(c.image).is_absolute() and Path(c.image).is_file() for c in quick.cases)
    assert all(c.max_rounds == len(c.expected_tools) for c in quick.cases)  # each case keeps its own max_rounds
    whole = load_cases(pipeline.chain_subset(layout, DemoSettings(chain_cases=124)))
    assert [c.id for c in whole.cases] == [c.id for c in load_cases(CHAINS_FILE).cases]  # 124: all of them
    half = load_cases(pipeline.chain_subset(layout, DemoSettings()))  # the default: half, every kind
    assert len(half.cases) == 62 and {c.category for c in half.cases} == {c.category for c in whole.cases}


@pytest.mark.slow
def test_quick_demo_end_to_end_resumes_and_repeats(tmp_path, monkeypatch, capsys):
    from geopilot import GeoPilot

    settings = DemoSettings.preset(quick=True)
    first = tmp_path / "first"
    # the command as a user runs it, from the checkout: its console holds the project's lines, no library noise
    shown = subprocess.run(
        [sys.executable, "-m", "geopilot.cli", "demo", "--quick", "--out", str(first)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "100"},
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    console = shown.stdout + shown.stderr
    for noise in LIBRARY_NOISE:
        assert noise not in console, noise
    report = first / "report.md"
    text = report.read_text(encoding="utf-8")
    assert "## Worked examples" in text and QUICK_NOTICE in text
    worked = read_results(Layout(first))["examples"]["examples"]
    assert len(worked) == 10 and all((first / "examples" / w["picture"]).stat().st_size > 1000 for w in worked)
    chat_line, serve_line = text.rstrip().splitlines()[-3:-1]
    assert shlex.split(chat_line)[:6] == [
        "geopilot",
        "chat",
        "--model",
        str(first / "model"),
        "--tools-config",
        "configs/tools_examples.yaml",
    ]
    assert shlex.split(serve_line)[:2] == ["geopilot", "serve"]
    for picture in (
        "plots/loss.png",
        "plots/tsa_by_tool.png",
        "plots/opa_by_difficulty.png",
        "chats/optical.png",
        "chats/sar.png",
        "chats/chain.png",
    ):
        assert f"({picture})" in text and (first / picture).stat().st_size > 1000
    result = GeoPilot.from_pretrained(first / "model", device="cpu").chat(
        str(first / "data/synth/DOTA/train/images/P0000.png"),
        "How many planes are there?",
        generation={"max_new_tokens": 24},
    )
    assert isinstance(result.answer, str)
    metrics = read_results(Layout(first))["evaluate"]
    recorded = json.loads((first / "demo.json").read_text(encoding="utf-8"))["settings"]
    assert metrics["cases"] == recorded["eval_cases"] == 27  # asked for = scored
    results = read_results(Layout(first))
    trained_chains = results["data"]["chains"]["by_kind"]
    assert set(trained_chains) == set(CHAIN_KINDS) and all(sum(n.values()) > 0 for n in trained_chains.values())
    chains = results["chain_eval"]
    assert chains["cases"] == recorded["chain_cases"] == 8 and set(chains["by_kind"]) == set(CHAIN_KINDS)
    assert all(chains[m] is not None for m in ("first_step", "second_step", "both", "answer", "chain"))
    assert "chain accuracy (8 cases)" in text and f"`{results['chats']['chain']['case_id']}`" in text
    assert text.index("Preset: quick") < text.index(str(metrics["cases"]))

    # configs/tiny/stage*.yaml train as written on the demo's data (runs/demo/data/... from the working directory)
    work = tmp_path / "clone"
    (work / "runs").mkdir(parents=True)
    (work / "runs" / "demo").symlink_to(first)
    for stage in (1, 2):
        done = subprocess.run(
            [sys.executable, str(REPO / "train.py"), "--config", str(REPO / f"configs/tiny/stage{stage}.yaml")],
            cwd=work,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    assert (work / "runs/tiny/stage2/export/config.json").is_file()

    # Ctrl-C in a late phase: what finished stays finished; the next run, from another working directory with --out
    # typed relative to it, resumes there with the same result, and its report's chat command works from there.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pipeline, "run_chats", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        run_demo(Path("second"), settings)
    second = tmp_path / "second"
    assert Layout(second).marker("evaluate").is_file() and not Layout(second).marker("chats").is_file()
    monkeypatch.undo()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    run_demo(Path("../second"), settings)
    assert read_results(Layout(second))["evaluate"] == metrics  # same seed, same metrics
    pasted = next(line for line in (second / "report.md").read_text().splitlines() if line.startswith("geopilot chat"))
    argv = shlex.split(pasted)
    assert argv[3] == "../second/model"
    capsys.readouterr()
    assert main([*argv[1:], "--max-new-tokens", "24"]) == 0
    assert capsys.readouterr().err.count("learned nothing") == 1  # the quick model says so, once


@pytest.mark.slow
def test_quick_demo_on_qwen2_5_vl_end_to_end(tmp_path, capsys):
    """`geopilot demo --quick --model-family qwen2_5_vl`: the tiny Qwen2.5-VL through both stages, the evaluations
    and the chats; its export loads in plain transformers and the report names the family."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    out = tmp_path / "qwen"
    assert main(["demo", "--quick", "--model-family", "qwen2_5_vl", "--threads", "1", "--out", str(out)]) == 0
    text = (out / "report.md").read_text(encoding="utf-8")
    assert "Model family: `qwen2_5_vl` (Qwen2.5-VL" in text and "Qwen2.5-VL-shaped model" in text
    assert json.loads((out / "model" / "config.json").read_text())["model_type"] == "qwen2_5_vl"
    assert isinstance(
        Qwen2_5_VLForConditionalGeneration.from_pretrained(out / "model"), Qwen2_5_VLForConditionalGeneration
    )
    results = read_results(Layout(out))
    assert results["evaluate"]["cases"] == 27 and results["chain_eval"]["cases"] == 8
    assert not results["evaluate"]["failures"].get("infra_error") and not results["chain_eval"]["failures"].get(
        "infra_error"
    )
    assert results["stage1"]["trained"]["by_modality"]["optical"] > 0 and results["stage2"]["trained"]["total"] > 0
    assert all((out / "chats" / name).stat().st_size > 1000 for name in ("optical.png", "sar.png", "chain.png"))


def test_a_demo_json_with_the_released_fingerprint_is_resumed_and_rewritten(tmp_path):
    layout, settings = Layout(tmp_path), DemoSettings.preset(quick=True)
    dumped = settings.model_dump(mode="json")
    released = hashlib.sha256(json.dumps(dumped, sort_keys=True).encode()).hexdigest()[:16]  # the formula before
    layout.settings.write_text(json.dumps({"fingerprint": released, "settings": dumped}), encoding="utf-8")
    assert released != settings.fingerprint()
    assert check_out_dir(layout, settings) is False  # understood: resumed, not refused
    run_dir(layout, settings).claim()
    assert json.loads(layout.settings.read_text())["fingerprint"] == settings.fingerprint()
    with pytest.raises(GeoPilotInputError, match=r"other settings \(seed: 0 -> 3\)"):
        check_out_dir(layout, DemoSettings.preset(quick=True, seed=3))


def test_the_worked_examples_section_ends_the_report_with_chat_and_serve(tmp_path):
    layout = Layout(tmp_path / "demo")
    example = {
        "image": "examples/images/airport.png",
        "question": "How many planes are there in this image?",
        "expected_tool": "detect_objects",
        "plan": '{"actions": [{"tool": "detect_objects"}]}',
        "tool_calls": [
            {"tool": "detect_objects", "params": {"categories": ["plane"]}, "error": None, "provenance": "annotations"}
        ],
        "answer": "There is 1 plane.",
        "outcome": "answered",
        "right": True,
        "picture": "airport.png",
    }
    results = {"examples": [example], "right": 1, "tools_config": "configs/tools_examples.yaml"}
    layout.examples.mkdir(parents=True)
    layout.plots.mkdir(parents=True)
    shutil.copy(REPO / example["image"], layout.examples / example["picture"])
    quick = worked_example_lines(layout, DemoSettings.preset(quick=True), results)
    assert quick[0] == "## Worked examples" and QUICK_NOTICE in "\n".join(quick)
    assert "1 of 1 answered right" in "\n".join(quick) and "(provenance: annotations)" in "\n".join(quick)
    chat, serve = quick[-4:-2]
    assert shlex.split(chat) == [
        "geopilot",
        "chat",
        "--model",
        str(layout.model),
        "--tools-config",
        "configs/tools_examples.yaml",
        "--image",
        "examples/images/airport.png",
        "How many planes are there in this image?",
    ]
    assert shlex.split(serve) == [
        "geopilot",
        "serve",
        "--model",
        str(layout.model),
        "--tools-config",
        "configs/tools_examples.yaml",
    ]
    default = worked_example_lines(layout, DemoSettings.preset(quick=False), results)
    assert QUICK_NOTICE not in "\n".join(default)
    assert "](plots/worked_examples.png)" in "\n".join(default)
    assert (layout.plots / "worked_examples.png").stat().st_size > 10_000


def test_an_example_is_right_when_its_tool_answered_and_the_answer_says_the_number():
    example = {"tool": "detect_objects", "answer_contains": "3"}
    called = [{"tool": "detect_objects", "error": None}]
    assert pipeline.example_right(example, called, "I found 3 planes.")
    assert not pipeline.example_right(example, called, "I found 13 planes.")
    assert not pipeline.example_right(example, [{"tool": "detect_all", "error": None}], "3 planes")
    assert not pipeline.example_right(example, [{"tool": "detect_objects", "error": "boom"}], "3 planes")
    assert pipeline.example_right({"tool": "extract_roads"}, [{"tool": "extract_roads", "error": None}], "Done.")
