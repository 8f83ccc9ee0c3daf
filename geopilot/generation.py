"""Turn generation on one KV cache (docs/design.md §7): encode the image once, generate the think turn, then feed only
the new user-turn tokens (tool outputs, a repair request) and generate the next turn from the same cache.

    session = KVSession(model, tokenizer, prompts, pixel_values, GenerationOptions())
    [think] = session.generate([0])                  # prefill image + prompt, decode the plan
    [answer] = session.generate([0], [tool_ids])     # prefill only the tool turn, decode the answer

Everything goes through `model.generate` (sampling, stopping, streaming are transformers'): the image features
enter the first call as `mm_encoder_outputs`, and later calls pass the whole sequence with the same
`DynamicCache`, so generate feeds only the tokens the cache has not seen. Rows of a batch are left-padded; new
tokens are padded on the left too, and the attention mask (0 on every pad, including the pads generate writes
after a row's `</s>`) keeps positions and attention exact. Finished rows leave the cache (`batch_select_indices`).
`reuse_cache=False` re-prefills everything each turn, image included, as LLaVA-Plus does: the baseline of
`benchmarks/chat_latency.py` and of the exactness test.

Answer turns (a later turn of ONE row, greedy) are decoded with prompt-lookup speculation on the reused cache
(`prompt_lookup_tokens`, `_lookup_decode`): the answer mostly quotes the tool output (labels, boxes, counts), so the
tokens that followed the longest earlier match of the text's suffix are proposed (as many as matched, up to
`prompt_lookup_tokens`; none for a one-token match) and checked in one forward pass; the longest greedy-agreeing
prefix is kept, plus the model's own next token. The output is the greedy output,
token for token (a test checks it). transformers' `prompt_lookup_num_tokens` is not used: with a cache that
already holds earlier turns it diverges from greedy decoding after a few tokens (transformers 5.24, measured).
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from geopilot.boxes import BoxCodec, text_from_model
from geopilot.config import StrictConfig


class GenerationOptions(StrictConfig):
    """Decoding settings for every turn of a chat (a subset of transformers' GenerationConfig)."""

    max_new_tokens: int = Field(512, ge=1)
    min_new_tokens: int = Field(
        0, ge=0
    )  # > 0 suppresses </s> until then (benchmarks fix lengths); a whole plan still ends
    do_sample: bool = False
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0)
    prompt_lookup_tokens: int = Field(10, ge=0)  # answer-turn speculation: most tokens proposed a step (0: off)
    seed: int | None = None  # seeds torch's sampling when a session starts (serving runs a seeded request alone)

    def generation_config(self, tokenizer):
        from transformers import GenerationConfig

        sampling = {"temperature": self.temperature, "top_p": self.top_p} if self.do_sample else {}
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            min_new_tokens=self.min_new_tokens or None,
            do_sample=self.do_sample,
            repetition_penalty=self.repetition_penalty,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            **sampling,
        )


@dataclass
class Turn:
    """One generated assistant turn of one row."""

    token_ids: list[int]  # generated ids without the closing </s>
    text: str
    finished: bool  # ended with </s> (False: cut at max_new_tokens)
    new_input_tokens: int  # tokens prefilled for this turn (the whole prompt on the first turn, or a full re-prefill)
    seconds: float  # wall time of the generate call (shared by the rows of a batch)
    logits: Any = None  # [steps, vocab] float tensor, when asked for (tests)
    lookup: LookupStats | None = None  # what prompt-lookup speculation did, on a turn decoded with it


def text_streamer(tokenizer, on_text: Callable[[str], None], skip_prompt: bool = True):
    """A transformers streamer passing `on_text` each piece of decoded text (`skip_prompt`: its first `put`, the
    prompt `generate` sends, is not text to pass on)."""
    import torch
    from transformers import TextStreamer

    byte_ids = _byte_token_ids(tokenizer)

    class _CallbackStreamer(TextStreamer):  # TextStreamer's documented extension point
        """Holds back a run of byte-fallback tokens until a token ends it: the decoder reads the run as one UTF-8
        sequence (one U+FFFD per byte when it is not valid), so its text is known only then ("Ї" streamed, then the
        next byte made the run "���": the streamed answer was not the answer)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.held: list[int] = []

        def put(self, value):
            if self.skip_prompt and self.next_tokens_are_prompt:
                return super().put(value)
            self.held += value.reshape(-1).tolist()
            if self.held and self.held[-1] not in byte_ids:
                self._release()

        def end(self):
            self._release()
            super().end()

        def _release(self):
            if self.held:
                ready, self.held = self.held, []
                super().put(torch.tensor(ready))

        def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
            if text:
                on_text(text)

    return _CallbackStreamer(tokenizer, skip_prompt=skip_prompt, skip_special_tokens=True)


def _byte_token_ids(tokenizer) -> frozenset[int]:
    """The ids of the byte-fallback tokens (`<0x..>`), cached on the tokenizer."""
    cached = getattr(tokenizer, "_geopilot_byte_ids", None)
    if cached is None:
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        cached = frozenset(i for i, p in enumerate(pieces) if p and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", p))
        tokenizer._geopilot_byte_ids = cached
    return cached


def _split(items: list, counts: list[int]) -> list[list]:
    """`items` cut into consecutive runs of `counts` (each conversation's images)."""
    ends = list(itertools.accumulate(counts))
    return [list(items[end - count : end]) for end, count in zip(ends, counts, strict=True)]


class KVSession:
    """A batch of conversations that share one KV cache across turns."""

    def __init__(
        self,
        model,
        tokenizer,
        prompts: list[list[int]],
        pixel_values,
        options: GenerationOptions,
        reuse_cache: bool = True,
        logits_processor=None,
        image_grid_thw=None,
        image_counts: list[int] | None = None,
    ):
        """`pixel_values` and `image_grid_thw` as the model's processor writes them (a grid: one row per image of a
        native-resolution family, whose pixel rows are each image's patches, concatenated); `image_counts`: the
        images of each conversation, in order (None: one each)."""
        import torch
        from transformers import DynamicCache
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        from geopilot.batch import collate
        from geopilot.families import family_of_model
        from geopilot.render import Rendered

        self.model, self.tokenizer, self.reuse_cache = model, tokenizer, reuse_cache
        self.family = family_of_model(model)
        if options.seed is not None:
            torch.manual_seed(options.seed)
        self.generation_config = options.generation_config(tokenizer)
        self.lookup_tokens = options.prompt_lookup_tokens
        self.logits_processor = logits_processor
        batch = collate([Rendered(p, list(p)) for p in prompts], tokenizer.pad_token_id, padding_side="left")
        self.sequences = batch["input_ids"].to(model.device)
        self.mask = batch["attention_mask"].to(model.device)
        self.rows = list(range(len(prompts)))
        self.lacks_eos = [False] * len(prompts)
        pixel_values = pixel_values.to(model.device, model.dtype)
        self.image_counts = list(image_counts or [1] * len(prompts))
        per_image = [1] * sum(self.image_counts) if image_grid_thw is None else image_grid_thw.prod(-1).tolist()
        per_row = [sum(c) for c in _split(per_image, self.image_counts)]
        self.pixel_rows = list(torch.split(pixel_values, per_row))  # per conversation, so finished rows can leave
        grid = None if image_grid_thw is None else image_grid_thw.to(model.device)
        self.grid_rows = None if grid is None else list(torch.split(grid, self.image_counts))
        self.positions = None  # the family's position state after the first turn (Qwen2.5-VL: its rope deltas)
        self.cache = DynamicCache(config=model.config)
        self.started = False
        start = time.perf_counter()
        with torch.inference_mode():
            features = list(self.family.image_features(model, pixel_values, self._grid()))  # one per image
            if pixel_values.is_cuda:  # time the work, not the launch
                torch.cuda.synchronize(pixel_values.device)
        # only the projected features are kept (not every vision layer's hidden states); they are used once
        self.image_outputs = BaseModelOutputWithPooling(pooler_output=features)
        self.encode_seconds = time.perf_counter() - start

    def _grid(self):
        import torch

        return None if self.grid_rows is None else torch.cat(self.grid_rows)

    def _keep(self, rows: list[int]) -> None:
        """Drop the rows not in `rows` (finished conversations) from the tensors and the cache."""
        import torch

        if rows == self.rows:
            return
        if any(r not in self.rows for r in rows) or sorted(rows) != rows:
            raise ValueError(f"rows {rows} must be an ordered subset of the live rows {self.rows}")
        index = [self.rows.index(r) for r in rows]
        selected = torch.tensor(index, device=self.sequences.device)
        self.sequences, self.mask = self.sequences[selected], self.mask[selected]
        self.pixel_rows = [self.pixel_rows[i] for i in index]
        if self.grid_rows is not None:
            self.grid_rows = [self.grid_rows[i] for i in index]
        if self.positions is not None:
            self.positions = self.positions[selected]
        if self.image_outputs is not None:
            per_row = _split(self.image_outputs.pooler_output, self.image_counts)
            self.image_outputs.pooler_output = [feature for i in index for feature in per_row[i]]
        self.image_counts = [self.image_counts[i] for i in index]
        if self.started:
            self.cache.batch_select_indices(selected)
        self.lacks_eos = [self.lacks_eos[i] for i in index]
        self.rows = rows

    def fork(self, row: int) -> KVSession:
        """A one-row session continuing `row` (a live row, after at least one turn) on a copy of its part of the
        cache; this session is left as it is. Client-run tools park a finished think turn this way."""
        import torch

        if not self.started or row not in self.rows:
            raise ValueError(f"row {row} is not a live row of a started session (live: {self.rows})")
        index = self.rows.index(row)
        selected = torch.tensor([index], device=self.sequences.device)
        twin = copy.copy(self)
        twin.sequences, twin.mask = self.sequences[selected], self.mask[selected]
        twin.pixel_rows = [self.pixel_rows[index]]
        twin.grid_rows = None if self.grid_rows is None else [self.grid_rows[index]]
        twin.positions = None if self.positions is None else self.positions[selected]
        twin.cache = copy.copy(self.cache)
        twin.cache.layers = [copy.copy(layer) for layer in self.cache.layers]
        twin.cache.batch_select_indices(selected)  # new tensors: the layers' own are not touched
        twin.rows, twin.lacks_eos, twin.image_outputs = [0], [self.lacks_eos[index]], None
        twin.image_counts = [self.image_counts[index]]
        return twin

    def rewind(self) -> None:
        """Forget the last generated turn (its tokens, mask and cache): the next `tails` bring it back, e.g. as the
        chat template renders it. Client-run tools park a plan this way, so that continuing equals a re-prefill."""
        if not self.started:
            raise ValueError("rewind needs a generated turn")
        self.sequences, self.mask = self.sequences[:, : self.turn_start], self.mask[:, : self.turn_start]
        if (extra := self.cache.get_seq_length() - self.turn_start) > 0:
            self.cache.crop(-extra)
        self.lacks_eos = [False] * len(self.rows)

    def _append(self, tails: list[list[int]]) -> list[int]:
        """Append each row's new tokens (after a </s> if its last turn was cut off), left-padded to one width."""
        import torch

        pieces = [
            ([self.tokenizer.eos_token_id] if lacks else []) + list(tail)
            for lacks, tail in zip(self.lacks_eos, tails, strict=True)
        ]
        width = max(len(p) for p in pieces)
        ids = torch.full((len(pieces), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(pieces), width), dtype=torch.long)
        for row, piece in enumerate(pieces):
            if piece:
                ids[row, width - len(piece) :] = torch.tensor(piece, dtype=torch.long)
                mask[row, width - len(piece) :] = 1
        self.sequences = torch.cat([self.sequences, ids.to(self.sequences.device)], dim=1)
        self.mask = torch.cat([self.mask, mask.to(self.mask.device)], dim=1)
        return [len(p) for p in pieces]

    def generate(
        self,
        rows: list[int],
        tails: list[list[int]] | None = None,
        stream: Callable[[str], None] | None = None,
        keep_logits: bool = False,
        max_new_tokens: int | None = None,
    ) -> list[Turn]:
        """Generate the next assistant turn of `rows`; `tails` are the user-turn ids each row gets first.
        `max_new_tokens` shortens this turn below the options' (the agent does so when the context is nearly full)."""
        import torch
        from transformers import DynamicCache

        self._keep(rows)
        if self.started:
            if tails is None:
                raise ValueError("every turn after the first needs the new user-turn tokens (tails)")
            new_tokens = self._append(tails)
        else:
            if tails is not None:
                raise ValueError("the first turn is generated from the prompt alone")
            new_tokens = self.mask.sum(dim=1).tolist()
        kwargs: dict[str, Any] = {}
        if not self.started:
            kwargs["mm_encoder_outputs"] = {"image": self.image_outputs}
            kwargs.update(self.family.vision_kwargs(self.model.config.image_token_id, self.sequences, self._grid()))
        elif not self.reuse_cache:  # the baseline: forget the cache, re-encode the image, re-prefill everything
            self.cache = DynamicCache(config=self.model.config)
            kwargs["pixel_values"] = torch.cat(self.pixel_rows)
            kwargs.update(self.family.vision_kwargs(self.model.config.image_token_id, self.sequences, self._grid()))
            new_tokens = self.mask.sum(dim=1).tolist()
        else:  # the model keeps one position state; this session's goes back in before its cache is extended
            self.family.set_position_state(self.model, self.positions)
        if stream is not None and len(rows) == 1:
            kwargs["streamer"] = text_streamer(self.tokenizer, stream)
        if self.logits_processor is not None:
            kwargs["logits_processor"] = self.logits_processor
        width = self.sequences.shape[1]
        start = time.perf_counter()
        config = copy.deepcopy(self.generation_config)
        config.return_dict_in_generate, config.output_logits = True, keep_logits
        if max_new_tokens is not None:
            config.max_new_tokens = min(config.max_new_tokens, max_new_tokens)
        lookup = self.started and self.reuse_cache and len(rows) == 1 and not keep_logits and self.lookup_tokens > 0
        lookup = lookup and self.family.PROMPT_LOOKUP
        with torch.inference_mode():
            if lookup and not config.do_sample and config.repetition_penalty == 1.0:
                out = _lookup_decode(
                    self.model, self.sequences, self.mask, self.cache, config, self.lookup_tokens, **kwargs
                )
            else:
                out = self.model.generate(
                    input_ids=self.sequences,
                    attention_mask=self.mask,
                    cache=self.cache,
                    generation_config=config,
                    **kwargs,
                )
        seconds = time.perf_counter() - start
        self.started, self.image_outputs, self.turn_start = True, None, width
        self.positions = self.family.position_state(self.model)
        self.cache = out.cache
        generated = out.sequences[:, width:]
        new_mask = torch.zeros_like(generated)
        turns = []
        for row in range(generated.shape[0]):
            ids = generated[row].tolist()
            finished = self.tokenizer.eos_token_id in ids
            length = ids.index(self.tokenizer.eos_token_id) if finished else len(ids)
            new_mask[row, : length + (1 if finished else 0)] = 1
            self.lacks_eos[row] = not finished
            logits = (
                torch.stack([step[row] for step in out.logits])[: length + 1].float().cpu() if keep_logits else None
            )
            text = self.tokenizer.decode(ids[:length], skip_special_tokens=True).strip()
            stats = out.stats if isinstance(out, _LookupOutput) else None
            turns.append(Turn(ids[:length], text, finished, int(new_tokens[row]), seconds, logits, stats))
        self.sequences = out.sequences
        self.mask = torch.cat([self.mask, new_mask.to(self.mask.device)], dim=1)
        return turns


LOOKUP_MAX_NGRAM = 16  # the longest suffix searched for earlier in the conversation (the longest match wins)
LOOKUP_MIN_NGRAM = 2  # a shorter match proposes nothing: one token (a digit, a comma) mostly points at the wrong place


@dataclass
class LookupStats:
    """What prompt-lookup speculation did in one turn: forward passes, tokens proposed, proposed tokens accepted."""

    forwards: int = 0
    proposed: int = 0
    accepted: int = 0
    generated: int = 0

    @property
    def tokens_per_forward(self) -> float:
        return self.generated / self.forwards if self.forwards else 0.0


@dataclass
class _LookupOutput:
    sequences: Any
    cache: Any
    stats: LookupStats


def _propose(ids: list[int], count: int) -> list[int]:
    """The tokens that followed the earlier occurrence of the longest suffix of `ids` (the most recent one among
    equally long matches), as many as the suffix matched and at most `count`; nothing below LOOKUP_MIN_NGRAM.

    Digits are single tokens, so a short suffix such as `,0.` occurs in every box of a tool output: the longest
    match is the likeliest to be the passage being quoted. The draft is as long as the match because a copy that
    has run for n tokens tends to run on, while a fresh, short match fails often, and every proposed token costs
    compute to verify (on a CPU almost as much as a decoding step for a few of them)."""
    last = len(ids) - 1
    best, start = 0, 0
    for end in range(last - 1, -1, -1):  # where an earlier copy of the suffix would end, newest first
        if ids[end] != ids[last]:
            continue
        length = 1
        while length < LOOKUP_MAX_NGRAM and length <= end and ids[end - length] == ids[last - length]:
            length += 1
        if length > best:
            best, start = length, end + 1
            if length == LOOKUP_MAX_NGRAM:
                break
    return ids[start : start + min(count, best)] if best >= LOOKUP_MIN_NGRAM else []


def _lookup_decode(model, sequences, mask, cache, config, lookup_tokens: int, streamer=None, logits_processor=None):
    """Greedy decoding of one row with prompt-lookup speculation on `cache` (which holds a prefix of `sequences`).

    Each step feeds the tokens the cache lacks plus up to `lookup_tokens` proposed ones (`_propose`), takes the
    greedy token at every position (after `logits_processor` and the min-length rule), keeps the proposals up to the
    first disagreement plus the model's own token there, and crops the cache back to what was kept."""
    import torch

    eos = config.eos_token_id
    ids = sequences[0].tolist()
    keep = mask[0].tolist()
    width, generated = len(ids), 0
    stats = LookupStats()
    if streamer is not None:
        streamer.put(sequences.cpu())
    done = False
    while not done:
        room = config.max_new_tokens - generated
        proposal = _propose(ids, min(lookup_tokens, room - 1)) if room > 1 else []
        cached = cache.get_seq_length()
        feed = ids[cached:] + proposal
        full_mask = torch.tensor([keep + [1] * len(proposal)], dtype=torch.long, device=sequences.device)
        positions = (full_mask.cumsum(-1) - 1).masked_fill(full_mask == 0, 0)[:, cached:]
        logits = model(
            input_ids=torch.tensor([feed], device=sequences.device),
            attention_mask=full_mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=len(proposal) + 1,
        ).logits[0]
        for step in range(len(proposal) + 1):
            scores = logits[step : step + 1].float()
            if generated < (config.min_new_tokens or 0):  # before the processors, as in `generate`
                scores[:, eos] = float("-inf")
            if logits_processor is not None:
                scores = logits_processor(torch.tensor([ids], device=sequences.device), scores)
            token = int(scores.argmax(dim=-1))
            ids.append(token)
            keep.append(1)
            generated += 1
            if streamer is not None:
                streamer.put(torch.tensor([token]))
            done = token == eos or generated >= config.max_new_tokens
            if done or step == len(proposal) or token != proposal[step]:
                break
        accepted = step + int(step < len(proposal) and token == proposal[step])  # proposed tokens kept
        stats.forwards += 1
        stats.proposed += len(proposal)
        stats.accepted += accepted
        if (extra := cache.get_seq_length() - (len(ids) - 1)) > 0:
            cache.crop(-extra)  # drop the rejected proposals
    if streamer is not None:
        streamer.end()
    stats.generated = generated
    return _LookupOutput(torch.tensor([ids], device=sequences.device)[:, : width + generated], cache, stats)


class AnswerExtractor:
    """Streams the final answer out of a turn as it is decoded: the `value` string of a turn whose `actions` is `[]`.

    The wire format writes `reasoning`, `actions`, `value` in that order, so by the time `value` starts it is known
    whether the turn calls tools (nothing is streamed) or answers. `ChatResult.answer` stays the authoritative text.
    `boxes`: the model quotes boxes in its own convention: they are streamed normalised, as the answer holds them
    (the text from an unclosed `[` waits for its `]`).
    """

    OPENING = re.compile(r'"value"\s*:\s*"')
    NO_ACTIONS = re.compile(r'"actions"\s*:\s*\[\s*\]')

    def __init__(self, on_answer: Callable[[str], None], boxes: BoxCodec | None = None):
        self.on_answer, self.boxes = on_answer, boxes
        self.text = ""
        self.emitted = 0  # answer characters already passed on (of the answer with its boxes mapped)
        self.closed = False

    def feed(self, piece: str) -> None:
        self.text += piece
        if self.closed:
            return
        opening = self.OPENING.search(self.text)
        if opening is None or not self.NO_ACTIONS.search(self.text, 0, opening.start()):
            return
        raw = self.text[opening.end() :]
        decoded, self.closed = _json_string_prefix(raw)
        if self.boxes is not None:
            open_at = decoded.rfind("[")
            if not self.closed and open_at > decoded.rfind("]"):
                decoded = decoded[:open_at]  # a box may be being quoted: wait for its end
            decoded = text_from_model(decoded, self.boxes)
        if len(decoded) > self.emitted:
            self.on_answer(decoded[self.emitted :])
            self.emitted = len(decoded)


def _json_string_prefix(raw: str) -> tuple[str, bool]:
    """Decode the complete part of a JSON string body (`raw` follows the opening quote); True once it is closed."""
    i, end, closed = 0, len(raw), False
    while i < end:
        char = raw[i]
        if char == '"':
            closed = True
            break
        if char == "\\":
            step = 6 if raw[i + 1 : i + 2] == "u" else 2
            if i + step > end:
                break
            i += step
            continue
        i += 1
    try:
        return json.loads('"' + raw[:i] + '"'), closed
    except json.JSONDecodeError:
        return "", closed
