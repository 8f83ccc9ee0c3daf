"""The four-stage tool-trace generator (paper §2.3.3), one job at a time: `SampleGenerator`.

Per source annotation record and ability: (1) a natural user query and (2) the think turn (reasoning + the
tool call, params consistent with the annotation) come from one `plan` request; (3) the tool output is the
ground truth, produced by the annotation-backed backend (`geopilot.tools.annotations`), stored canonical in the
sample and rendered for the LLM only by `geopilot.wire.format_tool_turn`; (4) the grounded final answer comes
from one `answer` request. General understanding: GeoChat-Instruct dialogues (grounding-centred ones filtered
out) get a generated reasoning step per answer; SARLANG-1M captions become tool-free instruction dialogues.

Every reply is parsed and validated (`geopilot.data_gen.validate`); a failing reply is regenerated with the
failure named in the prompt, up to `max_regenerations` times, then the sample is dropped with its reason.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from geopilot.data_gen.abilities import (
    GENERAL,
    PAIR_ABILITIES,
    Target,
    plan_target,
    vocabulary,
)
from geopilot.data_gen.chains import (
    CHAIN_PREFIX,
    chain_messages,
    cloudy_record,
)
from geopilot.data_gen.change_traces import CHANGE_DETECTION, change_caption_messages, change_detection_messages
from geopilot.data_gen.jobs import Job, derive_seed, dialogue_kind
from geopilot.data_gen.llm import LLMClient, LLMRequest, PromptFile
from geopilot.data_gen.validate import (
    SEMANTIC,
    AnswerReply,
    Failure,
    PlanReply,
    check_answer,
    check_plan,
    first_cause,
    parse_reply,
)
from geopilot.errors import GeoPilotInputError
from geopilot.image import open_header
from geopilot.loaded_image import LoadedImage
from geopilot.records import AnnotationRecord
from geopilot.sample import IMAGE_PLACEHOLDER, Action, AssistantMessage, Sample, ToolMessage, UserMessage
from geopilot.tool_output import llm_view
from geopilot.tool_protocol import ToolRegistry
from geopilot.wire import dumps, format_tool_turn


@dataclass
class Outcome:
    job: Job
    sample: Sample | None
    meta: dict

    def entry(self) -> dict:
        return {
            "id": self.job.sample_id,
            "index": self.job.index,
            "status": "kept" if self.sample is not None else "dropped",
            "sample": self.sample.model_dump(mode="json") if self.sample is not None else None,
            "meta": self.meta,
        }


class Dropped(Exception):
    """A sample that failed validation on every attempt (or whose annotation cannot make one)."""

    def __init__(self, cause: str, detail: str):
        self.cause, self.detail = cause, detail
        super().__init__(f"{cause}: {detail}")


class SampleGenerator:
    def __init__(
        self, llm: LLMClient, prompts: dict[str, PromptFile], seed: int, max_regenerations: int, out_dir: Path
    ):
        self.llm, self.prompts, self.seed = llm, prompts, seed
        self.max_attempts = max_regenerations + 1
        self._out_abs = os.path.abspath(out_dir)  # sample images are stored relative to the shards' folder

    async def generate(self, job: Job) -> Outcome:
        meta = {
            "backend": self.llm.name,
            "model": self.llm.model,
            "attempts": {},
            "regenerations": {},
            "first_pass": {},
            "prompt_versions": {},
            "retries": {},
            "cache_hits": 0,
            "drop_reason": None,
            "drop_detail": None,
        }
        try:
            if job.ability == GENERAL:
                sample = await self._general(job, meta)
            elif job.ability.startswith(CHAIN_PREFIX):
                sample = self._chain_sample(job, meta)
            elif job.ability in PAIR_ABILITIES:
                sample = self._pair_sample(job, meta)
            else:
                sample = await self._tool_sample(job, meta)
        except Dropped as drop:
            meta["drop_reason"], meta["drop_detail"] = drop.cause, drop.detail[:500]
            return Outcome(job, None, meta)
        return Outcome(job, sample, meta)

    # -- the ask / validate / regenerate loop ---------------------------------------------------------------------
    async def _ask(self, job: Job, stage: str, facts: dict, values: dict, check, meta: dict):
        prompt = self.prompts[stage]
        meta["prompt_versions"][stage] = prompt.version
        feedback = ""
        failures: list[Failure] = []
        for attempt in range(self.max_attempts):
            messages = prompt.render({**values, "facts": dumps(facts), "feedback": feedback})
            request = LLMRequest(
                stage, messages, facts, derive_seed(self.seed, job.sample_id, stage, attempt), prompt.version
            )
            text, info = await self.llm.complete(request)
            meta["attempts"][stage] = attempt + 1
            meta["cache_hits"] += int(info.cached)
            for cause, n in info.retries.items():
                meta["retries"][cause] = meta["retries"].get(cause, 0) + n
            reply, parse_failure = parse_reply(stage, text)
            failures = [parse_failure] if parse_failure else check(reply)
            if attempt == 0:
                self._first_pass(meta, stage, reply, failures)
            if not failures:
                return reply
            worst = first_cause(failures)
            if attempt + 1 < self.max_attempts:
                meta["regenerations"][worst.cause] = meta["regenerations"].get(worst.cause, 0) + 1
            feedback = f"Your previous reply was rejected ({worst.cause}): {worst.detail[:300]}. Reply again, following every rule."
        worst = first_cause(failures)
        raise Dropped(worst.cause, worst.detail)

    @staticmethod
    def _first_pass(meta: dict, stage: str, reply, failures: list[Failure]) -> None:
        """Record the first attempt's result per semantic dimension this stage checks; a reply that does not even
        parse is a structural failure and is not judged semantically."""
        dims = {"plan": SEMANTIC[:3], "answer": SEMANTIC[3:], "caption_dialogue": SEMANTIC[:1], "reasoning": ()}[stage]
        causes = {f.cause for f in failures}
        for dim in dims if reply is not None else ():
            meta["first_pass"][dim] = dim not in causes
        meta["first_pass"][f"structural_{stage}"] = not (causes - set(SEMANTIC))

    # -- tool-augmented samples -------------------------------------------------------------------------------------
    def _registry(self, record: AnnotationRecord, root: Path) -> ToolRegistry:
        """The ten tools answering from `record` (provenance "annotations"): the same `ToolRegistry` that serves
        inference validates the plan's calls and runs the annotation's call."""
        from geopilot.tools.registry import annotation_registry

        return annotation_registry(record, root)

    async def _tool_sample(self, job: Job, meta: dict) -> Sample:
        record = job.record
        rng = random.Random(derive_seed(self.seed, job.sample_id, "target"))
        target = plan_target(job.ability, record, rng)
        registry = self._registry(target.record, job.root)
        tool = registry.get(target.tool)
        facts = {
            "stage": "plan",
            "sample_id": job.sample_id,
            "ability": job.ability,
            "difficulty": target.difficulty,
            "modality": record.modality,
            "source": record.source,
            "tool": target.tool,
            "params": target.params,
            **target.facts,
        }
        values = {
            "tool": target.tool,
            "tool_description": tool.description,
            "difficulty": target.difficulty,
            "params": dumps(target.params),
            "schema": _schema_text(tool.params_model),
            "modality": record.modality,
            "source": record.source,
            "ability": job.ability,
        }
        plan: PlanReply = await self._ask(
            job, "plan", facts, values, lambda r: check_plan(r, target, record.modality, registry), meta
        )
        action = Action(tool=target.tool, params=target.params)  # the annotation's canonical spelling
        result = registry.call(action, self._image(job), record.modality)
        if not result.ok:
            raise Dropped("annotation_unusable", str(result.error))
        output = result.output
        meta["tool_provenance"] = output.provenance
        query = " ".join(plan.query.replace(IMAGE_PLACEHOLDER, " ").split())  # the sample adds the one placeholder
        answer_facts = {
            "stage": "answer",
            "sample_id": job.sample_id,
            "ability": job.ability,
            "tool": target.tool,
            "params": target.params,
            "query": query,
            "view": llm_view(output),
        }
        answer_values = {
            "tool": target.tool,
            "query": query,
            "tool_turn": format_tool_turn([(target.tool, output)], query),
        }
        names = vocabulary(record)
        answer: AnswerReply = await self._ask(
            job, "answer", answer_facts, answer_values, lambda r: check_answer(r, output, target, names, query), meta
        )
        messages = [
            UserMessage(content=f"{IMAGE_PLACEHOLDER}\n{query}"),
            AssistantMessage(reasoning=plan.reasoning.strip(), actions=[action], value=None),
            ToolMessage(name=target.tool, content=output),
            AssistantMessage(reasoning=answer.reasoning.strip(), actions=[], value=answer.answer.strip()),
        ]
        return self._sample(job, target, messages)

    def _chain_sample(self, job: Job, meta: dict) -> Sample:
        """A two-step chain trace (geopilot.data_gen.chains); a cloud chain's cloudy image is written under the
        output folder (`chain_images/`), its clean original stays the cloud-free image."""
        kind = job.ability[len(CHAIN_PREFIX) :]
        record = job.record
        if kind == "cloud_detection":
            name = job.sample_id.replace("/", "_")
            record = cloudy_record(record, Path(self._out_abs) / "chain_images", name, derive_seed(self.seed, name))
        rng = random.Random(derive_seed(self.seed, job.sample_id, "chain"))
        chain_job = Job(job.index, job.sample_id, record, job.root, job.ability, job.k)
        try:
            messages = chain_messages(kind, record, self._image(chain_job), rng)
        except ValueError as err:  # the annotation cannot make this chain (a tool of it has no ground truth)
            raise Dropped("annotation_unusable", str(err)) from None
        meta["tool_provenance"] = "annotations"
        meta["chain"] = kind
        return self._sample(chain_job, None, messages)

    def _pair_sample(self, job: Job, meta: dict) -> Sample:
        """A two-image trace (geopilot.data_gen.change_traces): change detection answered from the pair's label (the
        after image with its unchanged pixels black is written under `change_images/`), or change captioning."""
        record = job.record
        rng = random.Random(derive_seed(self.seed, job.sample_id, "pair"))
        difficulty = None
        try:
            if job.ability == CHANGE_DETECTION:
                artifact = Path(self._out_abs) / "change_images" / f"{job.sample_id.replace('/', '_')}.png"
                messages, difficulty = change_detection_messages(record, rng, artifact)
                meta["tool_provenance"] = "annotations"
            else:
                messages = change_caption_messages(record, job.k, rng)
        except (OSError, ValueError) as err:  # an unreadable label, or one of another size than the images
            raise Dropped("annotation_unusable", str(err)) from None
        root = job.root
        images = [Path(p) if Path(p).is_absolute() else root / p for p in (record.image, record.after_image)]
        try:
            return Sample(
                id=job.sample_id,
                images=[os.path.relpath(os.path.abspath(p), self._out_abs) for p in images],
                modality=record.modality,
                source=record.source,
                ability=job.ability,
                difficulty=difficulty,
                messages=messages,
            )
        except ValueError as err:
            raise Dropped("sample_schema", str(err)) from None

    @staticmethod
    def _image_path(job: Job) -> Path:
        image = Path(job.record.image)
        return image if image.is_absolute() else job.root / image

    def _image(self, job: Job) -> LoadedImage:
        """The record's image for the tool call, its header read and the file closed again: the annotation tools
        read no pixels, only the size the registry checks against `max_pixels` (decoding a large scene per sample
        would stall the event loop)."""
        path = self._image_path(job)
        try:
            with open_header(path, str(path)) as header:
                pass
        except GeoPilotInputError as err:
            raise Dropped("annotation_unusable", f"image {path} cannot be opened: {err}") from None
        return LoadedImage(image=header, source_size=header.size)

    def _sample(self, job: Job, target: Target | None, messages: list) -> Sample:
        image = self._image_path(job)
        try:
            return Sample(
                id=job.sample_id,
                image=os.path.relpath(os.path.abspath(image), self._out_abs),
                modality=job.record.modality,
                source=job.record.source,
                ability=job.ability,
                difficulty=target.difficulty if target is not None else None,
                messages=messages,
            )
        except ValueError as err:  # pydantic's ValidationError: a sample that breaks the schema is never kept
            raise Dropped("sample_schema", str(err)) from None

    # -- general understanding (tool-free) --------------------------------------------------------------------------
    async def _general(self, job: Job, meta: dict) -> Sample:
        dialogue = job.record.dialogues[job.k]
        turns = [(role, text.replace(IMAGE_PLACEHOLDER, "").strip()) for role, text in dialogue.turns]
        facts = {"stage": "", "sample_id": job.sample_id, "source": job.record.source}
        values = {"source": job.record.source}
        if dialogue_kind(dialogue) == "caption":
            caption = next((text for role, text in reversed(turns) if role == "assistant"), turns[-1][1])
            facts.update(stage="caption_dialogue", caption=caption)
            reply = await self._ask(job, "caption_dialogue", facts, values, _check_caption_dialogue, meta)
            pairs = [(reply.query.strip(), reply.reasoning.strip(), caption)]
        else:
            while turns and turns[-1][0] != "assistant":
                turns.pop()
            roles = [role for role, _ in turns]
            if not turns or roles != ["user", "assistant"] * (len(turns) // 2):
                raise Dropped("malformed_dialogue", f"turns must alternate user/assistant, got {roles}")
            facts.update(stage="reasoning", turns=[list(t) for t in turns])
            n = len(turns) // 2
            reply = await self._ask(
                job, "reasoning", facts, {**values, "turns": str(n)}, lambda r: _check_reasoning(r, n), meta
            )
            pairs = [(turns[2 * i][1], reply.reasoning[i].strip(), turns[2 * i + 1][1]) for i in range(n)]
        messages = []
        for i, (question, reasoning, answer) in enumerate(pairs):
            messages.append(UserMessage(content=f"{IMAGE_PLACEHOLDER}\n{question}" if i == 0 else question))
            messages.append(AssistantMessage(reasoning=reasoning, actions=[], value=answer))
        return self._sample(job, None, messages)


@cache
def _schema_text(params_model) -> str:
    return dumps(params_model.model_json_schema())


def _check_caption_dialogue(reply) -> list[Failure]:
    words = reply.query.split()
    if not 2 <= len(words) <= 80 or "{" in reply.query:
        return [Failure("query_answerability", f"query {reply.query[:80]!r} is not a short natural request")]
    return []


def _check_reasoning(reply, turns: int) -> list[Failure]:
    if len(reply.reasoning) != turns or not all(r.strip() for r in reply.reasoning):
        return [Failure("reply_schema", f"expected {turns} non-empty reasoning strings, got {len(reply.reasoning)}")]
    return []


# ---- the run ------------------------------------------------------------------------------------------------------
