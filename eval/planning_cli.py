"""`geopilot eval planning --agent geopilot|openai|hf ... [--cases FILE] --seeds 42,1337,2024 --out DIR`.

    geopilot eval planning --agent geopilot --model runs/stage2/export --out runs/eval/geopilot [--batch-size 16]
    geopilot eval planning --agent openai --engine-url http://localhost:8000/v1 --model Qwen2.5-VL-7B \
        --tools-as openai --api-key-env OPENAI_API_KEY --out runs/eval/qwen
    geopilot eval planning --agent hf --model /models/llava-1.5-7b-hf --out runs/eval/llava

Writes DIR/results.jsonl (append-only; re-run the same command to resume), cases.csv, summary.json,
leaderboard.md and leaderboard.png. docs/eval_planning.md describes the cases and the metrics.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from geopilot.argtypes import add_deprecated_name, int_in
from geopilot.errors import GeoPilotInputError
from geopilot.eval.agents import AGENTS

MAX_BATCH = 1024  # cases in one chat_batch; more is a typo, not a batch that fits in memory


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--agent", required=True, choices=list(AGENTS), help="; ".join(f"{k}: {v}" for k, v in AGENTS.items())
    )
    parser.add_argument("--model", help="model directory (geopilot, hf) or the endpoint's model name (openai)")
    parser.add_argument("--engine-url", help="openai: the endpoint, e.g. http://localhost:8000/v1")
    add_deprecated_name(parser, "--base-url", "--engine-url")
    parser.add_argument("--api-key-env", help="openai: the environment variable that holds the API key")
    parser.add_argument(
        "--tools-as",
        choices=["prompt", "openai"],
        default="prompt",
        help="openai: tools described in the system prompt (GeoPilot JSON replies) or as OpenAI functions",
    )
    parser.add_argument(
        "--cases",
        help="a case file (JSONL); default: the frozen planning set planning_v1 (the chain suite: "
        "geopilot/eval/data/chains_v1.jsonl, its tools answering from its annotations)",
    )
    parser.add_argument("--seeds", default="42,1337,2024", help="comma-separated seeds (default 42,1337,2024)")
    parser.add_argument("--out", required=True, help="the run folder (resumed if it holds this run)")
    parser.add_argument(
        "--tools-config", help="bind the real tool backends from this tools config instead of the planning fixture"
    )
    parser.add_argument(
        "--catalog", help="the indicator tools of this catalogue as the tool layer (docs/indicators.md)"
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="tokens per generated turn")
    parser.add_argument("--request-timeout", type=float, default=120.0, help="openai: seconds per request")
    add_deprecated_name(parser, "--timeout-s", "--request-timeout", type=float)
    parser.add_argument("--retries", type=int, default=2, help="openai: retries after a timeout, 429 or 5xx")
    parser.add_argument("--device", default="auto", help="geopilot, hf: cpu, cuda, cuda:1 (default: cuda when present)")
    parser.add_argument(
        "--unconstrained-plans",
        action="store_true",
        help="geopilot: decode think turns freely instead of in the plan grammar (the ablation)",
    )
    parser.add_argument(
        "--batch-size",
        type=int_in(1, MAX_BATCH),
        default=1,
        help="geopilot: cases per GeoPilot.chat_batch (sharing seed and max_rounds; the other agents run one at a "
        "time). A batched run is a run of its own: padded rows' numbers can differ from one at a time (default 1)",
    )
    parser.add_argument("--json", action="store_true", help="print summary.json")


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise GeoPilotInputError(f"--seeds must be comma-separated integers, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise GeoPilotInputError(f"--seeds needs at least one seed and no repeats, got {text!r}")
    return seeds


def build_agent(args: argparse.Namespace, registry):
    from geopilot.eval import agents

    if args.max_new_tokens < 1 or args.temperature < 0:
        raise GeoPilotInputError("--max-new-tokens must be >= 1 and --temperature >= 0")
    if args.unconstrained_plans and args.agent != "geopilot":
        raise GeoPilotInputError(f"--unconstrained-plans is for --agent geopilot, not {args.agent}")
    generation = {"max_new_tokens": args.max_new_tokens}
    if args.temperature > 0:
        generation.update(do_sample=True, temperature=args.temperature)
    if args.agent in ("reference", "reference-first-step"):
        from geopilot.eval.reference_agent import ReferenceAgent

        return ReferenceAgent(registry, 1 if args.agent == "reference-first-step" else None), args.agent
    if not args.model:
        raise GeoPilotInputError(f"--agent {args.agent} needs --model")
    if args.agent == "openai":
        if not args.engine_url:
            raise GeoPilotInputError("--agent openai needs --engine-url")
        agent = agents.OpenAIAgent(
            args.engine_url,
            args.model,
            registry,
            args.api_key_env,
            args.tools_as,
            args.temperature,
            args.max_new_tokens,
            args.request_timeout,
            args.retries,
        )
        return agent, f"openai:{args.model}"
    if args.engine_url or args.api_key_env:
        raise GeoPilotInputError(f"--engine-url and --api-key-env are for --agent openai, not {args.agent}")
    label = f"{args.agent}:{Path(args.model).name}"
    if args.agent == "geopilot":
        agent = agents.GeoPilotAgent(
            args.model, registry, generation, device=args.device, constrain_plans=not args.unconstrained_plans
        )
        return agent, label
    return agents.HFAgent(args.model, registry, generation, device=args.device), label


def run(args: argparse.Namespace) -> int:
    from geopilot.eval.cases import load_cases
    from geopilot.eval.planning_set import CATEGORY_ORDER, PLANNING_FILE
    from geopilot.eval.runner import run_benchmark
    from geopilot.eval.toolkit import annotation_layer, build_tool_layer, suite_annotations

    seeds = parse_seeds(args.seeds)
    case_set = load_cases(args.cases or PLANNING_FILE)
    if args.tools_config and args.catalog:
        raise GeoPilotInputError("--tools-config and --catalog are two different tool layers: pick one")
    annotations = suite_annotations(case_set.path) if not (args.tools_config or args.catalog) else None
    if annotations is not None:  # a suite shipping its annotations (the chain suite): tools answer from them
        registry, layer = annotation_layer(annotations)
    else:
        registry, layer = build_tool_layer(args.tools_config, args.catalog)
    agent, label = build_agent(args, registry)
    step = max(1, len(case_set.cases) * len(seeds) // 20)

    def progress(done: int, total: int) -> None:
        if done % step == 0 or done == total:
            print(f"[{done}/{total}]", file=sys.stderr, flush=True)

    order = CATEGORY_ORDER if args.cases is None else None  # another suite: its categories in file order
    summary = run_benchmark(agent, case_set, seeds, args.out, layer, label, order, progress, args.batch_size)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        metrics = "  ".join(
            f"{m} {100 * summary[m]:.1f}%" if summary[m] is not None else f"{m} –" for m in ("TSA", "PA", "NTA", "OPA")
        )
        accuracy = summary["accuracy"]["mean"]
        passed = f"  all checks {100 * accuracy:.1f}%" if accuracy is not None else ""
        print(
            f"{label}: {metrics}{passed}  ({summary['n_cases']} cases x {len(seeds)} seeds, "
            f"{summary['infra_errors']} infra errors)"
        )
        if "chains" in summary:
            chains = summary["chains"]
            print(
                "chains: "
                + "  ".join(
                    f"{m} {100 * chains[m]:.1f}%" if chains[m] is not None else f"{m} –"
                    for m in ("first_step", "second_step", "both", "answer", "chain")
                )
            )
        for seed, scores in summary.get("captions", {}).items():
            print(
                f"captions (seed {seed}, {scores['total']} cases): "
                + "  ".join(f"{m} {100 * scores[m]:.1f}" for m in ("BLEU-4", "ROUGE-L", "CIDEr"))
            )
        print(f"reports in {args.out}: results.jsonl cases.csv summary.json leaderboard.md leaderboard.png")
    return 0
