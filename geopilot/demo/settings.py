"""What one `geopilot demo` run is: every setting that decides its result, and the folder it lives in.

Two presets: the default (the README's main job, ~10 min on 2 idle CPU cores) and `--quick` (the slow test suite),
each on one of two language-model bases (`base`): `scratch` (a tiny Llama trained from nothing on the demo's own BPE)
or `smollm2` (SmolLM2-135M-Instruct from the `demo` extra, fine-tuned; opt-in until it beats scratch).
`fingerprint()` hashes every setting; an out folder remembers the fingerprint it was started with, so a run with
other settings never mixes with it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field

from geopilot.config import StrictConfig
from geopilot.families.qwen2_5_vl import TinyQwenConfig
from geopilot.fileio import fingerprint
from geopilot.model import TinyModelConfig

BASES = ("scratch", "smollm2")  # the language model under the demo's LLaVA (docs/demo.md)
PHASES = ("data", "stage1", "stage2", "evaluate", "chain_eval", "chats", "examples", "report")
MAX_THREADS = 256  # torch threads; more is a typo (100000 threads exhausted the process)


def cpu_multiplies_bf16() -> bool:
    """Whether this CPU has bfloat16 matrix instructions (AVX512-BF16, AMX): with them bf16 autocast takes a SmolLM2
    step of 8 x 160 tokens from 9.4 to 6.0 s of one-thread CPU time; without them bf16 is emulated: float32 is kept."""
    import torch

    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def available_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class DemoSettings(StrictConfig):
    seed: int = 0
    base: Literal["scratch", "smollm2"] = "scratch"  # smollm2: the vision tower and projector of `model`, its LM
    optical: int = Field(default=80, ge=4, le=1000)  # synthetic optical scenes (geopilot synth --optical)
    sar: int = Field(default=60, ge=4, le=1000)  # synthetic SAR scenes
    samples_per_record: int = Field(default=6, ge=1, le=20)  # tool samples per (scene, ability): more query wordings
    chain_share: float = Field(default=0.1, ge=0.0, lt=1.0)  # two-step chain traces, a share of each stage's samples
    vocab_size: int = Field(default=1536, ge=300)  # the model's own BPE, trained on the generated traces
    model: TinyModelConfig = TinyModelConfig(
        image_size=32,
        patch_size=8,
        vision_hidden=48,
        vision_layers=2,
        vision_heads=2,
        text_hidden=128,
        text_layers=4,
        text_heads=4,
        text_kv_heads=4,
        text_intermediate=384,
        max_position_embeddings=512,
    )
    model_family: Literal["llava", "qwen2_5_vl"] = "llava"  # the base trained from scratch (docs/models.md)
    # model_family qwen2_5_vl: the tiny random Qwen2.5-VL (its own in-process BPE) and its image-token budget
    qwen_model: TinyQwenConfig = TinyQwenConfig(
        text_hidden=128, text_layers=4, text_intermediate=384, mrope_section=[4, 4, 8]
    )
    qwen_max_pixels: int = Field(default=28 * 28 * 16, ge=28 * 28)  # at most 16 image tokens, as the tiny LLaVA
    max_length: int = 512  # tokens per training sample (longer ones are skipped and counted by train.py)
    batch_size: int = Field(default=16, ge=1)
    stage1_epochs: int = Field(default=3, ge=1)  # 4 took 110 s more (docs/demo.md, default-4: the cost in OPA)
    stage1_lr: float = 3e-3  # 2e-3 left the model under-trained: OPA 0.68 vs 0.74 (docs/demo.md)
    stage2_epochs: int = Field(default=4, ge=1)
    stage2_lr: float = 1.5e-3
    # base smollm2: optimizer steps per stage (None: the epochs decide), LoRA rank (0: full fine-tuning)
    stage1_steps: int | None = Field(default=None, ge=1)
    stage2_steps: int | None = Field(default=None, ge=1)
    lora_rank: int = Field(default=0, ge=0)
    plans_only_share: float = Field(default=0.0, ge=0.0, le=1.0)  # train.py's data.plans_only_share
    mixed_precision: Literal["no", "bf16"] = "no"  # train.py's optim.mixed_precision (bf16: CPU autocast)
    alpha: float = Field(default=0.2, ge=0.0, le=1.0)  # stage-2 optical replay, the paper's value
    # held-out planning subset, exactly this many (stratified, one per category and difficulty at least: 27 groups;
    # 500 = all)
    eval_cases: int = Field(default=100, ge=27, le=500)
    # cases of the chain suite chains_v1 scored (stratified by chain kind; 124 = all, 4 kinds at least); half of them
    # keeps the default demo within 10 minutes
    chain_cases: int = Field(default=62, ge=4, le=124)
    max_new_tokens: int = Field(default=96, ge=16)  # per generated turn in the evaluation and the chats
    # cases per GeoPilot.chat_batch in the evaluate and chain_eval phases and the worked examples (1: one at a time)
    eval_batch_size: int = Field(default=1, ge=1)
    # torch threads: part of the result (same seed and threads, same numbers); both cores of a 2-core machine
    threads: int = Field(default_factory=lambda: min(2, available_cpus()), ge=1, le=MAX_THREADS)

    @classmethod
    def preset(
        cls, quick: bool, seed: int = 0, threads: int | None = None, model_family: str = "llava", base: str = "scratch"
    ) -> DemoSettings:
        chosen = {"model_family": model_family} | ({} if threads is None else {"threads": threads})
        if base == "smollm2":
            precision = {"mixed_precision": "bf16" if cpu_multiplies_bf16() else "no"}
            return cls(seed=seed, **chosen, **(SMOLLM2_QUICK if quick else SMOLLM2_DEFAULT), **precision)
        if not quick:
            return cls(seed=seed, **chosen)
        small = TinyModelConfig(vision_layers=1, max_position_embeddings=768)  # the test-sized model, 1 vision layer
        # a 600-token BPE splits a panoptic tool turn of 9 objects into ~560 tokens: room for them
        return cls(
            seed=seed,
            qwen_model=TinyQwenConfig(),
            optical=8,
            sar=8,
            samples_per_record=1,
            vocab_size=600,
            model=small,
            max_length=768,
            stage1_epochs=1,
            stage2_epochs=1,
            eval_cases=27,
            chain_cases=8,
            max_new_tokens=48,
            **chosen,
        )

    def preset_name(self) -> str:
        """ "default", "quick" or "custom": the preset these settings are, seed, threads, family and base aside."""
        for name, quick in (("default", False), ("quick", True)):
            if self == DemoSettings.preset(quick, self.seed, self.threads, self.model_family, self.base):
                return name
        return "custom"

    def fingerprint(self) -> str:
        return fingerprint(self.model_dump(mode="json"))

    def needed_bytes(self) -> int:
        """A generous upper bound of what the run writes (scenes in ten formats, traces, checkpoints, plots)."""
        return 50_000_000 + 1_500_000 * (self.optical + self.sar)


# SmolLM2-135M-Instruct under the demo's LLaVA: a step costs ~30x the scratch model's, so a stage is a number of
# steps (docs/demo.md, "SmolLM2": what each setting costs). The vision tower: 4 image tokens (32 px, 16 px patches).
_SMOLLM2_TOWER = TinyModelConfig(image_size=32, patch_size=16, vision_hidden=48, vision_layers=2, vision_heads=2)
SMOLLM2_DEFAULT = {
    "base": "smollm2",
    "model": _SMOLLM2_TOWER,
    "max_length": 640,  # SmolLM2's tokens: median 300 per whole sample, a few panoptic turns above 600
    "batch_size": 8,
    "stage1_steps": 50,  # 50 + 25 steps (e1, OPA 0.50) beat 120 + 40 (d2, 0.42) in 9 fewer minutes
    "stage1_lr": 2e-3,
    "stage2_steps": 25,
    "stage2_lr": 1e-3,
    "lora_rank": 16,
    "plans_only_share": 0.7,  # 136 tokens per sample instead of 300: twice the plans in the same time
    "eval_cases": 100,
    "chain_cases": 16,
    "max_new_tokens": 96,
    "eval_batch_size": 16,  # decoding is memory-bound: 16 rows cost ~4x less per case than one
}
SMOLLM2_QUICK = SMOLLM2_DEFAULT | {
    "optical": 8,
    "sar": 8,
    "samples_per_record": 1,
    "batch_size": 2,
    "stage1_steps": 2,
    "stage2_steps": 2,
    "eval_cases": 27,
    "chain_cases": 8,
    "max_new_tokens": 48,
}


class Layout:
    """Where everything lives under the out folder."""

    def __init__(self, out: str | Path):
        self.out = Path(out)
        self.settings = self.out / "demo.json"
        self.markers = self.out / "phases"
        self.data = self.out / "data"
        self.synth = self.data / "synth"
        self.traces = self.data / "traces"
        self.train_file = self.traces / "shard-00000.jsonl"
        self.tokenizer = self.data / "tokenizer"
        self.base = self.out / "base"  # base smollm2: the converted language model (safetensors + tokenizer)
        self.configs = self.out / "configs"
        self.stage1 = self.out / "stage1"
        self.stage2 = self.out / "stage2"
        self.model = self.out / "model"
        self.eval = self.out / "eval"
        self.chats = self.out / "chats"
        self.examples = self.out / "examples"  # the worked examples' drawn pictures
        self.plots = self.out / "plots"
        self.report = self.out / "report.md"
        self.metrics = self.out / "metrics.json"

    def marker(self, phase: str) -> Path:
        return self.markers / f"{phase}.done"
