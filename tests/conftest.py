"""Shared fixtures: a tiny tokenizer and a tiny model directory, built once per session, in-process, no downloads."""

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
def tiny_tokenizer():
    from geopilot.tokenizer import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """`geopilot init-model --config configs/model/tiny.yaml --out DIR`, through the real CLI entry."""
    from pathlib import Path

    from geopilot.cli import main

    out = tmp_path_factory.mktemp("models") / "tiny"
    config = Path(__file__).resolve().parents[1] / "configs" / "model" / "tiny.yaml"
    assert main(["init-model", "--config", str(config), "--out", str(out)]) == 0
    return out
