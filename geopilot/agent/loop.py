"""The agent loop of one request (paper Algorithm 1), fed one generated turn at a time: parse the plan, validate
each call (unknown tool, invalid params, a declared modality), repair once, run the calls, say what the model reads
next. It knows nothing of how turns are generated: `geopilot.agent.GeoPilot` drives it over any engine.

Chains (docs/chains.md): with `max_rounds` > 1 the reply to tool outputs may plan again; a later call may name an
earlier one's output (`"image": "result:N"`), resolved against this chat's `ChatCalls` only. A reference to a call
that does not exist, failed or has the wrong kind, and a repeat of an earlier call on the same input, are validation
problems (one repair turn), so a step after a failed one never runs on nothing.

With client-run tools (`PreparedRequest.client_tools`) a valid plan with calls ends the request as `tool_calls`:
the caller runs them and comes back with their results (a request whose history ends with them, answered first).
Calls are then checked against the tools the client offered and the plan against `tool_choice`."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from geopilot.agent.requests import DEFAULT_MAX_TOOL_CALLS, PreparedRequest
from geopilot.agent.results import ChatResult, Outcome, Timings, TokenCounts, ToolCallRecord, TurnRecord
from geopilot.generation import Turn
from geopilot.plan_parser import PlanParseError, cut_answer, parse_plan
from geopilot.sample import Action, AssistantMessage, ToolMessage
from geopilot.tool_chains import ChatCalls
from geopilot.tool_protocol import ToolRegistry
from geopilot.tool_result import ToolCallError, ToolResult
from geopilot.wire import format_repair_turn, format_tool_turn

MAX_CONCURRENT_DIALOGUES = 8  # rows of a batch whose tool calls run at the same time


class AgentLoop:
    """The loop for one request, fed one generated turn at a time; says what the model reads next."""

    def __init__(
        self,
        request: PreparedRequest,
        registry: ToolRegistry,
        max_rounds: int,
        tool_timeout_s: float | None,
        max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS,
        deadline: float | None = None,  # time.monotonic() after which nothing new starts
    ):
        self.request, self.registry = request, registry
        self.max_rounds, self.tool_timeout_s = max_rounds, tool_timeout_s
        self.max_tool_calls, self.deadline = max_tool_calls, deadline
        self.turns: list[TurnRecord] = []
        self.tool_calls: list[ToolCallRecord] = []
        self.messages: list = list(request.messages)
        self.rounds, self.repaired = 0, False
        self.next_kind = "answer" if request.messages[-1].role == "tool" else "think"  # client results come first
        self.unresolved: str | None = None  # invalid calls that still ran (as errors) after a failed repair
        self.calls = ChatCalls()  # this chat's results: all that a `result:N` reference can name
        self.result: ChatResult | None = None

    def take(self, turn: Turn) -> str | None:
        """Record a generated turn; return the text of the next user turn, or None when the dialogue is over."""
        record = TurnRecord(
            kind=self.next_kind,
            text=turn.text,
            parse="failed",
            finished=turn.finished,
            new_input_tokens=turn.new_input_tokens,
            generated_tokens=len(turn.token_ids),
            seconds=turn.seconds,
        )
        self.turns.append(record)
        try:
            parsed = parse_plan(turn.text, self.request.boxes)  # the model's boxes back to normalised ones
        except PlanParseError as err:
            record.parse_error = str(err) + ("" if turn.finished else " (the reply was cut off at max_new_tokens)")
            words = None if turn.finished else cut_answer(turn.text, self.request.boxes)
            if words is not None:  # the answer's first words beat its raw JSON (and a repair turn cut off again)
                self.messages.append(AssistantMessage(value=words))
                cut = "the answer was cut off at max_new_tokens; raise it for the whole answer"
                return self._finish(words + "…", "tools" if self.rounds else "direct", cut)
            if not self.repaired:
                return self._repair(record.parse_error)
            return self._finish(turn.text.strip(), "unparsable", record.parse_error)
        plan = record.plan = parsed.plan
        record.parse = parsed.method
        client = self.request.client_tools
        if client is not None:
            return self._client_plan(plan, record)
        if not plan.actions:
            self.messages.append(plan)
            return self._finish(plan.value or "", "tools" if self.rounds else "direct")
        if self.rounds >= self.max_rounds:
            wanted = ", ".join(a.tool for a in plan.actions)
            answer = plan.value or ""
            self.messages.append(AssistantMessage(reasoning=plan.reasoning, value=answer))
            return self._finish(
                answer,
                "round_limit",
                f"the model asked for {wanted} after {self.rounds} tool round(s) (max_rounds={self.max_rounds})",
            )
        record.problems = [self._problem(action) for action in plan.actions]
        record.problems = [p for p in record.problems if p]
        if record.problems and not self.repaired:
            return self._repair("; ".join(record.problems))
        return self._run_tools(plan, record)

    def _client_plan(self, plan: AssistantMessage, record: TurnRecord) -> str | None:
        """Client-run tools: an answer ends the request; a valid plan with calls is handed back (`tool_calls`); a
        plan breaking `tool_choice` or calling what was not offered gets the repair turn, then the calls that name
        an offered tool are handed back (their client reports bad params, as a failed call here would) or, if none
        do, the plan's value is the answer with the problem recorded."""
        problem = self.request.constraint.problem(plan) if plan.actions or self.request.constraint.min_calls else None
        record.problems = [p for p in [problem, *(self._problem(a) for a in plan.actions)] if p]
        if record.problems and not self.repaired:
            return self._repair("; ".join(record.problems))
        error = "; ".join(record.problems) or None
        offered = [a for a in plan.actions if a.tool in self.request.client_tools.names]
        if self.request.constraint.max_calls == 0:
            offered = []
        if not offered:
            answer = AssistantMessage(reasoning=plan.reasoning, value=plan.value or "")
            self.messages.append(answer)
            return self._finish(answer.value, "tools" if self._answers_tool_results() else "direct", error)
        self.rounds += 1
        record.tool_round = self.rounds
        self.messages.append(AssistantMessage(reasoning=plan.reasoning, actions=offered))
        return self._finish("", "tool_calls", error)

    def _answers_tool_results(self) -> bool:
        return any(m.role == "tool" for m in self.request.messages)

    def _key(self, action: Action) -> str | None:
        key = getattr(self.registry, "params_key", None)
        return key(action) if key is not None else None

    def _problem(self, action: Action) -> str | None:
        try:
            client = self.request.client_tools
            if client is not None:
                client.validate(action, self.registry, self.request.gate)
            else:
                self.registry.validate(action, self.request.gate, self.calls)
        except ToolCallError as err:
            return f"{err.kind}: {err}"
        except Exception as err:  # noqa: BLE001 - a tool's own params model misbehaving is still the call's problem
            return f"invalid_params: {type(err).__name__}: {err}"
        return None

    def plan_constraint(self):
        """The grammar of this row's next turn (`geopilot.agent.plan_schema`): the chat's plan, before any tool
        ran (the think turn and its repair); None for the answer turns, decoded freely. A registry without
        `plan_constraint` (a stand-in) leaves the plan free."""
        if self.next_kind == "answer" or self.rounds:
            return None
        if self.request.client_tools is not None:
            return self.request.constraint
        plan_constraint = getattr(self.registry, "plan_constraint", None)
        return None if plan_constraint is None else plan_constraint(self.request.gate)

    def tokens_used(self) -> int:
        """Context positions this conversation fills so far (each generated turn also holds its </s>). Before the
        first turn: the rendered prompt (empty when the engine renders it itself and counts nothing here)."""
        if not self.turns:
            return len(self.request.prompt)
        # the first turn read the whole prompt, even where a cached prefix spared prefilling part of it
        first = max(len(self.request.prompt), self.turns[0].new_input_tokens)
        inputs = first + sum(t.new_input_tokens for t in self.turns[1:])
        return inputs + sum(t.generated_tokens + 1 for t in self.turns)

    def stop(self, outcome: Outcome, error: str) -> None:
        """End before the next turn (context full, or the deadline passed); the last plan's value is the answer."""
        last = next((t.plan for t in reversed(self.turns) if t.plan is not None), None)
        self._finish((last.value or "") if last is not None else "", outcome, error)

    def _call(self, action: Action) -> ToolResult:
        timeout = self.tool_timeout_s if self.tool_timeout_s is not None else self.registry.timeout_s
        if self.deadline is not None:  # never past the chat's deadline (0 left: the call is reported, not run)
            timeout = max(0.0, min(timeout, self.deadline - time.monotonic()))
        try:
            several = {"images": self.request.images} if len(self.request.images) > 1 else {}  # any registry: one
            result = self.registry.call(action, self.request.image, self.request.gate, timeout, self.calls, **several)
        except Exception as err:  # noqa: BLE001 - ToolRegistry.call captures failures; this guards other registries
            result = ToolResult(
                action.tool, dict(action.params), error=f"{type(err).__name__}: {err}", error_kind="tool_error"
            )
        self.calls.record(result, self._key(action))
        return result

    def _run_tools(self, plan: AssistantMessage, record: TurnRecord) -> str:
        """Run every call (after a failed repair, invalid ones come back as errors the model answers from)."""
        self.rounds += 1
        record.tool_round = self.rounds
        results = [self._call(action) for action in plan.actions[: self.max_tool_calls]]
        results += [
            ToolResult(
                action.tool,
                dict(action.params),
                error=f"not run: the plan has {len(plan.actions)} calls, more than max_tool_calls={self.max_tool_calls}",
                error_kind="call_limit",
            )
            for action in plan.actions[self.max_tool_calls :]
        ]
        for result in results[self.max_tool_calls :]:
            self.calls.record(result)
        self.calls.close_round()  # the next round's calls may read this one's outputs
        self.messages.append(plan)
        for result in results:
            self.tool_calls.append(ToolCallRecord(round=self.rounds, **vars(result)))
            self.messages.append(ToolMessage(name=result.tool, content=result.for_formatter()[1]))
        if record.problems:
            self.unresolved = "; ".join(record.problems)
        self.next_kind = "answer"
        results = [r.for_formatter() for r in results]
        return format_tool_turn(results, self.request.question, self.request.boxes)

    def _repair(self, problem: str) -> str:
        self.repaired, self.next_kind = True, "repair"
        return format_repair_turn(problem, self.request.question)

    def _finish(self, answer: str, outcome: Outcome, error: str | None = None) -> None:
        if outcome == "unparsable":
            self.messages.append(AssistantMessage(value=answer))
        error = error or self.unresolved
        answered_from = [c for c in self.tool_calls if c.round == self.rounds]
        if error is None and outcome == "tools" and answered_from and all(c.error for c in answered_from):
            error = "every tool call failed: " + "; ".join(f"{c.tool}: {c.error}" for c in answered_from)
        self.result = ChatResult(
            answer=answer,
            outcome=outcome,
            error=error,
            repaired=self.repaired,
            turns=self.turns,
            tool_calls=self.tool_calls,
            messages=self.messages,
            modality=self.request.modality,
            modality_source="inferred" if self.request.gate is None else "declared",
        )
        return None

    def timings_and_tokens(self, encode_seconds: float, image_tokens: int, started: float) -> None:
        result = self.result
        stage = {"think": 0.0, "repair": 0.0, "answer": 0.0}
        for turn in self.turns:
            stage[turn.kind] += turn.seconds
        result.timings = Timings(
            image_load=self.request.load_seconds,
            encode=encode_seconds,
            tools=sum(c.seconds for c in self.tool_calls),
            total=time.perf_counter() - started + self.request.load_seconds,
            **stage,
        )
        result.tokens = TokenCounts(
            prompt=self.turns[0].new_input_tokens if self.turns else 0,
            image=image_tokens,
            input=sum(t.new_input_tokens for t in self.turns),
            generated=sum(t.generated_tokens for t in self.turns),
        )


def take_all(dialogues: list[AgentLoop], rows: list[int], turns: list[Turn]) -> list[str | None]:
    """Feed each row its generated turn; the tool calls of different rows (requests) run concurrently, so one
    request's slow tool does not hold up the others' (the calls of one plan still run in order)."""
    if len(rows) == 1:
        return [dialogues[rows[0]].take(turns[0])]
    with ThreadPoolExecutor(
        max_workers=min(len(rows), MAX_CONCURRENT_DIALOGUES), thread_name_prefix="dialogue"
    ) as pool:
        return list(pool.map(lambda row, turn: dialogues[row].take(turn), rows, turns))
