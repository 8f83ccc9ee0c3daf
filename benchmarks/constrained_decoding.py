"""Constrained decoding: what the plan grammar (`geopilot.agent.plan_schema`, xgrammar) costs per generated token,
and how long a registry's grammar takes to compile.

    python benchmarks/constrained_decoding.py                  # CPU: tiny model, tiny and 7B-shaped vocabularies
    python benchmarks/constrained_decoding.py --json --steps 128
    python benchmarks/constrained_decoding.py --device cuda --dtype bfloat16 --shape 7b   # a 7B-shaped decoder

Two vocabularies: the tiny model's own byte-fallback BPE, and a 7B-shaped one (32000 ids in the Llama layout:
3 specials, 256 byte tokens, then word pieces drawn from this repository's docs; no tokenizer is downloaded). Each
is put under a random decoder of the chosen `--shape` (`tiny`: the test model's text sizes; `7b`: hidden 4096, 32
layers, 32 heads, intermediate 11008, which needs a GPU) and decoded greedily for `--steps` tokens at batch 1 and
8 through `model.generate` (exactly `--steps` tokens), with and without `PlanLogits` over the default registry's
grammar (its budget set past the steps, so the budgeted close never starts). Reported per vocabulary and batch:
the unconstrained decode step (`step_ms`, generate's wall time per token), the median mask step inside it
(`mask_ms`: accept the last token, fill the bitmask, apply it, all rows), their ratio (`overhead`, target < 10 %),
and the constrained run's wall time per token against the unconstrained one (`measured_overhead`, noisier).
The closing search of the turn's last `CLOSE_WINDOW` tokens is timed on its own (`close_ms`: the median search
from the start state, caches warm).
Compile: the default registry's plan grammar per vocabulary, first compile (`compile_s`) and a cached lookup.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path

import torch
from output import emit  # benchmarks/output.py
from shapes import LLAVA_7B, llama_decoder_shape  # benchmarks/shapes.py

from geopilot.agent.plan_schema import PlanGrammars, PlanLogits

SHAPES = {
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128},
    "7b": llama_decoder_shape(LLAVA_7B),
}
LLAMA_VOCAB = 32000
PROMPT_TOKENS = 64


def llama_shaped_vocabulary() -> list[str]:
    """32000 token texts in the Llama layout: <unk> <s> </s>, <0x00>..<0xFF>, then `▁word` and word pieces."""
    text = " ".join(p.read_text() for p in sorted(Path(__file__).resolve().parents[1].glob("docs/*.md")))
    words = sorted(set(re.findall(r"[A-Za-z]{2,}", text)), key=lambda w: (len(w), w))
    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{i:02X}>" for i in range(256))]
    pieces += [chr(c) for c in range(33, 127) if chr(c) not in pieces]
    seen = set(pieces)
    for length in range(2, 12):
        for word in words:
            for candidate in ("\u2581" + word[:length], word[:length], word[-length:]):
                if candidate not in seen and len(pieces) < LLAMA_VOCAB:
                    seen.add(candidate)
                    pieces.append(candidate)
    letters = [chr(c) for c in range(97, 123)]
    fillers = (a + b + c for a in letters for b in letters for c in [""] + letters)  # then letter pairs and triples
    for piece in fillers:
        for candidate in (piece, "\u2581" + piece):
            if candidate not in seen and len(pieces) < LLAMA_VOCAB:
                seen.add(candidate)
                pieces.append(candidate)
    return pieces


def vocabularies() -> dict[str, PlanGrammars]:
    import xgrammar

    from geopilot.tokenizer import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    pieces = llama_shaped_vocabulary()
    llama = xgrammar.TokenizerInfo(
        pieces, vocab_type=xgrammar.VocabType.BYTE_FALLBACK, vocab_size=len(pieces), stop_token_ids=[2]
    )
    return {
        f"tiny ({len(tokenizer)} tokens)": PlanGrammars.of(tokenizer, len(tokenizer)),
        f"7B-shaped ({len(pieces)} tokens)": PlanGrammars(llama, 2),
    }


def decoder(shape: str, vocab_size: int, device: str, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, max_position_embeddings=4096, **SHAPES[shape])
    with torch.device(device):
        return LlamaForCausalLM(config).to(dtype).eval()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class Timed:
    """A logits processor timed call by call (the mask's own cost inside the decode step)."""

    def __init__(self, processor, device: str):
        self.processor, self.device, self.seconds = processor, device, []

    def __call__(self, input_ids, scores):
        sync(self.device)
        start = time.perf_counter()
        scores = self.processor(input_ids, scores)
        sync(self.device)
        self.seconds.append(time.perf_counter() - start)
        return scores


def decode(model, grammars: PlanGrammars, constraint, batch: int, steps: int, device: str) -> tuple[float, list]:
    """Seconds per generated token of `model.generate` (exactly `steps` tokens, greedy), and the mask's seconds per
    step (empty without `constraint`)."""
    from transformers import LogitsProcessorList

    ids = torch.randint(3, grammars.vocab_size, (batch, PROMPT_TOKENS), device=device)
    timed = None if constraint is None else Timed(PlanLogits(grammars, [constraint] * batch, steps + 1000), device)
    processors = LogitsProcessorList([] if timed is None else [timed])
    with torch.inference_mode():
        sync(device)
        start = time.perf_counter()
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=False,
            logits_processor=processors,
            pad_token_id=0,
            eos_token_id=2,
        )
        sync(device)
    return (time.perf_counter() - start) / steps, ([] if timed is None else timed.seconds)


def run(args: argparse.Namespace) -> dict:
    from geopilot.tools.registry import build_registry

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    registry = build_registry()
    constraint = registry.plan_constraint()
    dtype = getattr(torch, args.dtype)
    report: dict = {"shape": args.shape, "device": args.device, "dtype": args.dtype, "steps": args.steps, "rows": []}
    for name, grammars in vocabularies().items():
        start = time.perf_counter()
        grammars.compiled(constraint)
        compile_s = time.perf_counter() - start
        start = time.perf_counter()
        grammars.compiled(constraint)
        cached_s = time.perf_counter() - start
        matcher = grammars.matcher(constraint)
        grammars.closing(matcher)  # the first search also warms the matcher's caches
        searches = []
        for _ in range(5):
            start = time.perf_counter()
            grammars.closing(matcher)
            searches.append(time.perf_counter() - start)
        close_ms = statistics.median(searches) * 1e3
        model = decoder(args.shape, grammars.vocab_size, args.device, dtype)
        for batch in (1, 8):
            decode(model, grammars, constraint, batch, 4, args.device)  # warm-up
            free, _ = decode(model, grammars, None, batch, args.steps, args.device)
            steered, mask = decode(model, grammars, constraint, batch, args.steps, args.device)
            step_ms, mask_ms = free * 1e3, statistics.median(mask) * 1e3
            report["rows"].append(
                {
                    "vocabulary": name,
                    "batch": batch,
                    "step_ms": round(step_ms, 3),
                    "steered_step_ms": round(steered * 1e3, 3),
                    "mask_ms": round(mask_ms, 3),
                    "overhead": round(mask_ms / step_ms, 4),
                    "measured_overhead": round(steered / free - 1, 4),
                    "compile_s": round(compile_s, 4),
                    "cached_s": round(cached_s, 6),
                    "close_ms": round(close_ms, 3),
                }
            )
        del model
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--steps", type=int, default=64, help="decode steps per measurement (median taken)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: least disturbed by other load)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    report = run(args)

    def text() -> None:
        print(f"plan grammar cost: {args.shape} decoder on {args.device} ({args.dtype}), {args.steps} steps")
        for row in report["rows"]:
            print(
                f"  {row['vocabulary']:<24} batch {row['batch']}: step {row['step_ms']:.3f} ms, mask "
                f"{row['mask_ms']:.3f} ms = {100 * row['overhead']:.1f} % (target < 10 %; whole runs "
                f"{100 * row['measured_overhead']:+.1f} %); compile "
                f"{row['compile_s']:.3f} s, cached {row['cached_s'] * 1e6:.0f} us; one closing search "
                f"{row['close_ms']:.2f} ms"
            )

    return emit(report, args.json, text)


if __name__ == "__main__":
    raise SystemExit(main())
