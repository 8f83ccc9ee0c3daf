"""GeoPilotBench as lmms-eval tasks (docs/lmms_eval.md): the docs each task reads from a local folder, and each
reply scored by the project's own metric code, so one set of predictions scores the same here and in `geopilot eval`.

The task YAMLs in `geopilot/eval/lmms_tasks/` call these through their `utils.py`:

  docs(task)                 the task's rows: a benchmark folder's items (`eval.loaders`) or the planning cases
  doc_to_visual / doc_to_text  the image and the prompt any lmms-eval model reads
  process_results            one reply -> the prediction record `geopilot eval` writes (`eval.predictions`)
  metric(name, key, rows)    the records of a run -> `TASKS[name].score` (or the planning scorer), one number

A reply is either plain text (any model, or `geopilot` with `agentic=false`) or the JSON `{"geopilot_record": ...}`
the `geopilot` model class returns for a doc carrying a `geopilot_request`: the whole agent run, tool calls included.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from geopilot.eval.loaders.common import BenchmarkError, EvalItem, Loaded

RECORD_KEY = "geopilot_record"
REQUEST_KEY = "geopilot_request"
PLANNING = "geopilot_planning"
PLANNING_SEED = 42  # the first of `geopilot eval planning`'s default seeds
BENCHMARKS = {  # lmms-eval task -> `geopilot eval` task (geopilot.eval.benchmark_tasks.TASKS)
    "geopilot_rsvqa_lr": "rsvqa-lr",
    "geopilot_rsvqa_hr": "rsvqa-hr",
    "geopilot_referring": "referring",
    "geopilot_sar_vqa": "sar-vqa",
    "geopilot_captions": "sar-caption",
}


def data_variable(task: str) -> str:
    """The environment variable naming a task's local data: GEOPILOT_<TASK>_DATA (geopilot_rsvqa_lr -> ..._RSVQA_LR_)."""
    return f"{task.upper()}_DATA"


def data_path(task: str) -> Path | None:
    """The task's data folder (or case file) from its variable; None only for planning (the shipped set)."""
    variable = data_variable(task)
    value = os.environ.get(variable, "").strip()
    if not value:
        if task == PLANNING:
            return None
        raise BenchmarkError(f"{task}: set {variable} to the benchmark's local folder (docs/lmms_eval.md)")
    path = Path(value).expanduser()
    if not path.exists():
        raise BenchmarkError(f"{task}: {variable}={value!r} does not exist")
    return path.resolve()


# -- docs -----------------------------------------------------------------------------------------------------------


def docs(task: str) -> list[dict]:
    """The rows of a task, every value a string (Arrow-friendly): what the model reads and what scoring needs."""
    if task == PLANNING:
        return _planning_docs()
    from geopilot.eval.benchmark_tasks import TASKS

    loaded = TASKS[BENCHMARKS[task]].load(data_path(task))
    return [_item_doc(task, item) for item in loaded.items]


def _item_doc(task: str, item: EvalItem) -> dict:
    request = {"image": item.image, "query": item.prompt, "modality": item.modality}
    return {
        "task": task,
        "id": item.id,
        "image": item.image,
        "prompt": item.prompt,
        "item": json.dumps(asdict(item)),
        REQUEST_KEY: json.dumps(request),
    }


def _planning_docs() -> list[dict]:
    from geopilot.eval.cases import load_cases
    from geopilot.eval.planning_set import PLANNING_FILE

    path = data_path(PLANNING) or PLANNING_FILE
    case_set = load_cases(path)
    prompt = _planning_prompt()
    rows = []
    for case in case_set.cases:
        image = case_set.image_path(case)
        history = "".join(f"{turn.role.upper()}: {turn.content}\n" for turn in case.history)
        request = {"image": str(image) if image else None, "case": case.model_dump(mode="json")}
        rows.append(
            {
                "task": PLANNING,
                "id": case.id,
                "image": str(image) if image else "",
                "prompt": f"{prompt}\n\n{history}{case.query}",
                "item": case.model_dump_json(),
                REQUEST_KEY: json.dumps(request),
            }
        )
    return rows


def _planning_prompt() -> str:
    """The tool prompt every prompted agent of `geopilot eval planning` reads (the planning fixture's tools)."""
    from geopilot.eval.toolkit import build_tool_layer, tool_prompt

    return tool_prompt(build_tool_layer()[0])


def doc_to_visual(doc: dict) -> list:
    from geopilot.image import load_image

    return [load_image(doc["image"]).image] if doc["image"] else []


def doc_to_text(doc: dict) -> str:
    return doc["prompt"]


# -- results --------------------------------------------------------------------------------------------------------


def record_of(reply: str) -> dict | None:
    """The agent record inside a `geopilot` reply, or None for a plain-text reply."""
    try:
        value = json.loads(reply)
    except (TypeError, ValueError):
        return None
    return value.get(RECORD_KEY) if isinstance(value, dict) and isinstance(value.get(RECORD_KEY), dict) else None


def _plain_record(doc_id: str, reply: str) -> dict:
    """A plain reply as a prediction record: the answer the universal parser reads in it (its text otherwise)."""
    from geopilot.eval.tool_calls import parse_reply

    parsed = parse_reply(reply)
    answer = parsed.answer if parsed.ok and parsed.answer is not None else reply
    return {"id": doc_id, "answer": answer, "outcome": "plain", "error": None, "tool_calls": []}


def _planning_run(doc: dict, reply: str) -> dict:
    """A planning reply as an `AgentRun`: the geopilot model's own run, or one plain reply whose calls go through
    the planning fixture (validated as `geopilot eval planning` validates them; one round, as the model wrote it)."""
    from geopilot.eval.agents import RAW_CHARS, execute
    from geopilot.eval.cases import Case
    from geopilot.eval.scorer import AgentRun
    from geopilot.eval.tool_calls import parse_reply
    from geopilot.eval.toolkit import build_tool_layer
    from geopilot.image import load_image
    from geopilot.tool_protocol import ChatCalls

    record = record_of(reply)
    if record is not None:
        return AgentRun.model_validate(record["run"]).model_dump(mode="json")
    case = Case.model_validate_json(doc["item"])
    parsed = parse_reply(reply)
    run = AgentRun(dialect=parsed.dialect, raw=reply[:RAW_CHARS], parse_error=parsed.error, answer=parsed.answer)
    if parsed.ok and parsed.calls:
        images = [load_image(doc["image"])] if doc["image"] else []
        run.calls, _ = execute(build_tool_layer()[0], parsed, images, case, 1, ChatCalls())
        run.rounds = 1
    elif not parsed.ok:
        run.answer = reply
    return run.model_dump(mode="json")


def process_results(doc: dict, results: list[str]) -> dict:
    """One doc's reply -> the same value under every metric of its task (`metric` scores them all together)."""
    reply = results[0] if results else ""
    if doc["task"] == PLANNING:
        value = {"doc": doc, "run": _planning_run(doc, reply)}
        names = PLANNING_METRICS
    else:
        value = {"doc": doc, "record": {**(record_of(reply) or _plain_record(doc["id"], reply)), "id": doc["id"]}}
        names = TASK_METRICS[doc["task"]]
    return dict.fromkeys(names, value)


# -- metrics --------------------------------------------------------------------------------------------------------

PLANNING_METRICS = ("TSA", "PA", "NTA", "OPA")
VQA_METRICS = ("mean_of_types", "pooled")
TASK_METRICS = {
    "geopilot_rsvqa_lr": VQA_METRICS,
    "geopilot_rsvqa_hr": VQA_METRICS,
    "geopilot_sar_vqa": VQA_METRICS,
    "geopilot_referring": ("Acc@0.5",),
    "geopilot_captions": ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr"),
}


def planning_rows(values: list[dict]) -> list[dict]:
    """Scored rows in the shape of `geopilot eval planning`'s results.jsonl (one seed)."""
    from geopilot.eval.cases import Case
    from geopilot.eval.scorer import AgentRun, score

    rows = []
    for value in values:
        case = Case.model_validate_json(value["doc"]["item"])
        scored = score(case, AgentRun.model_validate(value["run"]))
        rows.append({"case_id": case.id, "seed": PLANNING_SEED, "score": scored.model_dump(mode="json")})
    return rows


def task_metrics(values: list[dict]) -> dict:
    """Every metric of a benchmark task, by `geopilot.eval.benchmark_tasks.TASKS[...].score` over these records."""
    from geopilot.eval.benchmark_tasks import TASKS

    task = values[0]["doc"]["task"]
    items = [EvalItem(**json.loads(value["doc"]["item"])) for value in values]
    records = {value["record"]["id"]: value["record"] for value in values}
    return TASKS[BENCHMARKS[task]].score(Loaded(task, items), records, {})


def metric(key: str, values: list[dict]) -> float | None:
    """One number of a run: a planning metric (mean over the seed, as summary.json) or a key of the task's metrics."""
    if values[0]["doc"]["task"] == PLANNING:
        from geopilot.eval.metrics import metric_stats

        return metric_stats(planning_rows(values), key, with_ci=False)["mean"]
    return task_metrics(values)[key]
