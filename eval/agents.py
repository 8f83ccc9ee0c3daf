"""The agents under test. Each turns (case, images, seed) into an `AgentRun`: the calls the tool layer saw, the
answer, rounds, tokens and latency. The tool layer (geopilot.eval.toolkit) is the same for all of them.

  geopilot  a GeoPilot checkpoint in-process (`GeoPilot.from_pretrained(DIR).chat`): its own wire format
  openai    any OpenAI-compatible chat endpoint with image input; tools in the prompt or as OpenAI functions
  hf        a local transformers VLM directory (AutoModelForImageTextToText + its processor's chat template)
The openai and hf agents read the same tool prompt, parse replies with the universal parser
(geopilot.eval.tool_calls), run the calls through the registry and send the outputs back (THE formatter,
`geopilot.wire.format_tool_turn`, or OpenAI `tool` messages) until the model answers or `max_rounds` is spent.
"""

from __future__ import annotations

import asyncio
import base64
import json
import mimetypes
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from geopilot.errors import GeoPilotInputError
from geopilot.eval.cases import Case
from geopilot.eval.scorer import AgentRun, CallRecord
from geopilot.eval.tool_calls import ParsedReply, parse_reply
from geopilot.eval.toolkit import openai_tools, sha256_text, tool_prompt
from geopilot.image import load_image
from geopilot.loaded_image import LoadedImage
from geopilot.sample import Action
from geopilot.tool_chains import ChatCalls
from geopilot.tool_output import llm_view
from geopilot.tool_protocol import ToolRegistry
from geopilot.tool_result import ToolResult
from geopilot.wire import dumps, format_tool_turn

RAW_CHARS = 2000
MAX_RESPONSE_BYTES = 8 * 2**20  # an OpenAI chat completion of a few thousand tokens is kilobytes; more is refused


class InfraError(Exception):
    """The agent could not produce a reply for reasons outside the model: timeout, endpoint failure, crash."""


class Reply:
    """One model turn: its text, OpenAI tool_calls (raw), and token counts."""

    def __init__(
        self,
        text: str | None,
        tool_calls: list | None = None,
        tokens_in: int = 0,
        tokens_out: int = 0,
        cost_usd: float | None = None,
    ):
        self.text, self.tool_calls = text, tool_calls or []
        self.tokens_in, self.tokens_out, self.cost_usd = tokens_in, tokens_out, cost_usd


def execute(
    registry: ToolRegistry,
    parsed: ParsedReply,
    images: list[LoadedImage],
    case: Case,
    round_: int,
    chat: ChatCalls | None = None,
):
    """Run the parsed calls of one round through the registry; (call records, tool results) in call order. `chat`:
    the run's calls so far, what a `result:N` reference resolves against (the round is closed here). `images`: the
    case's images in order (a two-image tool reads both, docs/design.md §4)."""
    first, several = (images[0] if images else None), ({"images": images} if len(images) > 1 else {})
    records, results = [], []
    for call in parsed.calls:
        try:
            action = Action(tool=call.tool, params=call.params)
            result = registry.call(action, first, case.modality, calls=chat, **several)
            if chat is not None:
                chat.record(result, registry.params_key(action))
        except Exception as err:  # noqa: BLE001 - Action itself can reject an empty name
            result = ToolResult(call.tool or "?", dict(call.params), error=str(err), error_kind="unknown_tool")
            if chat is not None:
                chat.record(result)
        results.append(result)
        records.append(
            CallRecord(
                tool=call.tool,
                params=dict(call.params),
                ok=result.ok,
                error_kind=result.error_kind,
                error=result.error,
                round=round_,
            )
        )
    if chat is not None:
        chat.close_round()
    return records, results


def tool_loop(
    case: Case,
    images: list[LoadedImage],
    registry: ToolRegistry,
    ask: Callable[[], Reply],
    add_turn: Callable[[Reply, ParsedReply, list[ToolResult]], None],
) -> AgentRun:
    """Ask, parse, run the calls, send the outputs back; until an answer or max_rounds tool rounds."""
    run = AgentRun(dialect="empty")
    chat = ChatCalls()  # the run's calls: what a later round's `result:N` names
    started = time.perf_counter()
    cost: float | None = 0.0
    for round_ in range(1, case.max_rounds + 2):
        reply = ask()
        run.tokens_in += reply.tokens_in
        run.tokens_out += reply.tokens_out
        cost = None if cost is None or reply.cost_usd is None else cost + reply.cost_usd
        parsed = parse_reply(reply.text, reply.tool_calls)
        if round_ == 1:
            run.raw = (reply.text or "")[:RAW_CHARS] or dumps(reply.tool_calls)[:RAW_CHARS]
            run.dialect, run.parse_error = parsed.dialect, parsed.error
        if not parsed.ok or not parsed.calls:
            run.answer = parsed.answer if parsed.ok else (reply.text or None)
            break
        if round_ > case.max_rounds:  # still asking for tools: recorded, not run
            run.rounds = round_
            run.calls += [
                CallRecord(
                    tool=c.tool,
                    params=c.params,
                    ok=False,
                    error_kind="round_limit",
                    error="over max_rounds",
                    round=round_,
                )
                for c in parsed.calls
            ]
            run.answer = parsed.answer
            break
        records, results = execute(registry, parsed, images, case, round_, chat)
        run.calls += records
        run.rounds = round_
        add_turn(reply, parsed, results)
    run.latency_s = time.perf_counter() - started
    run.cost_usd = cost if cost else None
    return run


def _history(case: Case) -> list[dict]:
    """A case's earlier exchange as chat messages (text only), oldest first."""
    return [{"role": turn.role, "content": turn.content} for turn in case.history]


def _failed_run(err: Exception, started: float) -> AgentRun:
    return AgentRun(
        dialect="empty", infra_error=f"{type(err).__name__}: {err}"[:500], latency_s=time.perf_counter() - started
    )


# -- geopilot -----------------------------------------------------------------------------------------------------


def geopilot_history(case: Case) -> list[dict] | None:
    """A case's earlier exchange in GeoPilot's sample format (an assistant turn is a direct answer), or None."""
    history = [
        {"role": "user", "content": t.content}
        if t.role == "user"
        else {"role": "assistant", "reasoning": "", "actions": [], "value": t.content}
        for t in case.history
    ]
    return history or None


class GeoPilotAgent:
    name = "geopilot"

    def __init__(
        self,
        model: str,
        registry: ToolRegistry,
        generation: dict,
        device: str = "auto",
        pilot=None,
        constrain_plans: bool = True,
    ):
        from geopilot.agent import GeoPilot
        from geopilot.wire import SYSTEM_PROMPT

        if pilot is None and not Path(model).is_dir():
            raise GeoPilotInputError(f"--model {model!r} is not a model directory")
        self.pilot = pilot or GeoPilot.from_pretrained(
            model, tools=registry, device=device, constrain_plans=constrain_plans
        )
        self.generation = generation
        self.prompt_hash = sha256_text(SYSTEM_PROMPT)
        self.config = {"agent": self.name, "model": str(Path(model).resolve()), "generation": generation}
        if not self.pilot.constrain_plans:  # a different run: the ablation never resumes a constrained one
            self.config["constrain_plans"] = False

    def run(self, case: Case, images: list[Path], seed: int) -> AgentRun:
        import torch

        started = time.perf_counter()
        try:
            torch.manual_seed(seed)
            result = self.pilot.chat(
                **chat_request(case, images), max_rounds=case.max_rounds, generation=self.generation
            )
        except Exception as err:  # noqa: BLE001 - an agent crash is an infra error of this row, not of the run
            return _failed_run(err, started)
        return agent_run(case, result)

    def run_batch(self, cases: list[Case], images_per_case: list[list[Path]], seed: int) -> list[AgentRun]:
        """The cases (one max_rounds: the runner's chunks share it) through one `GeoPilot.chat_batch`, seeded once;
        a crash of the batch (one unreadable image fails it before anything is generated) runs them one by one, so
        a bad case is one infra-error row. A row's latency is its request's wall time inside the batch."""
        import torch

        if len({case.max_rounds for case in cases}) > 1:
            raise ValueError("run_batch: the cases of one batch must share max_rounds")
        if not cases:
            return []
        requests = [chat_request(case, images) for case, images in zip(cases, images_per_case, strict=True)]
        try:
            torch.manual_seed(seed)
            results = self.pilot.chat_batch(requests, max_rounds=cases[0].max_rounds, generation=self.generation)
        except Exception:  # noqa: BLE001 - the batch's crash is some case's: each is tried alone
            return [self.run(case, images, seed) for case, images in zip(cases, images_per_case, strict=True)]
        return [agent_run(case, result) for case, result in zip(cases, results, strict=True)]


def chat_request(case: Case, images: list[Path]) -> dict:
    """A case as `GeoPilot.chat`'s arguments, which are also a `chat_batch` request's keys."""
    return {
        "image": [str(image) for image in images],  # in order: a change case's before, after
        "query": case.query,
        "history": geopilot_history(case),
        "modality": case.modality,
    }


def agent_run(case: Case, result) -> AgentRun:
    """A GeoPilot `ChatResult` as the scorer's AgentRun."""
    parsed_turns = [t for t in result.turns if t.parse != "failed"]
    if result.outcome == "unparsable" or not parsed_turns:
        dialect = "unparsable"
    else:
        dialect = "llava_plus" if parsed_turns[0].parse == "llava_plus" else "geopilot_json"
    rounds = max((c.round for c in result.tool_calls), default=0)
    if result.outcome == "round_limit":
        rounds = case.max_rounds + 1
    return AgentRun(
        dialect=dialect,
        calls=[
            CallRecord(
                tool=c.tool,
                params=c.params,
                ok=c.error is None,
                error_kind=c.error_kind,
                error=c.error,
                round=c.round,
            )
            for c in result.tool_calls
        ],
        answer=result.answer,
        rounds=rounds,
        latency_s=result.timings.total,
        tokens_in=result.tokens.input,
        tokens_out=result.tokens.generated,
        parse_error=result.turns[0].parse_error if result.turns else None,
        raw=result.turns[0].text[:RAW_CHARS] if result.turns else "",
    )


# -- openai-compatible endpoint -----------------------------------------------------------------------------------

OPENAI_SYSTEM = "You are a remote-sensing assistant. Call the provided tools when the question needs them."


def _data_url(image: Path) -> str:
    mime = mimetypes.guess_type(image.name)[0] or "image/png"
    return f"data:{mime};base64," + base64.b64encode(image.read_bytes()).decode("ascii")


class OpenAIAgent:
    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        registry: ToolRegistry,
        api_key_env: str | None = None,
        tools_as: str = "prompt",
        temperature: float = 0.0,
        max_tokens: int = 1024,
        timeout_s: float = 120.0,
        retries: int = 2,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ):
        if not base_url.startswith(("http://", "https://")):
            raise GeoPilotInputError(f"--engine-url must start with http:// or https://, got {base_url!r}")
        key = None
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise GeoPilotInputError(f"--api-key-env {api_key_env}: the environment variable is not set")
        import openai  # noqa: F401 - its import (about a second) is paid here, not inside a request's deadline

        self.base_url, self.key = base_url.rstrip("/"), key
        self.model, self.registry, self.tools_as = model, registry, tools_as
        self.temperature, self.max_tokens, self.retries = temperature, max_tokens, retries
        self.timeout_s, self.max_response_bytes = timeout_s, max_response_bytes
        self.system = tool_prompt(registry) if tools_as == "prompt" else OPENAI_SYSTEM
        self.functions = openai_tools(registry) if tools_as == "openai" else None
        self.prompt_hash = sha256_text(
            self.system + (json.dumps(self.functions, sort_keys=True) if self.functions else "")
        )
        self.config = {
            "agent": self.name,
            "base_url": base_url,
            "model": model,
            "tools_as": tools_as,
            "temperature": temperature,
            "max_tokens": max_tokens,
        }

    def _post(self, body: dict) -> dict:
        """One chat completion through the shared client (`geopilot.llm_client`: the SDK's retries of 429 with
        Retry-After, 5xx and dropped connections); endpoint failures are InfraErrors of this row."""
        from openai import APIStatusError, OpenAIError

        from geopilot.llm_client import describe

        try:
            raw = asyncio.run(self._exchange(body))
        except TimeoutError:
            raise InfraError(
                f"timed out after {self.timeout_s:g} s per attempt ({self.retries + 1} attempts)"
            ) from None
        except APIStatusError as err:
            raise InfraError(describe(err)) from None
        except OpenAIError as err:
            raise InfraError(f"{describe(err)} (after {self.retries + 1} attempts)") from None
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            raise InfraError("the endpoint returned a body that is not JSON") from None

    async def _exchange(self, body: dict) -> bytes:
        """One request, all of it (connect, every byte of the reply) within `timeout_s` per attempt, the SDK's
        retries included: a per-read timeout alone would never trip on a server dripping a byte a second. A reply
        over `max_response_bytes` is an InfraError (not retried) before more of it is read."""
        from geopilot.llm_client import async_client

        client = async_client(self.base_url, self.key, timeout_s=self.timeout_s, max_retries=self.retries)
        try:
            async with asyncio.timeout(self.timeout_s * (self.retries + 1)):
                async with client.chat.completions.with_streaming_response.create(**body) as response:
                    chunks, size = [], 0
                    async for chunk in response.iter_bytes():
                        size += len(chunk)
                        if size > self.max_response_bytes:
                            raise InfraError(f"the reply is over {self.max_response_bytes:,} bytes; not read further")
                        chunks.append(chunk)
                    return b"".join(chunks)
        finally:
            await client.close()

    def _ask(self, messages: list[dict], seed: int) -> Reply:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "seed": seed,
        }
        if self.functions:
            body["tools"] = self.functions
        data = self._post(body)
        try:
            message = data["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            raise InfraError("the response has no choices[0].message") from None
        usage = data.get("usage") or {}
        cost = usage.get("cost") if isinstance(usage.get("cost"), int | float) else None
        return Reply(
            message.get("content"),
            message.get("tool_calls"),
            int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
            cost,
        )

    def run(self, case: Case, images: list[Path], seed: int) -> AgentRun:
        started = time.perf_counter()
        content: list[dict] = [{"type": "text", "text": case.query}]
        content += [{"type": "image_url", "image_url": {"url": _data_url(image)}} for image in images]
        messages = [{"role": "system", "content": self.system}, *_history(case), {"role": "user", "content": content}]

        def add_turn(reply: Reply, parsed: ParsedReply, results: list[ToolResult]) -> None:
            if parsed.dialect == "openai_tool_calls":
                messages.append({"role": "assistant", "content": reply.text, "tool_calls": reply.tool_calls})
                for call, result in zip(parsed.calls, results, strict=True):
                    view = llm_view(result.for_formatter()[1])
                    messages.append({"role": "tool", "tool_call_id": call.id or "", "content": dumps(view)})
            else:
                messages.append({"role": "assistant", "content": reply.text or ""})
                turn = format_tool_turn([r.for_formatter() for r in results], case.query)
                messages.append({"role": "user", "content": turn})

        try:
            loaded = [load_image(image) for image in images]
            return tool_loop(case, loaded, self.registry, lambda: self._ask(messages, seed), add_turn)
        except Exception as err:  # noqa: BLE001 - endpoint failures and anything else: this row's infra error
            return _failed_run(err, started)


# -- local transformers VLM ---------------------------------------------------------------------------------------


class HFAgent:
    name = "hf"

    def __init__(self, model: str, registry: ToolRegistry, generation: dict, device: str = "auto"):
        import torch
        from transformers import AutoModelForImageTextToText, AutoProcessor

        if not Path(model).is_dir():
            raise GeoPilotInputError(f"--model {model!r} is not a model directory")
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        self.processor = AutoProcessor.from_pretrained(model)
        if getattr(self.processor, "chat_template", None) is None:
            raise GeoPilotInputError(f"--model {model!r}: the processor has no chat template")
        self.model = AutoModelForImageTextToText.from_pretrained(model).to(self.device).eval()
        self.registry, self.generation = registry, generation
        self.prompt = tool_prompt(registry)
        self.prompt_hash = sha256_text(self.prompt)
        self.config = {"agent": self.name, "model": str(Path(model).resolve()), "generation": generation}

    def _ask(self, messages: list[dict], pil_images: list) -> Reply:
        import torch

        text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        images = pil_images or None
        inputs = self.processor(images=images, text=text, return_tensors="pt").to(self.device)
        options = {"max_new_tokens": 256, "do_sample": False, **self.generation}
        with torch.inference_mode():
            output = self.model.generate(**inputs, **options)
        new = output[0, inputs["input_ids"].shape[1] :]
        reply = self.processor.tokenizer.decode(new, skip_special_tokens=True)
        return Reply(reply, None, int(inputs["input_ids"].shape[1]), int(new.shape[0]))

    def run(self, case: Case, images: list[Path], seed: int) -> AgentRun:
        import torch

        started = time.perf_counter()
        first: list[dict] = [{"type": "image"} for _ in images]
        first.append({"type": "text", "text": f"{self.prompt}\n\n{case.query}"})
        messages = [*_history(case), {"role": "user", "content": first}]

        def add_turn(reply: Reply, parsed: ParsedReply, results: list[ToolResult]) -> None:
            messages.append({"role": "assistant", "content": reply.text or ""})
            turn = format_tool_turn([r.for_formatter() for r in results], case.query)
            messages.append({"role": "user", "content": [{"type": "text", "text": turn}]})

        try:
            torch.manual_seed(seed)
            loaded = [load_image(image) for image in images]
            pils = [one.image for one in loaded]
            return tool_loop(case, loaded, self.registry, lambda: self._ask(messages, pils), add_turn)
        except Exception as err:  # noqa: BLE001 - a crash of the model code is this row's infra error
            return _failed_run(err, started)


AGENTS: dict[str, str] = {
    "geopilot": "a GeoPilot checkpoint in-process (--model DIR)",
    "openai": "an OpenAI-compatible chat endpoint (--engine-url URL --model NAME)",
    "hf": "a local transformers VLM directory (--model DIR)",
    "reference": "the scripted reference agent: replays each case's reference_calls (checks a suite, no model)",
    "reference-first-step": "the reference agent stopped after its first round (a chain suite's breakdown check)",
}
