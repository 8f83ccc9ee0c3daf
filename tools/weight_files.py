"""What each backend needs on disk, in one torch-free place: `geopilot tools list`, `geopilot weights check` and
loading all ask `required_files`, so "ready" means the files a load reads are there.

A backend's folder is `$GEOPILOT_WEIGHTS_DIR/<backend>/` unless the tools config gives `weights:` (a folder, or the
checkpoint file itself: then its folder holds the rest). Each need is one file, or one of a few names / a glob
("exactly one *.pth or *.safetensors"). `KNOWN_FILES` lists the published files with their SHA-256 where known
(docs/weights.md has the table with sources and licences). Every check names the file: a missing one names what
the folder holds instead (a renamed file shows up there), an empty or truncated one is refused from its own framing
(safetensors header, zip end record) before anything loads it, and a directory, FIFO or device where a file should
be, or a symlink that leaves the folder (to `/etc/passwd`, say), is reported as what it is, never as present.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path

from geopilot.fileio import file_kind

BERT_VOCAB = ("bert-base-uncased/vocab.txt", "bert-base-uncased/tokenizer.json")
LAE_DINO_CHECKPOINT = "lae_dino_swint_lae1m-28ca3a15.pth"
SEGEARTH_CLIP_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
REMOTESAM_CHECKPOINT = "checkpoint.pth"
SPA_GAN_CHECKPOINT = "gen_model_epoch_200.pth"  # upstream's file in pretrained_models/RICE1|RICE2/
BIT_CD_CHECKPOINT = "BIT_LEVIR/best_ckpt.pt"  # upstream's checkpoints/BIT_LEVIR/best_ckpt.pt (its README's download)
SAFETENSORS_MAX_HEADER = 100_000_000  # the format's own limit
HOLDS_SHOWN = 6  # names a "missing" message lists of what the folder holds instead


@dataclass(frozen=True)
class Need:
    """One file a backend reads: any of `names` (relative to its folder; `*` globs allowed), `exactly_one` match."""

    what: str
    names: tuple[str, ...]
    exactly_one: bool = False
    checkpoint: bool = False  # a `weights:` file stands for this need


# SHA-256 of published files, where known (a file not listed is checked for presence only)
KNOWN_FILES: dict[str, dict[str, str]] = {
    "spa_gan": {
        "RICE1/gen_model_epoch_200.pth": "1a9f87f50e4b439b64675d1612f06604a6bc61748f7d9fe6cf252ba371ec3f16",
        "RICE2/gen_model_epoch_200.pth": "9706b2e29b331366b1b9b83288ac3d8568bc58efebe1b8dee66a696b99531744",
    },
}


def required_files(backend: str, options) -> list[Need]:
    """The files `backend` configured with `options` (its typed options model) loads."""
    tokenizer = [] if _tokenizer_path(options) else [Need("BERT vocabulary", BERT_VOCAB)]
    if backend == "lae_dino":
        checkpoint = Need(f"checkpoint ({LAE_DINO_CHECKPOINT})", ("*.pth", "*.safetensors"), True, True)
        return [checkpoint, *tokenizer]
    if backend == "segearth_ov":
        return [Need("open_clip CLIP ViT-B/16 state dict", SEGEARTH_CLIP_FILES, checkpoint=True)]
    if backend == "denodet":
        return [Need("checkpoint (one .pth or .safetensors)", ("*.pth", "*.safetensors"), True, True)]
    if backend == "remotesam":
        return [Need(f"checkpoint ({REMOTESAM_CHECKPOINT})", (REMOTESAM_CHECKPOINT,), checkpoint=True), *tokenizer]
    if backend == "sam_road":
        from geopilot.tools.sam_road_graph import PRESETS  # torch-free

        name = PRESETS[options.preset].checkpoint
        return [Need(f"checkpoint ({name}, preset {options.preset})", (name,), checkpoint=True)]
    if backend == "spa_gan":
        name = f"{options.variant}/{SPA_GAN_CHECKPOINT}"
        return [Need(f"generator ({name})", (name,), checkpoint=True)]
    if backend == "bit_cd":
        return [Need(f"BIT LEVIR-CD checkpoint ({BIT_CD_CHECKPOINT})", (BIT_CD_CHECKPOINT,), checkpoint=True)]
    raise KeyError(f"no file list for backend {backend!r}")


def _tokenizer_path(options) -> str | None:
    """`tokenizer_path` of the options or of their `model` section (a typed model or a dict)."""
    for holder in (getattr(options, "model", None), options):
        value = holder.get("tokenizer_path") if isinstance(holder, dict) else getattr(holder, "tokenizer_path", None)
        if value:
            return value
    return None


@dataclass
class FileCheck:
    need: Need
    found: list[Path]
    problem: str | None  # None: satisfied

    def as_dict(self) -> dict:
        return {
            "what": self.need.what,
            "expected": list(self.need.names),
            "found": [str(p) for p in self.found],
            "status": "present" if self.problem is None else self.problem.split(":")[0],
            "problem": self.problem,
        }


def check_files(backend: str, options, folder: Path, given_file: Path | None = None, hashes: bool = False):
    """One FileCheck per need of `backend` in `folder` (`given_file`: the configured checkpoint file). With
    `hashes`, files listed in KNOWN_FILES are also compared with their published SHA-256."""
    checks = []
    for need in required_files(backend, options):
        given = need.checkpoint and given_file is not None
        if given:
            found = [given_file] if given_file.exists() else []
        else:
            found = sorted({p for name in need.names for p in folder.glob(name) if p.exists()})
        if not found:
            problem = f"missing: put {' or '.join(need.names)} in {folder} ({_holds(folder)})"
        elif need.exactly_one and len(found) > 1:
            problem = f"ambiguous: {len(found)} files match in {folder} ({', '.join(p.name for p in found)}); keep one"
        else:
            problem = (
                _entry_problem(found[0], None if given else folder)
                or _framing_problem(found[0])
                or (_hash_problem(backend, folder, found[0]) if hashes else None)
            )
        checks.append(FileCheck(need, found, problem))
    return checks


def _entry_problem(path: Path, folder: Path | None) -> str | None:
    """What keeps `path` from being read as a weights file: not a regular file (a directory, a FIFO, a device), or,
    when it was found in `folder`, a symlink that leads out of it. None when it is a file to read."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        return f"not a file: {path} is {file_kind(mode)}"
    target = path.resolve()
    if folder is not None and folder.resolve() not in target.parents:
        return f"outside: {path} links to {target}, outside {folder}; copy the file in or set `weights:` to it"
    return None


def _holds(folder: Path) -> str:
    """What the folder holds, for a "missing" message: a renamed or misplaced file is named there."""
    if folder.exists() and not folder.is_dir():
        return f"it is {file_kind(os.stat(folder).st_mode)}, not a folder"
    if not folder.is_dir():
        return "the folder does not exist"
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    if not files:
        return "the folder is empty"
    more = f", and {len(files) - HOLDS_SHOWN} more" if len(files) > HOLDS_SHOWN else ""
    return "it holds " + ", ".join(files[:HOLDS_SHOWN]) + more


def _framing_problem(path: Path) -> str | None:
    """An empty or cut-short checkpoint, told from its own framing without loading it: a safetensors file shorter
    than its header says, a zip checkpoint (torch.save's format: .pth, .ckpt, .bin) without its end record. A legacy
    pickle has no framing: only its hash (KNOWN_FILES) or the strict load tells."""
    size = path.stat().st_size
    if size == 0:
        return f"empty: {path} is 0 bytes"
    with path.open("rb") as handle:
        head = handle.read(8)
        if path.suffix == ".safetensors":
            length = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 0 < length <= SAFETENSORS_MAX_HEADER:
                return f"not a safetensors file: {path} has no valid header length"
            if 8 + length > size:
                return f"truncated: {path} is {size:,} bytes, shorter than its own header"
            try:
                header = json.loads(handle.read(length))
            except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: a header nested 100k deep
                header = None
            if not isinstance(header, dict):
                return f"not a safetensors file: {path} has no readable header"
            offsets = [v.get("data_offsets") for v in header.values() if isinstance(v, dict) and "data_offsets" in v]
            ends = [o[1] for o in offsets if isinstance(o, list) and len(o) == 2 and isinstance(o[1], int)]
            if len(ends) != len(offsets):
                return f"not a safetensors file: {path} has a header whose data_offsets are not [start, end]"
            expected = 8 + length + max(ends, default=0)
            if size < expected:
                return f"truncated: {path} is {size:,} bytes, its header says {expected:,}"
        elif head[:4] == b"PK\x03\x04" and not zipfile.is_zipfile(path):
            return f"truncated: {path} is a zip checkpoint ({size:,} bytes) without its end record"
    return None


def _hash_problem(backend: str, folder: Path, path: Path) -> str | None:
    try:
        relative = str(path.relative_to(folder))
    except ValueError:
        relative = path.name
    expected = KNOWN_FILES.get(backend, {}).get(relative)
    if expected is None:
        return None
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        return f"wrong hash: {path} has sha256 {digest.hexdigest()[:16]}..., the published file {expected[:16]}..."
    return None
