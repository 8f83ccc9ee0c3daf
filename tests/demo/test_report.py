"""The demo's report and console summary explain themselves: which preset ran and what its numbers mean come before
any number, the four planning metrics are spelled out, and the chat command works from where the demo was run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from geopilot.demo.report import write_report
from geopilot.demo.run import _summary
from geopilot.demo.settings import DemoSettings, Layout

SAR_IMAGE = "data/synth/SARDet-100K/JPEGImages/train/0000000.png"
CHAIN_KEYS = ("first_step", "second_step", "both", "answer", "chain")
CHAIN_CHAT = {
    "case_id": "chain_cloud_detection/003",
    "query": "Clear the clouds, then count the ships.",
    "expected": [{"tool": "remove_clouds"}, {"tool": "detect_objects", "params": {"image": "result:1"}, "round": 2}],
    "tool_calls": [{"round": 1, "tool": "remove_clouds", "params": {}, "error": None}],
    "answer": "",
    "outcome": "round_limit",
    "picture": "chain.png",
}


def _results() -> dict:
    chat = {
        "modality": "sar",
        "image": "elsewhere/" + SAR_IMAGE,  # where the chats phase saw it: --out was typed another way then
        "image_in_out": SAR_IMAGE,
        "query": "Detect all targets in this SAR image.",
        "plan": "",
        "answer": "",
        "outcome": "answered",
        "tool_calls": [],
        "picture": "sar.png",
    }
    return {
        "data": {
            "samples": 40,
            "optical": 30,
            "sar": 10,
            "vocab": 600,
            "dropped": {},
            "chains": {"by_kind": {"cloud_detection": {"optical": 3}, "sar_detection_counting": {"sar": 1}}},
        },
        "stage1": {"steps": 2, "final_loss": 6.4, "losses": [[1, 6.5], [2, 6.4]]},
        "stage2": {"steps": 1, "final_loss": 6.3, "losses": [[1, 6.3]]},
        "evaluate": {
            "cases": 27,
            "TSA": 0.0,
            "PA": None,
            "NTA": 0.0,
            "OPA": 0.0,
            "tsa_by_tool": {"detect_objects": 0.0, "no tool": 0.0},
            "by_difficulty": {"easy": 0.0, "medium": 0.0, "hard": 0.0},
            "by_category": {"object_detection": 0.0},
            "routing": {"accuracy": 0.0, "correct": {"optical": 0, "sar": 0}, "total": {"optical": 2, "sar": 1}},
        },
        "chain_eval": {
            "cases": 8,
            "TSA": 0.25,
            "PA": 0.5,
            "OPA": 0.125,
            "first_step": 0.5,
            "second_step": 0.25,
            "both": 0.125,
            "answer": 0.25,
            "chain": 0.125,
            "by_kind": {
                kind: {"n": 2, "first_step": 0.5, "second_step": 0.5, "both": 0.5, "answer": 0.0, "chain": 0.0}
                for kind in ("cloud_detection", "grounding_segmentation", "detection_in_region")
            }
            | {"sar_detection_counting": {"n": 2, **dict.fromkeys(CHAIN_KEYS, 0.5)}},
        },
        "chats": {"chats": [chat], "chain": CHAIN_CHAT},
        "seconds": {"data": 3.0, "stage1": 20.0},
    }


def _before_any_number(text: str) -> str:
    return text[: re.search(r"\d", text).start()]


@pytest.mark.parametrize(("quick", "name"), [(True, "quick"), (False, "default")])
def test_the_report_states_the_preset_before_any_number(tmp_path, quick, name):
    settings = DemoSettings.preset(quick=quick, seed=3)
    text = write_report(Layout(tmp_path / "demo"), settings, _results()).read_text(encoding="utf-8")
    assert f"Preset: {name}" in _before_any_number(text)
    if quick:
        assert "learns nothing" in _before_any_number(text)


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl"])
def test_the_report_names_the_model_family(tmp_path, family):
    settings = DemoSettings.preset(quick=True, model_family=family)
    text = write_report(Layout(tmp_path / "demo"), settings, _results()).read_text(encoding="utf-8")
    assert f"Model family: `{family}`" in text and "Preset: quick" in text
    shaped = {"llava": "LLaVA-1.5-shaped", "qwen2_5_vl": "Qwen2.5-VL-shaped"}
    assert shaped[family] in text and all(other not in text for other in set(shaped.values()) - {shaped[family]})


def test_custom_settings_say_so():
    assert DemoSettings(seed=1, stage1_epochs=9).preset_name() == "custom"
    assert DemoSettings.preset(quick=True, seed=5, threads=1).preset_name() == "quick"


def test_the_report_spells_out_each_planning_metric_once(tmp_path):
    text = write_report(Layout(tmp_path), DemoSettings.preset(quick=True), _results()).read_text(encoding="utf-8")
    for words in (
        "tool selection accuracy",
        "parameter accuracy",
        "no-tool accuracy",
        "overall planning accuracy",
    ):
        assert text.count(words) == 1, words


def test_the_chat_command_works_pasted_from_where_the_demo_ran(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    layout = Layout(Path("runs/demo"))  # --out as the user typed it
    (layout.out / SAR_IMAGE).parent.mkdir(parents=True)
    (layout.out / SAR_IMAGE).write_bytes(b"png")
    layout.model.mkdir()
    text = write_report(layout, DemoSettings.preset(quick=True), _results()).read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.startswith("geopilot chat ")]
    assert lines, "no chat command in the report"
    argv = shlex.split(lines[0])
    assert argv[:3] == ["geopilot", "chat", "--model"] and argv[3] == "runs/demo/model"
    assert argv[4] == "--image" and argv[5] == f"runs/demo/{SAR_IMAGE}" and Path(argv[5]).is_file()
    assert argv[6] == "Detect all targets in this SAR image."


def test_the_console_summary_says_the_preset_first():
    summary = _summary(_results(), DemoSettings.preset(quick=True))
    first, numbers, chains, legend = summary.splitlines()
    assert first.startswith("Preset: quick") and "learns nothing" in first
    assert numbers.startswith("planning on 27 held-out cases: TSA 0.0%")
    assert chains.startswith(
        "two-step chains on 8 chain-suite cases: chain accuracy 12.5%  (OPA 12.5%; first step 50.0%"
    )
    assert "TSA = tool selection accuracy" in legend and "OPA = overall planning accuracy" in legend


@pytest.mark.parametrize("spread", [10.0, 1.02])  # a loss that falls tenfold (log axis), a quick run's flat one
def test_the_loss_plot_has_plain_number_ticks_and_named_axes(tmp_path, monkeypatch, spread):
    """Before: log-axis ticks read 6×10⁰ and 6.38×10⁰, and a stage of one step drew nothing."""
    from geopilot.demo import report

    axes, original = [], report._figure

    def figure_kept(*args, **kwargs):
        plt, fig, ax = original(*args, **kwargs)
        axes.append(ax)
        return plt, fig, ax

    monkeypatch.setattr(report, "_figure", figure_kept)
    results = _results()
    results["stage1"]["losses"] = [[1, 6.0], [2, 6.0 / spread]]
    report.plot_losses(results, tmp_path / "loss.png")
    (ax,) = axes
    labels = [t.get_text() for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True) if t.get_text()]
    assert labels and all(re.fullmatch(r"\d+(\.\d+)?", text) for text in labels), labels
    assert "loss" in ax.get_ylabel() and "step" in ax.get_xlabel()
    assert all(float(t.get_text()).is_integer() for t in ax.get_xticklabels() if t.get_text())


def test_the_report_puts_chain_accuracy_beside_opa_with_its_breakdowns_and_draws_one_chain(tmp_path):
    text = write_report(Layout(tmp_path), DemoSettings.preset(quick=True), _results()).read_text(encoding="utf-8")
    assert "| OPA (planning, 27 cases) | chain accuracy (8 cases) |" in text
    assert "| **0.0%** | **12.5%** |" in text
    assert "| all | 8 | 50.0% | 25.0% | 12.5% | 25.0% | 12.5% |" in text  # first, second, both, answer, chain
    assert "| sar_detection_counting | 2 | 50.0% | 50.0% | 50.0% | 50.0% | 50.0% |" in text
    for words in ("chain accuracy** =", "first step** =", "second step** =", "both** =", "answer** ="):
        assert text.count(words) == 1, words
    assert "4 of them two-step chains" in text and "cloud_detection 3, sar_detection_counting 1" in text
    assert "(chats/chain.png)" in text and "`chain_cloud_detection/003`" in text
    assert "the model's calls: `remove_clouds({})`" in text


@pytest.mark.parametrize("quick", [True, False])
def test_the_report_names_the_language_model_base(tmp_path, quick):
    settings = DemoSettings.preset(quick=quick, base="smollm2")
    results = _results()
    results["data"]["vocab"] = 49153
    text = write_report(Layout(tmp_path / "demo"), settings, results).read_text(encoding="utf-8")
    assert f"Preset: {'quick' if quick else 'default'}" in _before_any_number(text)
    assert "language model: SmolLM2-135M-Instruct (`--base smollm2`)" in text
    assert "A LLaVA on SmolLM2-135M-Instruct" in text and "LoRA rank 16" in text and "trained from scratch" not in text
    scratch = write_report(Layout(tmp_path / "scratch"), DemoSettings.preset(quick=quick), _results())
    assert "language model: trained from scratch (`--base scratch`)" in scratch.read_text(encoding="utf-8")
