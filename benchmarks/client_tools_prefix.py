"""The answer turn after client-run tools with the prefix cache vs without (issue 25 item 1).

    python benchmarks/client_tools_prefix.py [--repeats 3] [--dtype float32] [--answer-tokens 48]

The model is chat_latency.py's 109 M mid-size random LLaVA (576 image tokens, as LLaVA-1.5). Each round: a think
request with `tool_choice="required"` on a no-params tool (the plan grammar makes the random model write a valid
plan), then the request bringing the tool's result, once on a pilot with a PrefixCache (the parked think turn is
continued: only the plan, as rendered, and the tool turn are prefilled) and once without (image, prompt and plan are re-prefilled). The
answer is held to `--answer-tokens` (min = max) so both decode the same length; the time is the whole answer
request as `chat` sees it (`ChatResult.timings.total`). Printed: seconds per round, tokens prefilled, and
the ratio without / with, per round and median.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
from chat_latency import mid_size_model  # benchmarks/ is on sys.path when run as a script
from pydantic import BaseModel, ConfigDict

from geopilot.agent import ClientTools, GeoPilot, PrefixCache
from geopilot.tool_output import Detection, ToolOutput
from geopilot.tool_protocol import ToolRegistry

OUTPUT = ToolOutput(detections=[Detection(label="plane", box=(0.1 * i, 0.2, 0.1 * i + 0.05, 0.3)) for i in range(1, 8)])


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WholeScene:
    name, description, modality, params_model = "detect_all", "every object", "optical", NoParams

    def run(self, image, params):
        return OUTPUT


def one_round(model, processor, image, answer_tokens: int) -> dict:
    registry = ToolRegistry([WholeScene()])
    think_options = {"max_new_tokens": 64}
    answer_options = {"max_new_tokens": answer_tokens, "min_new_tokens": answer_tokens, "prompt_lookup_tokens": 0}
    out = {}
    for label, cache in (("cached", PrefixCache()), ("re-prefilled", None)):
        pilot = GeoPilot(model, processor, registry, prefix_cache=cache)
        think = pilot.chat(
            image,
            "How many planes?",
            generation=think_options,
            client_tools=ClientTools(("detect_all",), choice="required"),
        )
        if think.outcome != "tool_calls" or think.repaired:
            raise RuntimeError(f"the think turn did not hand off a valid plan: {think.outcome}, {think.error}")
        history = [m.model_dump(mode="json") for m in think.messages] + [
            {"role": "tool", "name": "detect_all", "content": OUTPUT.model_dump(mode="json")}
        ]
        answer = pilot.chat(
            image,
            None,
            history=history,
            generation=answer_options,
            client_tools=ClientTools(("detect_all",), choice="none"),
        )
        if cache is not None and cache.hits != 1:
            raise RuntimeError("the answer request missed the prefix cache")
        out[label] = (answer.timings.total, answer.tokens.input)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--answer-tokens", type=int, default=48)
    args = parser.parse_args()
    model, processor = mid_size_model(args.dtype)
    model.eval()
    image = np.random.default_rng(0).integers(0, 255, (336, 336, 3), dtype=np.uint8)
    one_round(model, processor, image, 4)  # warm-up
    rounds = [one_round(model, processor, image, args.answer_tokens) for _ in range(args.repeats)]
    ratios = [r["re-prefilled"][0] / r["cached"][0] for r in rounds]
    for label in ("cached", "re-prefilled"):
        seconds = " ".join(f"{r[label][0]:.3f}" for r in rounds)
        print(f"{label:>13}: answer request {seconds} s, {rounds[0][label][1]} tokens prefilled")
    print(f"re-prefilled / cached: {statistics.median(ratios):.2f}x (rounds {' '.join(f'{r:.2f}' for r in ratios)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
