"""One metrics path through accelerate's trackers: `metrics.jsonl` in the run folder (always), TensorBoard, W&B.

Every step that logs anything calls `accelerator.log(row, step)` once; the JSONL tracker appends that row. On resume
the rows past the checkpoint are dropped first, so the file has one row per logged step with no gap or duplicate
across a kill. W&B `mode: online` without network or API key falls back to offline with one line, never a crash.
What each logged key means: docs/training.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import time
from collections import defaultdict
from pathlib import Path
from urllib.parse import urlparse

from accelerate.tracking import GeneralTracker

from geopilot.errors import ConfigError
from geopilot.training.config import TrainConfig

log = logging.getLogger("geopilot.train")
METRICS_FILE = "metrics.jsonl"
WANDB_HOST = "https://api.wandb.ai"
# dense bf16 peak per device, TFLOP/s (vendor datasheets), for the MFU estimate when logging.peak_tflops is unset
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0, "L4": 121.0, "V100": 125.0}


class JsonlTracker(GeneralTracker):
    """accelerate tracker writing `{"step": s, **values}` lines; `keep_up_to(step)` drops rows of steps past it."""

    name = "jsonl"
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, path: str | Path):
        super().__init__()
        self.path = Path(path)

    @property
    def tracker(self):
        return self.path

    def keep_up_to(self, step: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if self.path.is_file() and step > 0:
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # a line cut off by a kill
                    continue
                if row.get("step", step + 1) <= step:
                    kept.append(line)
        self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

    def store_init_configuration(self, values: dict) -> None:
        pass

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"step": step, **values}, allow_nan=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / METRICS_FILE
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.is_file() else []


# ---- W&B ----------------------------------------------------------------------------------------------------------


def _wandb_reachable(timeout_s: float = 3.0) -> str | None:
    """None when an online W&B run can start here, else why not (no API key, host unreachable)."""
    base = os.environ.get("WANDB_BASE_URL", WANDB_HOST)
    host = urlparse(base).hostname or "api.wandb.ai"
    if not os.environ.get("WANDB_API_KEY") and not _netrc_has(host):
        return "no W&B API key (WANDB_API_KEY or `wandb login`)"
    try:
        with socket.create_connection((host, urlparse(base).port or 443), timeout=timeout_s):
            return None
    except OSError as err:
        return f"{host} is unreachable ({type(err).__name__})"


def _netrc_has(host: str) -> bool:
    import netrc

    try:
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_init_kwargs(cfg: TrainConfig) -> dict:
    """wandb.init arguments: the run's folder under output_dir/wandb, a stable id (a resume continues the run)."""
    settings = cfg.logging.wandb
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise ConfigError("logging.wandb needs the wandb package: pip install wandb (or drop logging.wandb)") from None
    mode = settings.mode
    if mode == "online" and (why := _wandb_reachable()):
        log.warning("logging.wandb.mode=online: %s; logging offline instead (wandb sync later)", why)
        mode = "offline"
    out = Path(cfg.output_dir).resolve()
    (out / "wandb").mkdir(parents=True, exist_ok=True)
    return {
        "name": settings.run_name or out.name,
        "id": hashlib.sha256(str(out).encode()).hexdigest()[:16],
        "resume": "allow",
        "mode": mode,
        "dir": str(out),
    }


def tracker_kinds(cfg: TrainConfig) -> list:
    """`log_with` for the Accelerator: the JSONL tracker first, then TensorBoard and W&B as configured."""
    kinds: list = [JsonlTracker(Path(cfg.output_dir) / METRICS_FILE)]
    if cfg.logging.tensorboard:
        kinds.append("tensorboard")
    if cfg.logging.wandb is not None:
        kinds.append("wandb")
    return kinds


def start_trackers(accelerator, cfg: TrainConfig, resume_step: int, config: dict) -> None:
    """Main process: drop metrics rows past the resumed step, then start every tracker."""
    if not accelerator.is_main_process:
        return
    for tracker in accelerator.log_with:
        if isinstance(tracker, JsonlTracker):
            tracker.keep_up_to(resume_step)
    init_kwargs = {"wandb": wandb_init_kwargs(cfg)} if cfg.logging.wandb is not None else {}
    project = cfg.logging.wandb.project if cfg.logging.wandb is not None else f"stage{cfg.stage}"
    try:
        accelerator.init_trackers(project, config=config, init_kwargs=init_kwargs)
    except Exception as err:  # noqa: BLE001 - wandb's network errors have many types; offline needs none of them
        if not init_kwargs or init_kwargs["wandb"]["mode"] == "offline":
            raise
        log.warning("W&B online start failed (%s); logging offline instead", str(err).splitlines()[0][:200])
        init_kwargs["wandb"]["mode"] = "offline"
        accelerator.trackers = []
        accelerator.init_trackers(project, config=config, init_kwargs=init_kwargs)


def flat_config(cfg: TrainConfig) -> dict:
    """The config as scalar hyperparameters (TensorBoard's hparams and W&B's config take only scalars)."""
    flat: dict = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}{key}.", item)
        else:
            flat[prefix[:-1]] = value if isinstance(value, (int, float, str, bool)) else json.dumps(value)

    walk("", cfg.model_dump(mode="json"))
    return flat


# ---- throughput, time split, per-source loss ----------------------------------------------------------------------


def flops_per_token(model) -> float:
    """Training FLOPs per token, the 6N estimate over the language model's non-embedding parameters."""
    total = 0
    for name, param in model.named_parameters():
        if "language_model" in name and "embed_tokens" not in name:
            total += getattr(param, "ds_numel", param.numel())  # ZeRO-3 keeps only a shard locally
    return 6.0 * total


def peak_flops(cfg: TrainConfig) -> float | None:
    import torch

    if cfg.logging.peak_tflops:
        return cfg.logging.peak_tflops * 1e12
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        for key, tflops in PEAK_TFLOPS.items():
            if key in name:
                return tflops * 1e12
    return None


class StepMeter:
    """What one process saw since the last logging step: token and sample counts, time split, loss per source."""

    def __init__(self, on_cuda: bool):
        self.on_cuda = on_cuda
        self.reset()

    def reset(self) -> None:
        self.tokens = self.padded = self.samples = self.steps = 0
        self.time = {"data": 0.0, "forward_backward": 0.0, "optimizer": 0.0}
        self.source_loss: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        self.started = time.perf_counter()
        self._mark = self.started

    def lap(self, part: str) -> None:
        """Time since the previous lap goes to `part` (on CUDA after the queued kernels finish)."""
        if self.on_cuda:
            import torch

            torch.cuda.synchronize()
        now = time.perf_counter()
        self.time[part] += now - self._mark
        self._mark = now

    def pause(self, seconds: float) -> None:
        """Leave `seconds` (an evaluation, a checkpoint) out of the window's time."""
        self.started += seconds
        self._mark += seconds

    def add_batch(self, batch: dict, sample_sources: list[str], per_sample: tuple[list[float], list[float]]) -> None:
        self.tokens += int(batch["attention_mask"].sum())
        self.padded += int(batch["attention_mask"].numel())
        self.samples += len(sample_sources)
        for source, loss_sum, count in zip(sample_sources, *per_sample, strict=True):
            self.source_loss[source][0] += loss_sum
            self.source_loss[source][1] += count

    def state(self) -> dict:
        return {
            "tokens": self.tokens,
            "padded": self.padded,
            "samples": self.samples,
            "time": dict(self.time),
            "source_loss": {k: list(v) for k, v in self.source_loss.items()},
        }


def combine(states: list[dict], steps: int, seconds: float, flops_token: float, peak: float | None, world: int):
    """The logged performance keys from every process's StepMeter.state() over `steps` optimizer steps."""
    tokens = sum(s["tokens"] for s in states)
    padded = sum(s["padded"] for s in states)
    samples = sum(s["samples"] for s in states)
    out = {
        "perf/tokens_per_s": tokens / seconds,
        "perf/samples_per_s": samples / seconds,
        "perf/useful_token_fraction": tokens / max(1, padded),
        "perf/tflops_per_device": padded * flops_token / seconds / world / 1e12,  # padding is computed too
    }
    if peak:
        out["perf/mfu"] = padded * flops_token / seconds / world / peak
    for part in ("data", "forward_backward", "optimizer"):  # seconds per optimizer step, mean over processes
        out[f"time/{part}_s"] = sum(s["time"][part] for s in states) / len(states) / steps
    sources: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for state in states:
        for source, (loss_sum, count) in state["source_loss"].items():
            sources[source][0] += loss_sum
            sources[source][1] += count
    for source, (loss_sum, count) in sorted(sources.items()):
        out[f"train/loss/source/{source or 'unknown'}"] = loss_sum / count if count else float("nan")
    return out


def gpu_memory() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {}
    return {
        "perf/gpu_mem_allocated_gb": torch.cuda.max_memory_allocated() / 2**30,
        "perf/gpu_mem_reserved_gb": torch.cuda.max_memory_reserved() / 2**30,
    }
