"""Shared fixtures: the one tiny random model of the session (built once through `geopilot init-model`, so its BPE
is trained once), loaded in-process as `tiny` and its tokenizer as `tiny_tokenizer`, and the tiny random Qwen2.5-VL
saved once (`qwen_dir`); no downloads."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """`geopilot init-model --config configs/model/tiny.yaml --out DIR`, through the real CLI entry."""
    from pathlib import Path

    from geopilot.cli import main

    out = tmp_path_factory.mktemp("models") / "tiny"
    config = Path(__file__).resolve().parents[1] / "configs" / "model" / "tiny.yaml"
    assert main(["init-model", "--config", str(config), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="session")
def qwen_dir(tmp_path_factory):
    """The tiny random Qwen2.5-VL (`model.family: qwen2_5_vl`, `init: tiny`), saved as transformers writes it."""
    from geopilot.model import ModelConfig, build_model, save_model

    model, processor = build_model(ModelConfig(family="qwen2_5_vl", init="tiny"))
    return save_model(model, processor, tmp_path_factory.mktemp("models") / "tiny_qwen")


@pytest.fixture(scope="session")
def tiny(tiny_model_dir):
    """(model in eval mode, processor) of the tiny model: every test folder's, never rebuilt."""
    from geopilot.model import load_model

    return load_model(tiny_model_dir)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny):
    """The tiny model's byte-fallback BPE (`geopilot.tokenizer.tiny_tokenizer()`, trained by init-model)."""
    return tiny[1].tokenizer
