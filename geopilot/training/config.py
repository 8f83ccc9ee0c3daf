"""The training config: one typed tree that `train.py --config <yaml> [key=value ...]` loads (docs/design.md §6).

Defaults are the paper's recipe (AdamW, lr 2e-5, cosine with 3% warmup, global batch 144, 2 epochs, full
fine-tuning with the vision tower frozen, optical replay alpha = 0.2). Every section is a `StrictConfig`, so a
misspelt key fails with its dotted path before anything is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from geopilot.argtypes import output_folder_problem
from geopilot.config import StrictConfig, load_config
from geopilot.errors import ConfigError
from geopilot.model import ModelConfig


class DataConfig(StrictConfig):
    files: list[str] = Field(min_length=1)  # JSONL sample files; each sample's `modality` decides its stage
    replay_alpha: float = Field(default=0.2, ge=0.0, le=1.0)  # stage 2: optical replay = round(alpha * |optical|)
    mixture_seed: int = 0  # which optical samples are replayed in stage 2
    max_length: int = Field(default=2048, ge=8)  # longer samples are skipped and counted, never cut
    # this share of the tool-calling samples (chosen by id) ends at their last think turn: the plan is what needs
    # the samples, and the tool output + answer are half of a sample's tokens (docs/demo.md, SmolLM2)
    plans_only_share: float = Field(default=0.0, ge=0.0, le=1.0)
    on_bad_line: Literal["raise", "skip"] = "skip"  # a JSONL line that fails validation
    check_images: bool = True  # decode every image once before training; unreadable ones are counted skips
    max_pixels: int = 100_000_000
    max_skip_fraction: float = Field(default=0.05, ge=0.0, le=1.0)  # more skips than this is an error
    cache_dir: str | None = None  # tokenisation cache (datasets); default: <output_dir>/../.cache/tokenised
    group_by_length: bool = True
    megabatch_batches: int = Field(default=32, ge=1)  # length grouping sorts within this many batches
    num_workers: int = Field(default=0, ge=0)
    image_cache: int = Field(default=0, ge=0)  # processed images kept per data process (traces reuse scenes)
    eval_files: list[str] = []  # held-out sample JSONL, rendered and cached like `files`; validated every eval step


class OptimConfig(StrictConfig):
    epochs: int = Field(default=2, ge=1)
    max_steps: int | None = Field(default=None, ge=1)  # caps the optimizer steps (smoke runs, tests)
    global_batch_size: int = Field(default=144, ge=1)  # = per_device_batch_size x grad-accum x world size
    per_device_batch_size: int = Field(default=9, ge=1)
    lr: float = Field(default=2e-5, gt=0.0, le=1.0)  # over 1 is a typo, not a setting (1e30 trained to NaN)
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0)
    betas: tuple[Annotated[float, Field(ge=0.0, lt=1.0)], Annotated[float, Field(ge=0.0, lt=1.0)]] = (0.9, 0.999)
    eps: float = Field(default=1e-8, gt=0.0, le=1.0)
    warmup_ratio: float = Field(default=0.03, ge=0.0, lt=1.0)
    scheduler: Literal["cosine", "linear", "constant"] = "cosine"
    max_grad_norm: float = Field(default=1.0, ge=0.0)  # 0 turns clipping off
    gradient_checkpointing: bool = False
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    seed: int = 42


class FreezeConfig(StrictConfig):
    """Which components do not train. LLaVA-1.5 fine-tuning freezes only the vision tower."""

    vision_tower: bool = True
    projector: bool = False
    language_model: bool = False  # the decoder, its embeddings and lm_head


class LoraSettings(StrictConfig):
    """LoRA through peft on the language model only (regex: CLIP has q/k/v_proj too); merged at export."""

    enabled: bool = False
    r: int = Field(default=128, ge=1)
    alpha: int = Field(default=256, ge=1)
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0)
    target_modules: str = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
    modules_to_save: list[str] | None = None  # None: the model family's projector (multi_modal_projector, merger)
    qlora: bool = False  # the frozen base in 4 bits (bitsandbytes NF4); CUDA only


class EvalConfig(StrictConfig):
    """Validation during training: loss on data.eval_files, and planning scores on a case subset."""

    every_steps: int = Field(default=200, ge=1)  # also at the last step
    batch_size: int = Field(default=8, ge=1)  # held-out samples per process per forward
    planning_cases: str | None = None  # a planning case file (JSONL, `geopilot eval planning --cases`)
    planning_max_cases: int | None = Field(default=None, ge=1)  # the first N cases of the file (None: all)
    planning_seeds: list[int] = Field(default=[42], min_length=1)
    planning_max_new_tokens: int = Field(default=512, ge=1)


class EngineConfig(StrictConfig):
    deepspeed: str | None = None  # a DeepSpeed JSON (configs/deepspeed/*.json); None = DDP through accelerate
    backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto: nccl with CUDA, gloo on CPU

    @field_validator("deepspeed")
    @classmethod
    def _no_optimizer_or_scheduler(cls, path: str | None) -> str | None:
        """A JSON with an optimizer/scheduler section is refused when the config loads (a missing file is reported
        when training starts, as before, since the path is relative to where train.py runs)."""
        if path and Path(path).is_file():
            from geopilot.training.deepspeed_config import read_deepspeed_json

            try:
                read_deepspeed_json(path)
            except ConfigError as err:
                raise ValueError(str(err)) from None
        return path


class CheckpointConfig(StrictConfig):
    save_steps: int = Field(default=500, ge=1)
    keep_last: int = Field(default=2, ge=1)
    resume: bool = True  # re-running the same command continues from the latest complete checkpoint
    keep_best: Literal["val_loss", "OPA"] | None = None  # also keep the best evaluated step's checkpoint


class WandbConfig(StrictConfig):
    project: str = Field(min_length=1)
    run_name: str | None = None  # default: the output folder's name
    mode: Literal["online", "offline"] = "offline"  # online without network or API key falls back to offline


class LoggingConfig(StrictConfig):
    logging_steps: int = Field(default=10, ge=1)
    tensorboard: bool = True
    wandb: WandbConfig | None = None  # Weights & Biases (the wandb package); metrics.jsonl is always written
    peak_tflops: float | None = Field(default=None, gt=0)  # per device, for the MFU estimate (default: known GPUs)
    progress_bar: bool = True
    log_sample_ids: bool = True  # logs/samples.rank<r>.jsonl: which samples each step trained on


class ExportConfig(StrictConfig):
    adapter: bool = False  # a LoRA run also writes export/adapter: peft's format + the trained projector


class TrainConfig(StrictConfig):
    RENAMED = {"data.alpha": "data.replay_alpha"}  # `data.alpha` read beside `lora.alpha` as if one meaning
    stage: Literal[1, 2]
    output_dir: str
    model: ModelConfig = ModelConfig()
    data: DataConfig
    optim: OptimConfig = OptimConfig()
    freeze: FreezeConfig = FreezeConfig()
    lora: LoraSettings = LoraSettings()
    engine: EngineConfig = EngineConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    logging: LoggingConfig = LoggingConfig()
    eval: EvalConfig = EvalConfig()
    export: ExportConfig = ExportConfig()

    @field_validator("output_dir")
    @classmethod
    def _a_folder_to_write(cls, path: str) -> str:
        problem = output_folder_problem(path)
        if problem:
            raise ValueError(problem)
        return path

    @model_validator(mode="after")
    def _stage_two_starts_from_a_model(self) -> TrainConfig:
        if self.stage == 2 and self.model.init not in ("llava_hf", "pretrained"):
            raise ValueError(
                "stage 2 continues from the stage-1 export: set model.init=llava_hf and model.llava_path "
                "(family qwen2_5_vl: model.init=pretrained and model.path)"
            )
        if self.optim.global_batch_size % self.optim.per_device_batch_size:
            raise ValueError(
                f"optim.global_batch_size {self.optim.global_batch_size} is not a multiple of "
                f"optim.per_device_batch_size {self.optim.per_device_batch_size}"
            )
        if self.checkpoint.keep_best == "val_loss" and not self.data.eval_files:
            raise ValueError("checkpoint.keep_best=val_loss needs held-out data: set data.eval_files")
        if self.checkpoint.keep_best == "OPA" and not self.eval.planning_cases:
            raise ValueError("checkpoint.keep_best=OPA needs planning cases: set eval.planning_cases")
        if self.export.adapter and not self.lora.enabled:
            raise ValueError("export.adapter writes a LoRA adapter: set lora.enabled=true (or export.adapter=false)")
        if self.lora.qlora and not self.lora.enabled:
            raise ValueError("lora.qlora trains LoRA adapters over a 4-bit base: set lora.enabled=true")
        return self

    @property
    def cache_dir(self) -> Path:
        if self.data.cache_dir:
            return Path(self.data.cache_dir)
        return Path(self.output_dir).resolve().parent / ".cache" / "tokenised"


# Settings that do not change what a run computes: where it writes, how often it logs, evaluates or checkpoints,
# what it exports beside the model, caches, workers.
RESULT_NEUTRAL = (
    "output_dir",
    "checkpoint.",
    "logging.",
    "eval.",
    "export.",
    "data.eval_files",
    "data.cache_dir",
    "data.num_workers",
    "data.image_cache",
    "optim.gradient_checkpointing",
    "engine.backend",
)


def current_settings(recorded: dict[str, object]) -> dict[str, object]:
    """A run folder's recorded identity under today's setting names, so a run of the last release resumes."""
    return {TrainConfig.RENAMED.get(key, key): value for key, value in recorded.items()}


def result_settings(cfg: TrainConfig) -> dict[str, object]:
    """Every setting that changes the trained weights, flattened to dotted keys: a run's identity on resume."""
    flat: dict[str, object] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}{key}.", item)
        else:
            flat[prefix[:-1]] = value

    walk("", cfg.model_dump(mode="json"))
    return {k: v for k, v in flat.items() if not any(k == n or k.startswith(n) for n in RESULT_NEUTRAL)}


def load_train_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    return load_config(TrainConfig, path, overrides)
