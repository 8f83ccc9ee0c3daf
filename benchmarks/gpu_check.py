"""One prepared GPU check: the real precision paths, a 7B-shaped training step's MFU, inference and serving on CUDA.

    python benchmarks/gpu_check.py                 # on a CUDA machine: at most ~8 minutes, prints one table
    python benchmarks/gpu_check.py --dry-run       # every section at toy sizes on CPU (< 2 minutes)
    python benchmarks/gpu_check.py --only training,inference --layers 6

Sections (each in its own subprocess, so an out-of-memory error or a hang in one is recorded and the next runs):
  gpu_tests    `pytest -m gpu`: the tests that need CUDA.
  specialists  every tool backend's architecture (random weights; full size on CUDA) in its configured precision vs
               float32 on the same input: the largest difference in what the tool returns.
  training     a LLaVA-1.5-7B-shaped model (CLIP-ViT-L/14-336, projector, Vicuna-7B width 4096 / 32 heads / MLP
               11008, `--layers` decoder layers) doing stage-2 steps in bf16 with gradient checkpointing on tool
               traces with 576 image tokens: tokens/s, MFU, peak memory; length-grouped vs padded random batches.
  inference    the same shapes in bf16: time to the first answer token with KV reuse vs re-prefill (LLaVA-Plus), the
               quoted-boxes answer with and without prompt lookup, `chat_batch` at 1/8/32 rows.
  serving      `benchmarks/serve_load.py` against the 7B-shaped model: batched vs `--max-batch 1`.

Results go to `gpu_check.json` (`--out`); docs/gpu.md says how to run it, docs/benchmarks.md holds measured tables.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# H200 SXM dense bf16 tensor-core peak (NVIDIA's datasheet gives 1,979 TFLOPS with 2:4 sparsity, half that dense).
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12}
SECTION_SECONDS = {"gpu_tests": 60, "specialists": 90, "training": 150, "inference": 90, "serving": 120}
DRY_SECTION_SECONDS = {"gpu_tests": 60, "specialists": 40, "training": 40, "inference": 40, "serving": 60}
# What the sections import, with the wheel that brings each (benchmarks/gpu_wheels.sh downloads them all).
NEEDED = {
    "pydantic": "pydantic",
    "open_clip": "open_clip_torch",
    "pycocotools": "pycocotools",
    "fastapi": "fastapi",
    "uvicorn": "uvicorn",
    "geopilot.tools": "geopilot",
}
MIN_TRANSFORMERS = (5, 24)


@dataclass(frozen=True)
class Sizes:
    """Model and workload sizes of one run: the 7B shapes on CUDA, toy ones for --dry-run."""

    image_size: int
    patch_size: int
    vision_hidden: int
    vision_layers: int
    vision_heads: int
    text_hidden: int
    text_layers: int
    text_heads: int
    text_intermediate: int
    samples: int
    batch_size: int
    steps: int
    batch_rows: tuple[int, ...]
    serve_seconds: float


def sizes(dry_run: bool, layers: int) -> Sizes:
    if dry_run:
        return Sizes(32, 8, 32, 2, 2, 64, 2, 4, 128, 24, 4, 3, (1, 2), 3.0)
    from shapes import LLAVA_7B  # benchmarks/shapes.py

    m = LLAVA_7B
    return Sizes(
        m.image_size,
        m.patch_size,
        m.vision_hidden,
        m.vision_layers,
        m.vision_heads,
        m.text_hidden,
        layers,
        m.text_heads,
        m.text_intermediate,
        96,
        9,
        8,
        (1, 8, 32),
        45.0,
    )


def build_shaped_model(s: Sizes, dtype: str):
    """The LLaVA-1.5 architecture at sizes `s`, random weights, GeoPilot's tiny builder (a real 32k SentencePiece
    tokenizer when $GEOPILOT_TEST_SP_MODEL points at one, so the vocabulary is Vicuna's 32,064 rows)."""
    import os

    from geopilot.model import ModelConfig, TinyModelConfig, build_model

    tokenizer_dir = None
    if model_file := os.environ.get("GEOPILOT_TEST_SP_MODEL"):
        tokenizer_dir = tempfile.mkdtemp(prefix="gpu-check-tok-")
        os.symlink(model_file, Path(tokenizer_dir) / "tokenizer.model")
    tiny = TinyModelConfig(
        image_size=s.image_size,
        patch_size=s.patch_size,
        vision_hidden=s.vision_hidden,
        vision_layers=s.vision_layers,
        vision_heads=s.vision_heads,
        text_hidden=s.text_hidden,
        text_layers=s.text_layers,
        text_heads=s.text_heads,
        text_kv_heads=s.text_heads,
        text_intermediate=s.text_intermediate,
        max_position_embeddings=4096,
    )
    return build_model(ModelConfig(tiny=tiny, dtype=dtype, tokenizer_path=tokenizer_dir))


def missing_wheels() -> list[str]:
    """The packages this Python lacks for the check, by the wheel that brings each."""
    import importlib.util

    import transformers

    missing = [wheel for module, wheel in NEEDED.items() if importlib.util.find_spec(module) is None]
    if tuple(int(part) for part in transformers.__version__.split(".")[:2]) < MIN_TRANSFORMERS:
        missing.append(f"transformers>={'.'.join(map(str, MIN_TRANSFORMERS))} (found {transformers.__version__})")
    return missing


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def peak_flops() -> float | None:
    name = device_name()
    return next((flops for key, flops in PEAK_FLOPS.items() if key in name), None)


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


# -- section 1: the gpu-marked tests and the specialists -----------------------------------------------------------


def run_gpu_tests(args, s: Sizes) -> dict:
    command = [sys.executable, "-P", "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", str(ROOT / "tests")]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    summary = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode not in (0, 5):  # 5: nothing selected
        raise RuntimeError(f"pytest -m gpu failed: {summary}")
    return {"pytest_summary": summary, "returncode": done.returncode}


def run_specialists(args, s: Sizes) -> dict:
    from specialists_check import compare_backends  # benchmarks/specialists_check.py

    return compare_backends(full_size=not args.dry_run, device="cuda" if not args.dry_run else "cpu")


# -- section 2: training -----------------------------------------------------------------------------------------


def flops_per_token(config, trainable_vision: bool, seq_len: float) -> dict:
    """Model FLOPs per trained token (forward + backward, no recompute), from the architecture.

    Language model: 6 x (non-embedding + lm_head parameters) + attention scores 12 x layers x width x sequence.
    Vision tower and projector: forward only when frozen (2 x params per image token), 6 x when trained; their cost
    is per image, spread over the sequence's tokens."""
    text, vision = config.text_config, config.vision_config
    d, layers, inter, vocab = text.hidden_size, text.num_hidden_layers, text.intermediate_size, text.vocab_size
    lm_params = layers * (4 * d * d + 3 * d * inter) + d * vocab  # q,k,v,o + gate,up,down + lm_head
    lm = 6 * lm_params + 12 * layers * d * seq_len
    vd, vl, vi = vision.hidden_size, vision.num_hidden_layers, vision.intermediate_size
    patches = (vision.image_size // vision.patch_size) ** 2 + 1
    vision_forward = 2 * vl * (4 * vd * vd + 2 * vd * vi) * patches + 4 * vl * vd * patches * patches
    projector = 6 * (vd * d + d * d) * (patches - 1)
    vision_flops = (3 if trainable_vision else 1) * vision_forward + projector
    return {"language_model": lm, "vision_per_image": vision_flops}


def run_training(args, s: Sizes) -> dict:
    import torch
    from train_throughput import MODES  # benchmarks/train_throughput.py: the padded and the length-grouped orders

    from geopilot.data_gen.synthetic.samples import write_demo_dataset
    from geopilot.model import num_image_tokens
    from geopilot.training.batching import Collator, padding_stats
    from geopilot.training.config import DataConfig
    from geopilot.training.data import build_training_data

    device = "cuda" if not args.dry_run else "cpu"
    dtype = "bfloat16"
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        model, processor = build_shaped_model(s, dtype)
        path = write_demo_dataset(Path(tmp) / "data", optical=s.samples * 2 // 3, sar=s.samples // 3, seed=0)
        cfg = DataConfig(files=[str(path)], replay_alpha=1.0, max_length=4096)
        data = build_training_data(cfg, 2, processor.tokenizer, num_image_tokens(model.config), Path(tmp) / "cache")
        model.model.vision_tower.requires_grad_(False)  # stage 2 freezes the vision tower (configs/stage2.yaml)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.to(device).train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
        collate = Collator(processor)
        lengths = list(data.dataset["length"])
        for mode, order in MODES.items():
            batches = list(order(lengths, s.batch_size, 1, 0))[: s.steps + 1]
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            useful = processed = 0
            seconds = 0.0
            flops = 0.0
            for step, indices in enumerate(batches):
                batch = collate([data.dataset[i] for i in indices])
                batch.pop("sample_ids")
                batch = {k: v.to(device) for k, v in batch.items()}
                _sync()
                start = time.perf_counter()
                model(**batch).loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                _sync()
                if step == 0:  # the first step pays kernel selection and allocation
                    continue
                seconds += time.perf_counter() - start
                n_useful, n_all = padding_stats(batch)
                useful, processed = useful + n_useful, processed + n_all
                seq = batch["input_ids"].shape[1]
                per_token = flops_per_token(model.config, False, seq)
                flops += per_token["language_model"] * n_all + per_token["vision_per_image"] * len(indices)
            peak = peak_flops()
            results[mode] = {
                "steps": len(batches) - 1,
                "useful_tokens_per_s": useful / seconds,
                "processed_tokens_per_s": processed / seconds,
                "useful_fraction": useful / processed,
                "achieved_tflops": flops / seconds / 1e12,
                "mfu": None if peak is None else flops / seconds / peak,
                "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
            }
        params = sum(p.numel() for p in model.parameters())
    grouped, padded = results["geopilot_length_grouped"], results["llava_random_padded"]
    return {
        "decoder_layers": s.text_layers,
        "parameters_B": params / 1e9,
        "peak_flops_assumed": peak_flops(),
        "modes": results,
        "grouped_over_padded_useful_tokens": grouped["useful_tokens_per_s"] / padded["useful_tokens_per_s"],
        "mfu": grouped["mfu"],
    }


# -- section 3: inference ----------------------------------------------------------------------------------------


def run_inference(args, s: Sizes) -> dict:
    import numpy as np
    from chat_latency import (  # benchmarks/chat_latency.py: the same scripted turns and timers
        ANSWER,
        MAX_NEW_TOKENS,
        QUOTE,
        ScriptedKVSession,
        TimedDetector,
        answer_turn_seconds,
    )
    from PIL import Image

    from geopilot.agent import GeoPilot
    from geopilot.generation import GenerationOptions
    from geopilot.tool_protocol import ToolRegistry
    from geopilot.wire import assistant_json

    device = "cuda" if not args.dry_run else "cpu"
    model, processor = build_shaped_model(s, "bfloat16")
    model = model.to(device).eval()
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (512, 640, 3), dtype=np.uint8))
    answer_turn_seconds(model, processor, image, True, 8)  # warm-up
    first_reuse, tokens_reuse, _ = answer_turn_seconds(model, processor, image, True, 1)
    first_reprefill, tokens_reprefill, _ = answer_turn_seconds(model, processor, image, False, 1)
    quote_lookup, _, lookup = answer_turn_seconds(model, processor, image, True, MAX_NEW_TOKENS, QUOTE, 10)
    quote_reuse, _, _ = answer_turn_seconds(model, processor, image, True, MAX_NEW_TOKENS, QUOTE)
    ttft_ratio, prefill_ratio = first_reprefill / first_reuse, tokens_reprefill / tokens_reuse

    batches = {}
    answer = assistant_json(ANSWER)
    for rows in s.batch_rows:
        texts = [answer]

        def factory(prompts, pixels, options, texts=texts):
            return ScriptedKVSession(model, processor.tokenizer, prompts, pixels, options, list(texts))

        pilot = GeoPilot(model, processor, ToolRegistry([TimedDetector()]), session_factory=factory)
        requests = [{"image": image, "query": f"Describe scene {i}."} for i in range(rows)]
        latencies, tokens = [], 0
        for _ in range(3):
            _sync()
            start = time.perf_counter()
            results = pilot.chat_batch(requests, generation=GenerationOptions(prompt_lookup_tokens=0))
            _sync()
            latencies.append(time.perf_counter() - start)
            tokens = sum(r.tokens.generated for r in results)
        latencies.sort()
        batches[str(rows)] = {
            "tokens_per_s": tokens / statistics.median(latencies),
            "p50_s": statistics.median(latencies),
            "p95_s": latencies[min(len(latencies) - 1, math.ceil(0.95 * len(latencies)) - 1)],
        }
    return {
        "ttft_reuse_s": first_reuse,
        "ttft_reprefill_s": first_reprefill,
        "ttft_ratio": ttft_ratio,
        "prefill_token_ratio": prefill_ratio,
        "ttft_of_prefill_ratio": ttft_ratio / prefill_ratio,
        "quote_lookup_s": quote_lookup,
        "quote_reuse_s": quote_reuse,
        "lookup_ratio": quote_reuse / quote_lookup,
        "lookup": asdict(lookup) if lookup is not None else None,
        "chat_batch": batches,
    }


# -- section 4: serving ------------------------------------------------------------------------------------------


def run_serving(args, s: Sizes) -> dict:
    from geopilot.model import save_model

    device = "cuda" if not args.dry_run else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        model, processor = build_shaped_model(s, "bfloat16")
        out = save_model(model, processor, Path(tmp) / "llava-7b-shaped")
        del model
        command = [
            sys.executable,
            str(HERE / "serve_load.py"),
            "--model",
            str(out),
            "--device",
            device,
            "--dtype",
            "bfloat16",
            "--seconds",
            str(s.serve_seconds),
            "--rounds",
            "1",
            "--json",
        ]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"serve_load.py exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
        report, _ = json.JSONDecoder().raw_decode(done.stdout[done.stdout.index("{") :])  # a verdict line follows
    return {"serving_ratio": report["throughput_ratio"]["median"], "serve_load": report}


SECTIONS = {
    "gpu_tests": run_gpu_tests,
    "specialists": run_specialists,
    "training": run_training,
    "inference": run_inference,
    "serving": run_serving,
}


# -- driver ------------------------------------------------------------------------------------------------------


def run_section(name: str, args) -> dict:
    """Run one section in this process and return its record (called in the section's subprocess)."""
    started = time.perf_counter()
    try:
        figures = SECTIONS[name](args, sizes(args.dry_run, args.layers))
        status = "ok"
    except Exception as error:  # recorded; the driver goes on with the next section
        import torch

        status = "oom" if isinstance(error, torch.OutOfMemoryError) else "failed"
        figures = {"error": f"{type(error).__name__}: {error}".splitlines()[0], "traceback": traceback.format_exc()}
    return {"status": status, "seconds": time.perf_counter() - started, **figures}


def spawn(name: str, args, share: float) -> dict:
    """One section in a fresh subprocess, stopped after its time share."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        record_file = Path(handle.name)
    command = [sys.executable, __file__, "--section", name, "--record", str(record_file), "--layers", str(args.layers)]
    command += ["--dry-run"] if args.dry_run else []
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=share)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "seconds": share, "error": f"stopped after its {share:.0f} s share"}
    if done.returncode != 0 or not record_file.stat().st_size:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"status": "failed", "seconds": time.perf_counter() - started, "error": tail}
    record = json.loads(record_file.read_text())
    record_file.unlink()
    return record


def headline(records: dict) -> list[tuple[str, str, str]]:
    """(figure, value, target) rows of the one table."""

    def get(section, *keys):
        value = records.get(section, {})
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    def fmt(value, spec=".3f"):
        return "-" if value is None else format(value, spec)

    rows = [
        ("gpu tests", get("gpu_tests", "pytest_summary") or "-", ""),
        (
            f"training MFU ({get('training', 'decoder_layers')} layers)",
            fmt(get("training", "mfu"), ".1%"),
            ">= 40 %",
        ),
        ("training useful tok/s grouped / padded", fmt(get("training", "grouped_over_padded_useful_tokens")), ""),
        (
            "training peak memory GB (grouped)",
            fmt(get("training", "modes", "geopilot_length_grouped", "peak_memory_gb"), ".1f"),
            "",
        ),
        ("TTFT ratio re-prefill / KV reuse", fmt(get("inference", "ttft_ratio")), ""),
        ("  of the prefill-token ratio", fmt(get("inference", "ttft_of_prefill_ratio")), ">= 0.9"),
        ("lookup ratio (quoted boxes)", fmt(get("inference", "lookup_ratio")), ""),
    ]
    for batch, figures in (get("inference", "chat_batch") or {}).items():
        rows.append(
            (f"chat_batch {batch} rows tok/s (p50 s)", f"{figures['tokens_per_s']:.1f} ({figures['p50_s']:.2f})", "")
        )
    rows.append(("serving batched / max-batch 1", fmt(get("serving", "serving_ratio")), ">= 3x"))
    for backend, figures in (get("specialists", "backends") or {}).items():
        rows.append((f"{backend} {figures['precision']} vs fp32", figures["summary"], figures["tolerance"]))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="every section at toy sizes on CPU")
    parser.add_argument("--layers", type=int, default=8, help="decoder layers of the 7B-shaped model (>= 4)")
    parser.add_argument("--only", default=None, help="comma-separated sections (default: all)")
    parser.add_argument("--out", default="gpu_check.json")
    parser.add_argument("--section", default=None, help=argparse.SUPPRESS)  # internal: run one section here
    parser.add_argument("--record", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))  # the sibling benchmark modules
    if args.section:
        Path(args.record).write_text(json.dumps(run_section(args.section, args), default=str))
        return 0
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run with --dry-run for the toy CPU pass", file=sys.stderr)
        return 2
    if missing := missing_wheels():
        print(f"gpu_check: missing {', '.join(missing)}: see docs/gpu.md (benchmarks/gpu_wheels.sh)", file=sys.stderr)
        return 2
    if not args.dry_run and args.layers < 4:
        print("gpu_check: --layers must be at least 4", file=sys.stderr)
        return 2
    chosen = list(SECTIONS) if args.only is None else args.only.split(",")
    if unknown := [name for name in chosen if name not in SECTIONS]:
        print(f"gpu_check: unknown sections {unknown}; known: {list(SECTIONS)}", file=sys.stderr)
        return 2
    shares = DRY_SECTION_SECONDS if args.dry_run else SECTION_SECONDS
    started = time.perf_counter()
    records = {}
    for name in chosen:
        records[name] = spawn(name, args, shares[name])
        print(f"[{time.perf_counter() - started:6.1f} s] {name}: {records[name]['status']}", flush=True)
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "device": device_name(),
        "torch": torch.__version__,
        "dry_run": args.dry_run,
        "sections": records,
    }
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    print(f"\n{report['device']}, torch {report['torch']}, {report['date']}{' (dry run)' if args.dry_run else ''}")
    for figure, value, target in headline(records):
        print(f"{figure:44}{value:>24}  {target}")
    for name, record in records.items():
        if record["status"] != "ok":
            print(f"{name}: {record['status']}: {record.get('error', '')}")
    return 0 if all(r["status"] == "ok" for r in records.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
