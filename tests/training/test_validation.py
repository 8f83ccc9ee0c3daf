"""Validation during training (issue 26 item 1): held-out loss equals a hand computation, planning scores equal
`geopilot eval planning` on the exported weights, keep_best keeps the best evaluated step, metrics.jsonl rows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from train_helpers import stage1_args

import train
from geopilot.batch import collate
from geopilot.cli import main as cli_main
from geopilot.data_gen.synthetic.samples import write_demo_dataset
from geopilot.eval.cases import load_cases
from geopilot.eval.planning_set import PLANNING_FILE
from geopilot.model import load_model
from geopilot.render import Rendered, render_sample
from geopilot.sample import load_samples, write_samples
from geopilot.training.tracking import read_metrics

STEPS = 4
LOGGED = {
    "train/loss",
    "train/lr",
    "train/epoch",
    "train/grad_norm",
    "perf/tokens_per_s",
    "perf/samples_per_s",
    "perf/useful_token_fraction",
    "perf/tflops_per_device",
    "time/data_s",
    "time/forward_backward_s",
    "time/optimizer_s",
}


def held_out(tmp: Path, optical: int, sar: int, seed: int = 7) -> Path:
    """Demo samples under ids no training sample has."""
    path = write_demo_dataset(tmp, optical=optical, sar=sar, seed=seed, file_name="raw.jsonl")
    samples = [s.model_copy(update={"id": f"heldout/{s.id}"}) for s in load_samples(path)]
    write_samples(samples, tmp / "eval.jsonl")
    return tmp / "eval.jsonl"


def planning_subset(tmp: Path) -> Path:
    """Two tool cases and two no-tool cases of the frozen planning set (NTA is defined, TSA is not trivially 0)."""
    planning = load_cases(PLANNING_FILE)
    tool = [c for c in planning.cases if c.expected_tools][:2]
    no_tool = [c for c in planning.cases if not c.expected_tools][:2]
    path = tmp / "cases.jsonl"
    path.write_text(
        "".join(
            c.model_copy(update={"image": str(planning.image_path(c))}).model_dump_json() + "\n" for c in tool + no_tool
        )
    )
    return path


@pytest.fixture(scope="module")
def evaluated(dataset, tmp_path_factory):
    base = tmp_path_factory.mktemp("validation")
    eval_file, cases = held_out(base / "heldout", optical=1, sar=1), planning_subset(base)
    out = base / "run"
    args = stage1_args(
        dataset,
        out,
        f"optim.max_steps={STEPS}",
        f"data.eval_files=[{eval_file}]",
        "eval.every_steps=2",
        f"eval.planning_cases={cases}",
        "eval.planning_max_new_tokens=32",
        "checkpoint.keep_best=val_loss",
        "checkpoint.keep_last=1",
        "checkpoint.save_steps=100",
    )
    assert train.main(args) == 0
    return out, eval_file, cases


def test_validation_loss_equals_the_hand_computed_loss(evaluated):
    out, eval_file, _ = evaluated
    model, processor = load_model(out / "export")
    samples = list(load_samples(eval_file))
    from geopilot.image import load_image
    from geopilot.model import num_image_tokens

    def loss_of(chosen) -> tuple[float, int]:
        rendered = [render_sample(s, processor.tokenizer, num_image_tokens(model.config), 1024) for s in chosen]
        batch = collate([Rendered(r.input_ids, r.labels) for r in rendered], processor.tokenizer.pad_token_id)
        images = [load_image(s.image_path(eval_file.parent)).image for s in chosen]
        batch["pixel_values"] = processor.image_processor(images, return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            loss = model(**batch).loss.item()  # transformers' own mean over the target tokens of the batch
        return loss, int((batch["labels"][:, 1:] != -100).sum())

    final = read_metrics(out)[-1]
    assert final["step"] == STEPS
    both, _ = loss_of(samples)
    assert final["val/loss"] == pytest.approx(both, abs=1e-5)
    for sample in samples:
        alone, _ = loss_of([sample])
        assert final[f"val/loss/modality/{sample.modality}"] == pytest.approx(alone, abs=1e-5)
        assert final[f"val/loss/source/{sample.source}"] == pytest.approx(alone, abs=1e-5)
    assert final["val/loss/ability/counting"] == pytest.approx(both, abs=1e-5)
    info = json.loads((out / "export/geopilot_train.json").read_text())
    assert info["validation"]["last"]["val/loss"] == final["val/loss"]


def test_planning_scores_equal_geopilot_eval_planning(evaluated, tmp_path, capsys):
    out, _, cases = evaluated
    args = ["eval", "planning", "--agent", "geopilot", "--model", str(out / "export"), "--cases", str(cases)]
    args += ["--seeds", "42", "--out", str(tmp_path / "planning"), "--max-new-tokens", "32", "--device", "cpu"]
    assert cli_main([*args, "--json"]) == 0
    summary = json.loads((tmp_path / "planning" / "summary.json").read_text())
    final = read_metrics(out)[-1]
    for metric in ("TSA", "PA", "NTA", "OPA"):
        assert final.get(f"val/planning/{metric}") == summary[metric], metric
    assert final["val/planning/NTA"] is not None and final["val/planning/infra_errors"] == 0


def test_keep_best_keeps_the_best_evaluated_step_beside_the_latest(evaluated):
    out, *_ = evaluated
    evaluations = {row["step"]: row["val/loss"] for row in read_metrics(out) if "val/loss" in row}
    assert sorted(evaluations) == [2, 4]
    best_step = min(evaluations, key=evaluations.get)
    checkpoints = out / "checkpoints"
    assert (checkpoints / "best").read_text().strip() == f"step-{best_step:08d}"
    assert sorted(p.name for p in checkpoints.glob("step-*")) == sorted({f"step-{best_step:08d}", "step-00000004"})
    state = json.loads((checkpoints / f"step-{best_step:08d}" / "trainer_state.json").read_text())
    assert state["best"] == {"step": best_step, "metric": "val_loss", "value": evaluations[best_step]}


def test_metrics_jsonl_has_one_row_per_logging_step_with_the_logged_keys(evaluated):
    out, *_ = evaluated
    rows = read_metrics(out)
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1))  # logging_steps=1
    for row in rows:
        assert LOGGED <= set(row), LOGGED - set(row)
        assert 0 < row["perf/useful_token_fraction"] <= 1 and math.isfinite(row["train/grad_norm"])
        assert any(key.startswith("train/loss/source/") for key in row)
    assert {"val/loss", "val/planning/OPA", "time/eval_s"} <= set(rows[1])
    assert "val/loss" not in rows[0]


def test_overlapping_eval_file_is_warned_with_the_count(dataset, tmp_path, caplog):
    out = tmp_path / "run"
    with caplog.at_level("WARNING", logger="geopilot.train"):
        assert train.main(stage1_args(dataset, out, "optim.max_steps=1", f"data.eval_files=[{dataset}]")) == 0
    assert "24 of 36 held-out sample ids are also in the training set" in caplog.text


def test_empty_eval_file_exits_2(dataset, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert train.main(stage1_args(dataset, tmp_path / "run", "optim.max_steps=1", f"data.eval_files=[{empty}]")) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the training set's cache progress
    assert last == f"train.py: error: data.eval_files: {empty} holds no valid sample (an empty held-out set)"


def test_keep_best_without_held_out_data_is_refused(dataset, tmp_path, capsys):
    assert train.main(stage1_args(dataset, tmp_path / "run", "checkpoint.keep_best=val_loss")) == 2
    assert "checkpoint.keep_best=val_loss needs held-out data" in capsys.readouterr().err
