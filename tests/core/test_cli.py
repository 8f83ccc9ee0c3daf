"""`geopilot` console script: help, exit codes, `inspect --json` on good and bad data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers.samples import one_tool_call

from geopilot.cli import COMMANDS, main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_every_command_has_help(capsys):
    for name in COMMANDS:
        assert main([name, "--help"]) == 0
        assert "usage: geopilot " + name in capsys.readouterr().out
    assert main(["--help"]) == 0 and "init-model" in capsys.readouterr().out


def test_every_registered_command_module_imports():
    from geopilot.cli import walk

    commands = list(walk())
    assert len(commands) >= len(COMMANDS) + 10  # the eval group opened: planning, the tasks, captions, ...
    for prog, _, holder in commands:
        assert callable(holder.add_arguments) and callable(holder.run), prog


def test_eval_commands_take_key_value_overrides_like_every_command(capsys):
    """One dispatcher: `geopilot eval` goes through the same parse as the top level."""
    assert main(["eval", "rsvqa-lr", "--help"]) == 0
    assert "--data" in capsys.readouterr().out
    assert main(["eval", "nope"]) == 2
    assert "unknown command 'nope'" in capsys.readouterr().err


def test_unknown_command_and_bad_usage_exit_2(capsys):
    assert main(["frobnicate"]) == 2
    assert main(["inspect"]) == 2  # --data is required
    assert "Traceback" not in capsys.readouterr().err


def test_inspect_json_reports_trained_segments(tiny_model_dir, capsys):
    assert main(["inspect", "--data", str(EXAMPLES / "samples.jsonl"), "--model", str(tiny_model_dir), "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    *records, summary = lines
    assert summary == {"summary": {"samples": len(records), "ok": len(records), "errors": 0, "zero_trained": 0}}
    by_id = {r["id"]: r for r in records}
    tool_sample = by_id["dota/P0001/object_detection/0"]
    keys = {"id", "num_tokens", "num_trained_tokens", "trained_segments", "text", "hf_messages", "error"}
    assert set(tool_sample) == keys
    assert tool_sample["trained_segments"][0].startswith(' {"reasoning":"Counting planes needs a detector."')
    assert tool_sample["trained_segments"][1].endswith('"value":"There is 1 plane."}</s>')
    assert all(0 < r["num_trained_tokens"] < r["num_tokens"] for r in records)


def test_inspect_rows_carry_the_template_text_and_hf_messages(tiny_model_dir, capsys):
    """For every example sample: plain transformers' tokenizer of the export renders `hf_messages` to `text`, and
    its tokenisation of that text is the renderer's training ids."""
    from transformers import AutoTokenizer

    from geopilot.model import load_model, num_image_tokens
    from geopilot.render import render_sample
    from geopilot.sample import load_samples

    assert main(["inspect", "--data", str(EXAMPLES / "samples.jsonl"), "--model", str(tiny_model_dir), "--json"]) == 0
    *rows, _ = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    samples = {s.id: s for s in load_samples(EXAMPLES / "samples.jsonl")}
    assert [r["id"] for r in rows] == list(samples)
    served = AutoTokenizer.from_pretrained(tiny_model_dir)
    model, processor = load_model(tiny_model_dir)
    image_tokens, image_id = num_image_tokens(model.config), served.convert_tokens_to_ids("<image>")
    for row in rows:
        assert served.apply_chat_template(row["hf_messages"], tokenize=False) == row["text"], row["id"]
        assert row["text"].startswith("<s> A chat between") and row["text"].endswith("</s>")
        assert row["text"].count("<image>") == (samples[row["id"]].image is not None)
        ids = served.apply_chat_template(row["hf_messages"], tokenize=True, return_dict=True)["input_ids"]
        expanded = [t for token in ids for t in ([token] * image_tokens if token == image_id else [token])]
        trained = render_sample(samples[row["id"]], processor.tokenizer, image_tokens)
        assert expanded == trained.input_ids and len(expanded) == row["num_tokens"], row["id"]


def test_inspect_reports_bad_lines_and_exits_2(tmp_path, capsys):
    truncated = one_tool_call()
    truncated["id"] = "long"
    truncated["messages"][3]["value"] = "word " * 400
    data = tmp_path / "d.jsonl"
    (tmp_path / "images").mkdir()
    from PIL import Image

    Image.new("RGB", (8, 8)).save(tmp_path / "images" / "P0001.png")
    missing = one_tool_call()
    missing["id"], missing["image"] = "missing", "images/nope.png"
    data.write_text(
        "\n".join(
            [json.dumps(one_tool_call()), json.dumps(truncated), json.dumps(missing), '{"id": "x", "messages": []}']
        )
        + "\n"
    )
    assert main(["inspect", "--data", str(data), "--json", "--max-length", "900"]) == 2
    *records, summary = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert summary["summary"] == {"samples": 4, "ok": 1, "errors": 3, "zero_trained": 0}
    errors = {r["id"]: r["error"] for r in records}
    assert "exceed max_length 900" in errors["long"] and "image not found" in errors["missing"]
    assert "messages" in errors["x"]


def test_console_script_runs_as_a_subprocess():
    done = subprocess.run(
        [sys.executable, "-m", "geopilot.cli", "inspect", "--data", "/nonexistent.jsonl"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "geopilot inspect: error: data file not found: /nonexistent.jsonl"
    for group_command in (["tools", "list", "--help"], ["eval", "rsvqa-lr", "--help"]):  # tables of Commands
        done = subprocess.run([sys.executable, "-m", "geopilot.cli", *group_command], capture_output=True, text=True)
        assert done.returncode == 0 and "usage: geopilot " + " ".join(group_command[:2]) in done.stdout, done.stderr
