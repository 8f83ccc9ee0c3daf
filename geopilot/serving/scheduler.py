"""Continuous batching (`geopilot serve --scheduler step`): every decoding step runs every active row; finished rows
leave and waiting requests join at the next step.

A request is a `Row`: its own KV cache (batch 1, no padding) and its `AgentLoop`. One thread owns the model and
loops: admit waiting requests while the KV budget has room (a request reserves the most its cache may hold); run
the prefills of rows that have tokens to read (a new request's image + prompt, or a user turn after its tools),
at most `prefill_tokens` per step (at least one row) so decoding rows are not starved; then one decoding forward
over every decoding row, left-padded into one cache (rebuilt only when the rows change). A finished turn goes to
its loop on a thread pool, so tool calls never hold the decode loop; the row keeps its cache while its tools run
and its answer turn reads only the tool turn (the think turn's KV reused). A cancelled request (client gone, out of
time) leaves at the next step and its cache is freed. Rows decode with transformers' logits processors (greedy,
temperature, top-p, repetition penalty) on their own ids, and a think turn inside its own plan grammar (its own
`PlanLogits` matcher), as the static path does.

A streamed request is a row too: its tokens go through a text streamer into its `AnswerExtractor` as they are
chosen. What one decoding row per step cannot express runs alone between steps through `Batcher`'s paths: a
seeded sampling request, client-run tools (grammar-constrained plans, the prefix cache), and every request of a
pilot whose engine `steppable_engine` refuses (docs/design.md §8).
"""

from __future__ import annotations

import concurrent.futures
import queue
import time
from dataclasses import dataclass, field
from typing import Any

from geopilot.agent import MIN_TURN_TOKENS
from geopilot.agent.plan_schema import PlanLogits
from geopilot.generation import AnswerExtractor, GenerationOptions, Turn, text_streamer
from geopilot.serving.batcher import Batcher, Job
from geopilot.serving.step_cache import StepBatch

TOOL_TURN_TOKENS = 512  # reserved per tool round for the tool outputs a row reads (its turn is cut to fit)


@dataclass(eq=False)  # rows are compared by identity
class Row:
    job: Job
    dialogue: Any  # AgentLoop
    reserved: int  # KV tokens this request may hold (its cache never grows past it)
    started: float
    encode_seconds: float = 0.0
    image: dict | None = None  # the family's image inputs, until the first prefill
    position_state: Any = None  # the family's, from the first prefill (Qwen2.5-VL: the row's rope delta)
    feed: list[int] = field(default_factory=list)  # tokens the cache has not read yet
    cache: Any = None  # DynamicCache of batch 1
    length: int = 0  # tokens in the cache
    ids: list[int] = field(default_factory=list)  # every token of the conversation (repetition penalty reads them)
    generated: list[int] = field(default_factory=list)
    carried: int = 0  # tokens of `feed` the last turn generated (its last token, or </s>): not this turn's input
    next_token: int | None = None  # chosen, not yet in the cache
    limit: int = 0  # tokens this turn may generate
    new_input_tokens: int = 0
    turn_started: float = 0.0
    processors: Any = None  # the request's sampling processors
    turn_processors: Any = None  # those and, on a constrained turn, its plan grammar (one matcher per row)
    tools: concurrent.futures.Future | None = None  # the loop reading the last turn (tools run there)
    streamer: Any = None  # a streamed request's: this turn's text, to its answer extractor


class StepScheduler(Batcher):
    """A `Batcher` whose model thread schedules per decoding step (see the module docstring)."""

    def __init__(
        self,
        pilot,
        kv_budget_tokens: int,
        max_pending: int = 64,
        prefill_tokens: int = 2048,
        max_rows: int = 64,
    ):
        self.kv_budget_tokens, self.prefill_tokens, self.max_rows = kv_budget_tokens, prefill_tokens, max_rows
        self.rows: list[Row] = []
        self._ready: Row | None = None  # prepared, waiting for KV budget
        self.steps: list[int] = []  # rows decoded at every step (tests, benchmarks)
        self._batch = StepBatch(pilot.engine.model.config)  # the decoding rows' KV, kept from step to step
        self._tools = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="step-tools")
        super().__init__(pilot, max_batch=1, wait_s=0.0, max_pending=max_pending)

    def check_tokens(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Raise GeoPilotInputError when one turn of `max_new_tokens` cannot fit in the KV budget at all."""
        from geopilot.errors import GeoPilotInputError

        if prompt_tokens + max_new_tokens > self.kv_budget_tokens:
            raise GeoPilotInputError(
                f"max_tokens={max_new_tokens} with a {prompt_tokens}-token prompt exceeds the server's KV budget of "
                f"{self.kv_budget_tokens} tokens (--kv-budget-tokens)"
            )

    def close(self) -> None:
        super().close()
        self._tools.shutdown(wait=False, cancel_futures=True)

    # -- the model thread ---------------------------------------------------------------------------------------------

    def _steppable(self, job: Job) -> bool:
        return (
            steppable_engine(getattr(self.pilot, "engine", None))
            and not (job.options.seed is not None and job.options.do_sample)
            and "client_tools" not in job.request
        )

    def _loop(self) -> None:
        import torch

        with torch.inference_mode():
            while True:
                if not self._admit_waiting():
                    return
                try:
                    self._drop_cancelled()
                    self._collect_tools()
                    self._prefill()
                    self._decode()
                except BaseException as err:  # noqa: BLE001 - handed to the running requests, the thread lives on
                    for row in list(self.rows):
                        self._leave(row)
                        row.job.future.set_exception(err)

    def _reserved(self) -> int:
        return sum(row.reserved for row in self.rows)

    def _admit_waiting(self) -> bool:
        """Move waiting jobs in while the budget allows; block when nothing runs. False: the scheduler is closed."""
        while len(self.rows) < self.max_rows:
            row, self._ready = self._ready, None
            if row is None:
                try:
                    job = self._queue.get(timeout=None if not self.rows else 0.0)
                except queue.Empty:
                    return True
                if job is None:
                    return False
                if job.cancelled.is_set():
                    continue
                if not self._steppable(job):
                    self._run_alone(job)
                    continue
                row = self._start(job)
            if row is None or row.job.cancelled.is_set():
                continue
            if self.rows and self._reserved() + row.reserved > self.kv_budget_tokens:
                self._ready = row  # first in line: it joins when rows leave and free their KV
                return True
            self.rows.append(row)
        return True

    def _run_alone(self, job: Job) -> None:
        if job.on_text is not None:
            self._run_stream(job)
        else:
            self._run_batch([job])

    def _start(self, job: Job) -> Row | None:
        from geopilot.agent.loop import AgentLoop

        started = time.perf_counter()
        try:
            prepared = self.pilot.prepare(job.request)
            self.check_tokens(len(prepared.prompt), job.options.max_new_tokens)
        except BaseException as err:  # noqa: BLE001 - the request's own error (400), the thread lives on
            job.future.set_exception(err)
            return None
        pilot, options = self.pilot, job.options
        rounds = job.max_rounds
        reserved = len(prepared.prompt) + (rounds + 2) * options.max_new_tokens + rounds * TOOL_TURN_TOKENS
        reserved = min(reserved, pilot.context_length or reserved, self.kv_budget_tokens)
        deadline = None if pilot.chat_timeout_s is None else time.monotonic() + pilot.chat_timeout_s
        dialogue = AgentLoop(prepared, pilot.tools, rounds, pilot.tool_timeout_s, pilot.max_tool_calls, deadline)
        pictures = [image.image for image in prepared.images]  # in order: one image's inputs per placeholder
        image = pilot.engine.family.image_inputs(pilot.engine.processor, pictures)
        row = Row(job, dialogue, reserved, started, time.perf_counter() - started, image, feed=list(prepared.prompt))
        row.processors = _processors(options)
        plan = dialogue.plan_constraint() if pilot.constrain_plans else None
        if plan is not None:
            try:
                pilot.engine.check_plan_room(plan, options.max_new_tokens)  # the static path's one-line refusal
            except BaseException as err:  # noqa: BLE001 - the request's own error (400)
                job.future.set_exception(err)
                return None
        if not self._begin_turn(row):  # no room for even the first turn: it ends as the static path would
            self._finish(row)
            return None
        return row

    def _begin_turn(self, row: Row) -> bool:
        from transformers import LogitsProcessorList

        """Set the turn's length limit; False (the dialogue is ended) when it has no room left."""
        deadline = row.dialogue.deadline
        if deadline is not None and time.monotonic() >= deadline:
            timeout = self.pilot.chat_timeout_s
            row.dialogue.stop("deadline", f"the chat ran past its deadline (chat_timeout_s={timeout:g} s)")
            return False
        used = row.length + len(row.feed)
        room = row.reserved - used
        if room < MIN_TURN_TOKENS:
            row.dialogue.stop(
                "context_limit",
                f"the next turn does not fit in this request's {row.reserved} KV tokens ({used} used)",
            )
            return False
        row.limit = min(row.job.options.max_new_tokens, room)
        plan = row.dialogue.plan_constraint() if self.pilot.constrain_plans else None
        grammar = [] if plan is None else [PlanLogits(self.pilot.engine.grammars, [plan], row.limit)]
        row.turn_processors = LogitsProcessorList([*row.processors, *grammar])  # a fresh matcher every turn
        row.generated, row.turn_started = [], time.perf_counter()
        if row.job.on_text is not None:  # a fresh extractor every turn, as the static path's
            tokenizer = self.pilot.engine.tokenizer
            row.streamer = text_streamer(tokenizer, AnswerExtractor(row.job.on_text).feed, skip_prompt=False)
        row.new_input_tokens, row.carried = len(row.feed) - row.carried, 0
        return True

    def _drop_cancelled(self) -> None:
        for row in [r for r in self.rows if r.job.cancelled.is_set()]:
            self._leave(row)
            row.job.future.cancel()

    def _leave(self, row: Row) -> None:
        if row in self.rows:
            self.rows.remove(row)
        self._batch.drop(row)
        row.cache = None  # its KV is freed with it

    def _finish(self, row: Row) -> None:
        self._leave(row)
        dialogue = row.dialogue
        image_tokens = self.pilot.engine.image_tokens_of(dialogue.request.image.image.size) * len(
            dialogue.request.images
        )
        dialogue.timings_and_tokens(row.encode_seconds, image_tokens, row.started)
        dialogue.result.describe_image(dialogue.request.images)
        row.job.future.set_result(dialogue.result)

    def _collect_tools(self) -> None:
        """Rows whose loop has read their last turn: end them, or queue their next user turn's prefill."""
        for row in [r for r in self.rows if r.tools is not None and r.tools.done()]:
            future, row.tools = row.tools, None
            try:
                text = future.result()
            except BaseException as err:  # noqa: BLE001 - a failing loop fails its request only
                self._leave(row)
                row.job.future.set_exception(err)
                continue
            if text is None:
                self._finish(row)
                continue
            row.feed += self.pilot.engine.family.tail_ids(self.pilot.engine.tokenizer, text)
            if not self._begin_turn(row):
                self._finish(row)

    def _prefill(self) -> None:
        """Read the pending tokens of rows that have some, up to `prefill_tokens` a step (at least one row)."""
        spent = 0
        for row in [r for r in self.rows if r.feed and r.tools is None]:
            if spent and spent + len(row.feed) > self.prefill_tokens:
                break
            spent += len(row.feed)
            self._prefill_row(row)

    def _prefill_row(self, row: Row) -> None:
        import torch
        from transformers import DynamicCache

        model, family = self.pilot.engine.model, self.pilot.engine.family
        ids = torch.tensor([row.feed], device=model.device)
        kwargs, positions = {}, None  # the first prefill's positions are the model's own (from the image grid)
        if row.image is not None:  # its first prefill: the image and the prompt
            row.cache = DynamicCache(config=model.config)
            kwargs["pixel_values"] = row.image["pixel_values"].to(model.device, model.dtype)
            grid = row.image.get("image_grid_thw")
            grid = None if grid is None else grid.to(model.device)
            kwargs.update(family.vision_kwargs(model.config.image_token_id, ids, grid))
        else:
            if row in self._batch:
                row.cache = self._batch.take_out(row)
            text = torch.arange(row.length, row.length + len(row.feed), device=model.device)[None]
            positions = family.step_positions(text, [row.position_state])
        mask = torch.ones((1, row.length + len(row.feed)), dtype=torch.long, device=model.device)
        logits = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            cache=row.cache,
            use_cache=True,
            logits_to_keep=1,
            **kwargs,
        ).logits[:, -1]
        if row.image is not None:
            row.image, row.position_state = None, family.position_state(model)
        row.length += len(row.feed)
        row.ids += row.feed
        row.feed = []
        self._take(row, self._pick(row, logits[0]))

    def _pick(self, row: Row, logits) -> int:
        """The row's next token from its logits, through its processors."""
        import torch

        scores = logits.float()[None]
        if len(row.generated) < row.job.options.min_new_tokens:
            scores[:, self.pilot.engine.tokenizer.eos_token_id] = float("-inf")
        scores = row.turn_processors(torch.tensor([row.ids], device=scores.device), scores)
        if row.job.options.do_sample:
            return int(torch.multinomial(torch.softmax(scores, dim=-1), 1))
        return int(scores.argmax(dim=-1))

    def _take(self, row: Row, token: int) -> None:
        """The row's next token chosen; a finished turn goes to its loop (tools run off this thread)."""
        import torch

        tokenizer = self.pilot.engine.tokenizer
        finished = token == tokenizer.eos_token_id
        if not finished:
            row.generated.append(token)
            if row.streamer is not None:
                row.streamer.put(torch.tensor([token]))
        if finished or len(row.generated) >= row.limit:
            row.next_token = None
            self._end_turn(row, finished)
        else:
            row.next_token = token

    def _end_turn(self, row: Row, finished: bool) -> None:
        tokenizer = self.pilot.engine.tokenizer
        if row.streamer is not None:
            row.streamer.end()
        text = tokenizer.decode(row.generated, skip_special_tokens=True).strip()
        turn = Turn(list(row.generated), text, finished, row.new_input_tokens, time.perf_counter() - row.turn_started)
        # the turn's last token (</s>, or the cut-off one and a </s>) is not in the cache: the next turn reads it first
        row.feed = [tokenizer.eos_token_id] if finished else [row.generated[-1], tokenizer.eos_token_id]
        row.carried = 1
        if row in self._batch:  # it leaves the batch while its tools run
            row.cache = self._batch.take_out(row)
        row.tools = self._tools.submit(row.dialogue.take, turn)

    def _decode(self) -> None:
        """One forward over every decoding row: each reads its chosen token and gets its next one."""
        import torch

        active = [r for r in self.rows if r.next_token is not None and r.tools is None and not r.feed]
        if not active:
            if self.rows and all(r.tools is not None for r in self.rows):
                time.sleep(0.002)  # every row waits for its tools: do not spin
            return
        self.steps.append(len(active))
        model, batch = self.pilot.engine.model, self._batch
        batch.hold(active)
        rows = list(batch.rows)
        ids = torch.tensor([[r.next_token] for r in rows], device=model.device)
        text = torch.tensor([[r.length] for r in rows], device=model.device)
        positions = self.pilot.engine.family.step_positions(text, [r.position_state for r in rows])
        mask = batch.mask(1)
        logits = model(
            input_ids=ids, attention_mask=mask, position_ids=positions, cache=batch.cache, use_cache=True
        ).logits[:, -1]
        for row in rows:
            row.length += 1
            row.ids.append(row.next_token)
            row.next_token = None
        for i, (row, token) in enumerate(zip(rows, self._greedy(rows, logits), strict=True)):
            self._take(row, token if token is not None else self._pick(row, logits[i]))

    def _greedy(self, rows: list[Row], logits) -> list[int | None]:
        """The next token of every row that decodes greedily without processors, in one argmax over the batch
        (None for the others: `_pick` reads them one by one)."""
        plain = [not r.turn_processors and not r.job.options.do_sample for r in rows]
        if not any(plain):
            return [None] * len(rows)
        scores = logits.float().clone()  # `_pick` reads the others' logits as they came
        held = [i for i, r in enumerate(rows) if len(r.generated) < r.job.options.min_new_tokens]
        if held:
            scores[held, self.pilot.engine.tokenizer.eos_token_id] = float("-inf")
        tokens = scores.argmax(dim=-1).tolist()
        return [token if keep else None for token, keep in zip(tokens, plain, strict=True)]


def _processors(options: GenerationOptions):
    """The row's logits processors (transformers'), applied on its own ids."""
    from transformers import (
        LogitsProcessorList,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopPLogitsWarper,
    )

    processors = LogitsProcessorList()
    if options.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(options.repetition_penalty))
    if options.do_sample:
        processors.append(TemperatureLogitsWarper(options.temperature))
        if options.top_p < 1.0:
            processors.append(TopPLogitsWarper(options.top_p))
    return processors


def steppable_engine(engine) -> bool:
    """The in-process model with its own KV sessions, of a family the per-step scheduler can drive (its module's
    `STEPPABLE`; both families: a Qwen2.5-VL row's positions carry its own rope delta, `step_positions`)."""
    family = getattr(engine, "family", None)
    return getattr(engine, "default_sessions", False) and getattr(family, "STEPPABLE", False)


def make_batcher(pilot, config) -> Batcher:
    """The server's model thread for `config` (a ServeConfig): the per-step scheduler where it can drive the
    pilot's model (`steppable_engine`) with more than one row, else the static batcher."""
    engine = getattr(pilot, "engine", None)
    if config.scheduler == "step" and steppable_engine(engine) and config.max_batch > 1:
        budget = config.kv_budget_tokens or kv_budget_from_memory(engine.model)
        return StepScheduler(pilot, budget, config.max_concurrency, max_rows=config.max_batch)
    return Batcher(pilot, config.max_batch, config.batch_wait_ms / 1000, config.max_concurrency)


def kv_budget_from_memory(model, fraction: float = 0.8) -> int:
    """KV tokens that fit in `fraction` of the device's free memory (CUDA), or of the available RAM (CPU)."""
    import os

    import torch

    text = model.config.text_config
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    per_token = 2 * text.num_hidden_layers * heads * head_dim * torch.finfo(model.dtype).bits // 8
    if model.device.type == "cuda":
        free = torch.cuda.mem_get_info(model.device)[0]
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return max(1, int(free * fraction) // per_token)
