"""The end of a run: a plain llava-hf model dir (weights, processor, chat template) + `geopilot_train.json`.

LoRA adapters are merged first (with `export.adapter`, the adapter alone is written before that to `export/adapter`:
peft's format, loadable with `PeftModel.from_pretrained(base, DIR)`, plus `projector.safetensors`, the trained
projector); under ZeRO-3 the partitioned weights are gathered for the save. The directory is
written aside and renamed, so a crash during export never leaves a half model where the next stage looks for one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from geopilot.training.stage_setup import EXPORT_INFO, refuse_non_finite


def git_revision(cwd: str | Path | None = None) -> str:
    """The checkout's commit (+ "-dirty" with local changes), or "unknown" outside git."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        revision = git("rev-parse", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    try:
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        dirty = False
    return revision + ("-dirty" if dirty else "")


def _is_zero3(accelerator) -> bool:
    plugin = accelerator.state.deepspeed_plugin
    return plugin is not None and plugin.zero_stage == 3


def _gathered(accelerator, model):
    """Under ZeRO-3 every process takes part in gathering the full weights; otherwise nothing to do."""
    if not _is_zero3(accelerator):
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)


ADAPTER_DIR = "adapter"
PROJECTOR_FILE = "projector.safetensors"


def save_adapter(peft_model, processor, out_dir: Path, info: dict) -> None:
    """peft's adapter files + the projector's trained weights + the processor + what the run was."""
    from safetensors.torch import save_file

    from geopilot.families import family_of_model

    prefix = family_of_model(peft_model).MODULES_TO_SAVE[0] + "."  # the projector: multi_modal_projector, merger
    peft_model.save_pretrained(out_dir, safe_serialization=True)
    # peft keeps the trained copy under `modules_to_save.default.` (beside `original_module.`); plain names are written
    projector = {
        name.split(prefix, 1)[1].replace("modules_to_save.default.", ""): param.detach().cpu().contiguous()
        for name, param in peft_model.named_parameters()
        if prefix in name and "original_module" not in name
    }
    save_file(projector, str(out_dir / PROJECTOR_FILE))
    processor.save_pretrained(out_dir)
    model_cfg = info["config"]["model"]
    base = model_cfg.get("llava_path") or model_cfg.get("path")
    (out_dir / EXPORT_INFO).write_text(json.dumps({**info, "adapter_base": base}, indent=1, default=str), "utf-8")


def export_model(accelerator, model, processor, out_dir: str | Path, info: dict, adapter: bool = False) -> Path | None:
    """Collective. Writes `out_dir` on the main process; returns it there (None elsewhere)."""
    from geopilot.model import save_model

    out_dir = Path(out_dir)
    unwrapped = accelerator.unwrap_model(model)
    result = None
    with _gathered(accelerator, unwrapped):
        refuse_non_finite(unwrapped, f"export to {out_dir}")  # every process holds the same (gathered) weights
        if accelerator.is_main_process:
            staging = out_dir.with_name(f".{out_dir.name}.export")
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            if adapter:  # before the merge, which folds the adapters away
                save_adapter(unwrapped, processor, staging / ADAPTER_DIR, info)
            if hasattr(unwrapped, "merge_and_unload"):  # peft: fold the adapters into the base weights
                unwrapped = unwrapped.merge_and_unload()
            if getattr(unwrapped, "is_loaded_in_4bit", False):  # QLoRA: the export is a plain full-precision model
                unwrapped.dequantize()
            if _is_zero3(accelerator) and getattr(unwrapped, "_weight_conversions", None) is not None:
                # from_pretrained under ZeRO-3 records key renamings that save_pretrained reverts twice
                # (seen: `language_model.model.model.embed_tokens`); drop them so transformers uses its
                # default mapping and the file has the same key names as a DDP or ZeRO-2 export.
                unwrapped._weight_conversions = None
            save_model(unwrapped, processor, staging / "model")
            for item in (staging / "model").iterdir():
                os.replace(item, staging / item.name)
            (staging / "model").rmdir()
            (staging / EXPORT_INFO).write_text(json.dumps(info, indent=1, default=str), encoding="utf-8")
            if out_dir.exists():
                shutil.rmtree(out_dir)
            os.replace(staging, out_dir)
            result = out_dir
    accelerator.wait_for_everyone()
    return result
