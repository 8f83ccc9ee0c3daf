"""`--model geopilot` for lmms-eval (docs/lmms_eval.md): a GeoPilot export answering lmms-eval's requests.

    python -m lmms_eval --model geopilot --model_args pretrained=runs/s2/export,tools_config=configs/tools.yaml \\
        --tasks geopilot_planning --include_path "$(geopilot eval lmms-tasks)" --batch_size 8

Registered through the `lmms_eval.models` entry point (`manifest`). Each request goes through the full agent loop
(`GeoPilot.chat_batch`: the tools run) or, with `agentic=false`, is plain generation (the model's first turn, as
written). A doc of GeoPilot's own tasks carries a `geopilot_request` (its image path, modality, planning case): the
reply is then the whole run as `{"geopilot_record": ...}`, which `geopilot.eval.lmms_docs` scores with the project's
metric code; any other task gets the answer text, cut at its `until` strings. Planning cases run one by one through
`eval.agents.GeoPilotAgent`, exactly as `geopilot eval planning --agent geopilot` runs them; the rest in batches.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path

from lmms_eval.api.instance import Instance
from lmms_eval.api.model import lmms

from geopilot.errors import GeoPilotError, GeoPilotInputError
from geopilot.eval.lmms_docs import PLANNING_SEED, RECORD_KEY, REQUEST_KEY, record_of

MODEL_ID = "geopilot"
log = logging.getLogger(__name__)


def manifest():
    """The `lmms_eval.models` entry point's payload: `--model geopilot` is this module's `GeoPilotLMMS`."""
    from lmms_eval.models.registry_v2 import ModelManifest

    return ModelManifest(model_id=MODEL_ID, simple_class_path=f"{__name__}.GeoPilotLMMS")


def _flag(name: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise GeoPilotInputError(f"--model_args {name}={value!r}: expected true or false")


def generation_options(gen_kwargs: dict) -> dict:
    """lmms-eval's generation kwargs as GeoPilot's `GenerationOptions` (max_new_tokens; sampling when temperature > 0)."""
    options = {"max_new_tokens": int(gen_kwargs.get("max_new_tokens") or 256)}
    temperature = float(gen_kwargs.get("temperature") or 0)
    if temperature > 0 and gen_kwargs.get("do_sample", True):
        options.update(do_sample=True, temperature=temperature, top_p=float(gen_kwargs.get("top_p") or 1.0))
    return options


def cut_at(text: str, until: list[str] | str | None) -> str:
    """`text` up to the first of the `until` strings (lmms-eval's stop sequences)."""
    stops = [until] if isinstance(until, str) else list(until or [])
    ends = [text.find(stop) for stop in stops if stop and stop in text]
    return text[: min(ends)] if ends else text


class GeoPilotLMMS(lmms):
    """model_args: pretrained (the export), agentic (default true), tools_config (real tool backends; default
    configs/tools.yaml, and the planning fixture for planning cases as in `geopilot eval planning`), max_rounds,
    device, dtype; `batch_size` comes from lmms-eval's --batch_size."""

    def __init__(
        self,
        pretrained: str,
        agentic: bool | str = True,
        tools_config: str | None = None,
        max_rounds: int = 1,
        device: str = "auto",
        dtype: str | None = None,
        batch_size: int | str = 1,
        **unknown,
    ) -> None:
        super().__init__()
        if unknown:
            raise GeoPilotInputError(f"--model_args: unknown for geopilot: {', '.join(sorted(unknown))}")
        from geopilot import GeoPilot

        path = Path(str(pretrained)).expanduser()
        if not (path / "config.json").is_file():
            raise GeoPilotInputError(f"pretrained={path}: not a GeoPilot export (no config.json in that folder)")
        try:
            self.pilot = GeoPilot.from_pretrained(path, device=device, dtype=dtype, tools_config=tools_config)
        except GeoPilotError as err:
            raise GeoPilotInputError(f"pretrained={path}: not a GeoPilot export ({err})") from None
        self.path, self.tools_config = path, tools_config
        self.agentic, self.max_rounds = _flag("agentic", agentic), int(max_rounds)
        self.batch_size = max(1, int(batch_size))
        self._planning_agent = None

    def planning_agent(self, generation: dict):
        """`geopilot eval planning`'s agent over this model: the planning fixture (or tools_config) as its tools."""
        from geopilot import GeoPilot
        from geopilot.eval.agents import GeoPilotAgent
        from geopilot.eval.toolkit import build_tool_layer

        if self._planning_agent is None:
            registry = build_tool_layer(self.tools_config)[0]
            pilot = GeoPilot(self.pilot.model, self.pilot.processor, tools=registry)
            self._planning_agent = GeoPilotAgent(str(self.path), registry, generation, pilot=pilot)
        self._planning_agent.generation = generation
        return self._planning_agent

    # -- lmms-eval's interface ------------------------------------------------------------------------------------

    def generate_until(self, requests: list[Instance]) -> list[str]:
        replies: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = defaultdict(list)  # one batch shares its generation settings
        for index, request in enumerate(requests):
            groups[json.dumps(request.args[1], sort_keys=True, default=str)].append(index)
        for indices in groups.values():
            gen_kwargs = dict(requests[indices[0]].args[1])
            generation = generation_options(gen_kwargs)
            planning = [i for i in indices if "case" in self._request(requests[i])]
            for index in planning:
                replies[index] = self._planning_reply(self._request(requests[index]), generation)
            rest = [i for i in indices if i not in planning]
            for start in range(0, len(rest), self.batch_size):
                batch = rest[start : start + self.batch_size]
                for index, reply in zip(batch, self._batch([requests[i] for i in batch], generation), strict=True):
                    replies[index] = reply
            for index in indices:  # text is cut at the stop strings; a whole run (JSON) is not text
                if record_of(replies[index]) is None:
                    replies[index] = cut_at(replies[index], gen_kwargs.get("until"))
        return replies

    def loglikelihood(self, requests):
        raise NotImplementedError("geopilot answers generate_until tasks only (an agent's reply, not a likelihood)")

    def generate_until_multi_round(self, requests):
        raise NotImplementedError("geopilot answers generate_until tasks only")

    # -- one request ------------------------------------------------------------------------------------------------

    def _doc(self, request: Instance) -> dict:
        _, _, _, doc_id, task, split = request.args
        return self.task_dict[task][split][doc_id]

    def _request(self, request: Instance) -> dict:
        """The doc's `geopilot_request` (GeoPilot's own tasks), or {} for any other task."""
        raw = self._doc(request).get(REQUEST_KEY)
        return json.loads(raw) if isinstance(raw, str) else {}

    def _chat_request(self, request: Instance) -> dict:
        own = self._request(request)
        if own:
            return {"image": own["image"], "query": own["query"], "modality": own.get("modality")}
        context, _, doc_to_visual, *_ = request.args
        visuals = [v for v in doc_to_visual(self._doc(request)) if v is not None]
        if not visuals:
            raise GeoPilotInputError(f"{request.task_name} doc {request.doc_id}: geopilot needs an image per request")
        # every visual, in order; more than max_images or several sizes: answered empty, with a logged warning why
        return {"image": visuals, "query": context.replace("<image>", "").strip()}

    def _batch(self, requests: list[Instance], generation: dict) -> list[str]:
        """One `chat_batch`; on bad input (an unreadable image) the requests again one by one, a bad one answering
        with its error, as `geopilot eval <task>` records it (`eval.predictions`)."""
        from geopilot.eval.predictions import failed_record, prediction_record

        chats = [self._chat_request(r) for r in requests]
        rounds = self.max_rounds if self.agentic else 0
        try:
            results = self.pilot.chat_batch(chats, rounds, generation)
        except GeoPilotInputError:
            results = []
            for chat in chats:
                try:
                    results.append(self.pilot.chat_batch([chat], rounds, generation)[0])
                except GeoPilotInputError as err:
                    results.append(err)
        replies = []
        for request, result in zip(requests, results, strict=True):
            doc_id = str(self._doc(request).get("id", request.doc_id))
            if isinstance(result, Exception):
                record = failed_record(doc_id, result)
                log.warning("%s doc %s: %s", request.task_name, doc_id, result)
            elif not self.agentic:
                replies.append(result.turns[0].text if result.turns else result.answer)
                continue
            else:
                record = prediction_record(doc_id, result)
            replies.append(json.dumps({RECORD_KEY: record}) if self._request(request) else record["answer"])
        return replies

    def _planning_reply(self, request: dict, generation: dict) -> str:
        from geopilot.eval.agents import geopilot_history
        from geopilot.eval.cases import Case

        case = Case.model_validate(request["case"])
        image = Path(request["image"]) if request["image"] else None
        if self.agentic:
            run = self.planning_agent(generation).run(case, [image] if image else [], PLANNING_SEED)
            return json.dumps({RECORD_KEY: {"run": run.model_dump(mode="json")}})
        chat = {"image": str(image), "query": case.query, "modality": case.modality, "history": geopilot_history(case)}
        result = self.pilot.chat_batch([chat], 0, generation)[0]
        return result.turns[0].text if result.turns else result.answer
