"""Chat latency: what KV-cache reuse buys on the answer turn, and what a tool round costs over a direct answer.

    python benchmarks/chat_latency.py                       # CPU, random mid-size model (hidden 1024, 8 layers)
    python benchmarks/chat_latency.py --device cuda --dtype bfloat16 --json
    python benchmarks/chat_latency.py --answer-reasoning "" --answer-value "3 planes."   # a short answer turn

The model is random (LLaVA-1.5 shape: 336 px / patch 14 = the real 576 image tokens; hidden 1024, 8 layers), so its
token choices are fixed by a logits processor that forces a scripted plan and answer: every forward pass runs
exactly as in a real chat, only the argmax is overridden. Two measurements, each round interleaving all of
them (a shared machine's load then hits both sides alike), medians over --repeats rounds; ratios are taken per
round and printed with their spread. A target is "met" only when every round meets it, the rounds agree within
--max-spread and no round contradicts itself (e.g. a direct query slower than the tool query); otherwise the
verdict is "noisy, rerun" (benchmarks/rounds.py):

1. answer turn with KV reuse (feed only the tool turn) vs a full re-prefill (image re-encoded, everything
   re-prefilled, as LLaVA-Plus does), whole turn and up to its first token. Target: >= 2x faster with reuse.
2. a tool query (think, tool, answer) vs a direct query (one answer turn with the same answer), through
   GeoPilot.chat. overhead = tool-query latency - tool time - direct latency; target: <= answer-turn time + 10%.
3. an answer that quotes the three boxes of the tool output: the whole answer turn with KV reuse + prompt-lookup
   speculation (`GenerationOptions.prompt_lookup_tokens`, drawn from the tool turn) vs the LLaVA-Plus re-prefill.
   Target: >= 2x. Also shown: KV reuse without lookup, so the gain of each part is visible, and the lookup turn's
   forward passes and accepted proposals.
Measurements 1 and 2 decode without lookup, so they show KV reuse alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np
import torch
from output import emit  # benchmarks/output.py
from PIL import Image
from pydantic import BaseModel, ConfigDict
from rounds import MAX_SPREAD, Rounds, judge  # benchmarks/rounds.py (this folder is on sys.path when run as a script)
from transformers import LogitsProcessor, LogitsProcessorList

from geopilot.agent import GeoPilot
from geopilot.generation import GenerationOptions, KVSession, LookupStats
from geopilot.model import ModelConfig, TinyModelConfig, build_model, num_image_tokens
from geopilot.render import render_turns, user_turn_text
from geopilot.sample import Action, AssistantMessage
from geopilot.tokenizer import encode_text
from geopilot.tool_output import Detection, ToolOutput
from geopilot.tool_protocol import ToolRegistry
from geopilot.wire import assistant_json, format_tool_turn

QUESTION = "How many planes are parked on the apron next to the terminal?"
PLAN = AssistantMessage(
    reasoning="Counting planes needs the object detector on the whole scene.",
    actions=[Action(tool="detect_objects", params={"categories": ["plane"]})],
)
ANSWER = AssistantMessage(reasoning="The detector found three planes.", value="There are 3 planes parked on the apron.")
QUOTE = AssistantMessage(
    reasoning="The detector found three planes at [0.1,0.1,0.2,0.2], [0.3,0.3,0.4,0.4] and [0.6,0.5,0.7,0.6].",
    value="There are 3 planes: at [0.1,0.1,0.2,0.2], at [0.3,0.3,0.4,0.4] and at [0.6,0.5,0.7,0.6].",
)
LOOKUP_TOKENS = 10
TOOL_SECONDS = 0.05
RATIOS = (  # measured within each round; their spread over rounds is reported
    "answer_turn_speedup",
    "answer_first_token_speedup",
    "overhead_over_answer_turn",
    "overhead_per_plan_token_over_answer_per_token",
    "quote_answer_speedup",
    "quote_lookup_gain",
)
MAX_NEW_TOKENS = 256


class CategoriesParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    categories: list[str]


class TimedDetector:
    """A stand-in detector with a fixed cost, so tool time is known and subtracted."""

    name, description, modality, params_model = "detect_objects", "finds objects", "optical", CategoriesParams

    def run(self, image, params) -> ToolOutput:
        time.sleep(TOOL_SECONDS)
        boxes = [(0.1, 0.1, 0.2, 0.2), (0.3, 0.3, 0.4, 0.4), (0.6, 0.5, 0.7, 0.6)]
        return ToolOutput(detections=[Detection(label="plane", box=b, score=0.9) for b in boxes])


class ForcedText(LogitsProcessor):
    """Makes generate emit a scripted token sequence, then </s>; the forward passes are the real ones."""

    def __init__(self, eos_id: int):
        self.eos_id, self.script, self.start = eos_id, [], None

    def expect(self, ids: list[int]) -> None:
        self.script, self.start = ids + [self.eos_id], None

    def __call__(self, input_ids, scores):
        if self.start is None:
            self.start = input_ids.shape[1]
        token = self.script[min(input_ids.shape[1] - self.start, len(self.script) - 1)]
        forced = torch.full_like(scores, float("-inf"))
        forced[:, token] = 0.0
        return forced


class ScriptedKVSession(KVSession):
    """A real KVSession whose turns follow a script (one text per turn)."""

    def __init__(self, model, tokenizer, prompts, pixels, options, texts: list[str], reuse_cache: bool = True):
        self.forcer = ForcedText(tokenizer.eos_token_id)
        super().__init__(model, tokenizer, prompts, pixels, options, reuse_cache, LogitsProcessorList([self.forcer]))
        self.texts = list(texts)

    def generate(self, rows, tails=None, stream=None, keep_logits=False, max_new_tokens=None):
        self.forcer.expect(encode_text(self.tokenizer, " " + self.texts.pop(0)))
        return super().generate(rows, tails, stream, keep_logits, max_new_tokens)


def mid_size_model(dtype: str):
    tiny = TinyModelConfig(
        image_size=336,
        patch_size=14,
        vision_hidden=256,
        vision_layers=4,
        vision_heads=4,
        text_hidden=1024,
        text_layers=8,
        text_heads=16,
        text_kv_heads=16,
        text_intermediate=2816,
        max_position_embeddings=4096,
    )
    return build_model(ModelConfig(tiny=tiny, dtype=dtype))


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def answer_turn_seconds(
    model, processor, image, reuse: bool, answer_tokens: int, answer: AssistantMessage | None = None, lookup: int = 0
) -> tuple[float, int, LookupStats | None]:
    """Seconds of the answer-turn generate call (after a think turn), the tokens it prefilled, and what lookup
    speculation did (None without it)."""
    tok = processor.tokenizer
    prompt = render_turns([("user", f"<image>\n{QUESTION}")], tok, num_image_tokens(model.config)).input_ids
    pixels = processor.image_processor([image], return_tensors="pt")["pixel_values"]
    answer_text = assistant_json(answer or ANSWER)
    session = ScriptedKVSession(
        model,
        tok,
        [prompt],
        pixels,
        GenerationOptions(max_new_tokens=answer_tokens, prompt_lookup_tokens=lookup),
        [assistant_json(PLAN), answer_text],
        reuse_cache=reuse,
    )
    session.generate([0])
    tool_turn = format_tool_turn([("detect_objects", TimedDetector().run(None, None))], QUESTION)
    tail = encode_text(tok, user_turn_text(tool_turn, first=False))
    _sync(model.device)
    start = time.perf_counter()
    [turn] = session.generate([0], [tail])
    _sync(model.device)
    return time.perf_counter() - start, turn.new_input_tokens, turn.lookup


def chat_seconds(model, processor, image, texts: list[str], reuse: bool = True) -> tuple[float, object]:
    def factory(prompts, pixels, options):
        return ScriptedKVSession(model, processor.tokenizer, prompts, pixels, options, texts, reuse_cache=reuse)

    pilot = GeoPilot(model, processor, ToolRegistry([TimedDetector()]), session_factory=factory)
    _sync(model.device)
    start = time.perf_counter()
    result = pilot.chat(image, QUESTION, generation=GenerationOptions(prompt_lookup_tokens=0))  # KV reuse alone
    _sync(model.device)
    return time.perf_counter() - start, result


def measure_once(model, processor, image) -> dict:
    """One interleaved round of every measurement, so load changes on a shared machine hit all of them alike."""
    reuse, prefilled_reuse, _ = answer_turn_seconds(model, processor, image, True, MAX_NEW_TOKENS)
    reprefill, prefilled_reprefill, _ = answer_turn_seconds(model, processor, image, False, MAX_NEW_TOKENS)
    first_reuse, _, _ = answer_turn_seconds(model, processor, image, True, 1)
    first_reprefill, _, _ = answer_turn_seconds(model, processor, image, False, 1)
    quote_lookup, _, lookup = answer_turn_seconds(model, processor, image, True, MAX_NEW_TOKENS, QUOTE, LOOKUP_TOKENS)
    quote_reuse, _, _ = answer_turn_seconds(model, processor, image, True, MAX_NEW_TOKENS, QUOTE)
    quote_reprefill, _, _ = answer_turn_seconds(model, processor, image, False, MAX_NEW_TOKENS, QUOTE)
    direct, direct_result = chat_seconds(model, processor, image, [assistant_json(ANSWER)])
    tool, tool_result = chat_seconds(model, processor, image, [assistant_json(PLAN), assistant_json(ANSWER)])
    no_reuse, no_reuse_result = chat_seconds(
        model, processor, image, [assistant_json(PLAN), assistant_json(ANSWER)], False
    )
    assert direct_result.outcome == "direct" and tool_result.outcome == no_reuse_result.outcome == "tools"
    assert tool_result.tool_calls[0].error is None
    overhead = tool - tool_result.timings.tools - direct
    think_tokens, answer_tokens = (t.generated_tokens for t in tool_result.turns)
    return {
        "answer_turn_reuse_s": reuse,
        "answer_turn_reprefill_s": reprefill,
        "answer_turn_speedup": reprefill / reuse,
        "answer_first_token_reuse_s": first_reuse,
        "answer_first_token_reprefill_s": first_reprefill,
        "answer_first_token_speedup": first_reprefill / first_reuse,
        "direct_query_s": direct,
        "tool_query_s": tool,
        "tool_time_s": tool_result.timings.tools,
        "think_turn_s": tool_result.timings.think,
        "answer_turn_s": tool_result.timings.answer,
        "tool_overhead_s": overhead,
        "overhead_over_answer_turn": overhead / tool_result.timings.answer,
        # the overhead is one more generated turn (the plan); per generated token it should match the answer turn
        "overhead_per_plan_token_over_answer_per_token": (overhead / think_tokens)
        / (tool_result.timings.answer / answer_tokens),
        "tool_overhead_without_reuse_s": no_reuse - no_reuse_result.timings.tools - direct,
        "quote_answer_lookup_s": quote_lookup,
        "quote_answer_reuse_s": quote_reuse,
        "quote_answer_reprefill_s": quote_reprefill,
        "quote_answer_speedup": quote_reprefill / quote_lookup,
        "quote_lookup_gain": quote_reuse / quote_lookup,
        "_counts": (prefilled_reuse, prefilled_reprefill, tool_result.tokens.prompt, think_tokens, answer_tokens),
        "_lookup": dataclasses.asdict(lookup),  # the same in every round: greedy decoding is deterministic
    }


def contradictions(rounds: list[dict]) -> dict[str, list[str]]:
    """Per-round results that break what the code guarantees: load, not the code, made those numbers."""
    found = {"speedup": [], "overhead": []}
    for i, r in enumerate(rounds, 1):
        if r["answer_first_token_reuse_s"] >= r["answer_first_token_reprefill_s"]:
            found["speedup"].append(
                f"round {i}: reaching the first token with KV reuse ({r['answer_first_token_reuse_s']:.3f} s) was not "
                f"faster than re-prefilling everything ({r['answer_first_token_reprefill_s']:.3f} s)"
            )
        if r["tool_overhead_s"] <= 0:  # the tool query does strictly more work than the direct one
            found["overhead"].append(
                f"round {i}: the direct query ({r['direct_query_s']:.3f} s) was not faster than the tool query minus "
                f"tool time ({r['tool_query_s'] - r['tool_time_s']:.3f} s), overhead {r['tool_overhead_s']:.3f} s"
            )
    return found


def summarize(rounds: list[dict], max_spread: float = MAX_SPREAD) -> dict:
    """Medians, the spread of every per-round ratio, and the two target verdicts (see benchmarks/rounds.py)."""
    medians = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    spreads = {key: Rounds(tuple(r[key] for r in rounds)) for key in RATIOS}
    bad = contradictions(rounds)
    speedup = judge(spreads["answer_turn_speedup"], 2.0, True, max_spread, bad["speedup"])
    overhead = judge(spreads["overhead_over_answer_turn"], 1.1, False, max_spread, bad["overhead"])
    quote = judge(spreads["quote_answer_speedup"], 2.0, True, max_spread)
    return {
        **medians,
        "spread": {key: value.as_dict() for key, value in spreads.items()},
        "target_speedup_2x": str(speedup),
        "target_overhead_le_answer_plus_10pct": str(overhead),
        "target_quote_speedup_2x": str(quote),
    }


def print_report(report: dict) -> None:
    m, spread = report, {key: Rounds(tuple(v["rounds"])) for key, v in report["spread"].items()}
    print(
        f"model: {m['parameters_M']} M params, {m['image_tokens']} image tokens, prompt {m['prompt_tokens']} "
        f"tokens, think {m['think_tokens']} / answer {m['answer_tokens']} generated tokens, {m['device']} "
        f"{m['dtype']}; medians of {m['repeats']} interleaved rounds, ratios per round"
    )
    print(f"{'':34}{'KV reuse':>12}{'re-prefill':>12}")
    print(f"{'answer turn (s)':34}{m['answer_turn_reuse_s']:12.3f}{m['answer_turn_reprefill_s']:12.3f}")
    print(f"{'  speed-up':34}{spread['answer_turn_speedup'].describe()}")
    print(f"{'  target >= 2x':34}{m['target_speedup_2x']}")
    print(
        f"{'answer turn, to first token (s)':34}{m['answer_first_token_reuse_s']:12.3f}"
        f"{m['answer_first_token_reprefill_s']:12.3f}"
    )
    print(f"{'  speed-up':34}{spread['answer_first_token_speedup'].describe()}")
    print(
        f"{'answer turn prefilled tokens':34}{m['answer_turn_prefilled_tokens_reuse']:12d}"
        f"{m['answer_turn_prefilled_tokens_reprefill']:12d}"
    )
    print(f"{'':34}{'tool query':>12}{'direct':>12}")
    print(f"{'latency (s)':34}{m['tool_query_s']:12.3f}{m['direct_query_s']:12.3f}")
    print(f"{'tool time (s)':34}{m['tool_time_s']:12.3f}")
    print(f"{'think turn / answer turn (s)':34}{m['think_turn_s']:12.3f}{m['answer_turn_s']:12.3f}")
    print(f"{'overhead = tool - tools - direct':34}{m['tool_overhead_s']:12.3f} s")
    print(f"{'  over the answer turn':34}{spread['overhead_over_answer_turn'].describe()}")
    print(f"{'  target <= 1.10x':34}{m['target_overhead_le_answer_plus_10pct']}")
    print(
        f"{'  per generated token':34}{spread['overhead_per_plan_token_over_answer_per_token'].describe()} "
        f"(plan {m['think_tokens']} tokens vs answer {m['answer_tokens']})"
    )
    print(f"{'same overhead without KV reuse':34}{m['tool_overhead_without_reuse_s']:12.3f} s")
    print(f"{'answer quoting 3 boxes (s)':34}{'reuse+lookup':>12}{'reuse':>12}{'re-prefill':>12}")
    print(
        f"{'':34}{m['quote_answer_lookup_s']:12.3f}{m['quote_answer_reuse_s']:12.3f}{m['quote_answer_reprefill_s']:12.3f}"
    )
    print(f"{'  speed-up vs re-prefill':34}{spread['quote_answer_speedup'].describe()}")
    print(f"{'  target >= 2x':34}{m['target_quote_speedup_2x']}")
    print(f"{'  lookup alone (vs reuse)':34}{spread['quote_lookup_gain'].describe()}")
    if (lookup := m.get("quote_lookup")) is not None:
        print(
            f"{'  lookup forward passes':34}{lookup['forwards']:12d} for {lookup['generated']} tokens "
            f"({lookup['generated'] / lookup['forwards']:.2f} a pass; {lookup['accepted']} of {lookup['proposed']} "
            "proposed tokens accepted)"
        )


def main(argv: list[str] | None = None) -> int:
    global ANSWER  # the scripted answer of every measurement below (--answer-*)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-spread", type=float, default=MAX_SPREAD, help="rounds spread beyond this: noisy")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--answer-reasoning", default=ANSWER.reasoning, help="the scripted answer turn's reasoning")
    parser.add_argument("--answer-value", default=ANSWER.value, help="the scripted answer (its length sets the decode)")
    args = parser.parse_args(argv)
    ANSWER = AssistantMessage(reasoning=args.answer_reasoning, value=args.answer_value)
    torch.manual_seed(0)
    model, processor = mid_size_model(args.dtype)
    model = model.to(args.device).eval()
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (512, 640, 3), dtype=np.uint8))
    answer_turn_seconds(model, processor, image, True, MAX_NEW_TOKENS)  # warm-up
    rounds = [measure_once(model, processor, image) for _ in range(args.repeats)]
    prefilled_reuse, prefilled_reprefill, prompt_tokens, think_tokens, answer_tokens = rounds[0]["_counts"]
    quote_lookup = rounds[0]["_lookup"]
    for each in rounds:
        del each["_counts"], each["_lookup"]
    report = {
        "device": args.device,
        "dtype": args.dtype,
        "repeats": args.repeats,
        "parameters_M": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        "image_tokens": num_image_tokens(model.config),
        "prompt_tokens": prompt_tokens,
        "think_tokens": think_tokens,
        "answer_tokens": answer_tokens,
        "answer_turn_prefilled_tokens_reuse": prefilled_reuse,
        "answer_turn_prefilled_tokens_reprefill": prefilled_reprefill,
        "quote_lookup": quote_lookup,
        **summarize(rounds, args.max_spread),
        "rounds": rounds,
    }
    return emit(report, args.json, lambda: print_report(report))


if __name__ == "__main__":
    raise SystemExit(main())
