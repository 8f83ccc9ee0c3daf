"""Core fixtures: a registry of the small real tools and a pilot on the session's tiny model driven by scripted
sessions (helpers/scripted.py); and the real 32k SentencePiece model (Mistral-7B's, the Llama layout; .ci/run extracts it from a PyPI wheel) for the render and
chat-template tests that must agree with a real tokenizer, skipped when GEOPILOT_TEST_SP_MODEL is unset."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from helpers.scripted import BrokenTool, Detector, RoadExtractor, SarDetector, Scripts, SlowTool

from geopilot.tool_protocol import ToolRegistry


@pytest.fixture
def registry():
    return ToolRegistry([Detector(), RoadExtractor(), SarDetector(), SlowTool(), BrokenTool()], timeout_s=10)


@pytest.fixture
def image():
    return np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8)


@pytest.fixture(scope="session")
def qwen(qwen_dir):
    """(model, processor) of the tiny Qwen2.5-VL, reloaded through `load_model`."""
    from geopilot.model import load_model

    return load_model(qwen_dir)


@pytest.fixture
def make_pilot(tiny, registry):
    """make_pilot(*scripts, **kwargs) -> (GeoPilot driven by the scripts, the Scripts factory)."""
    from geopilot.agent import GeoPilot

    def make(*scripts: list[str], **kwargs):
        factory = Scripts(tiny[1].tokenizer, *scripts)
        return GeoPilot(tiny[0], tiny[1], kwargs.pop("tools", registry), session_factory=factory, **kwargs), factory

    return make


# -- the real SentencePiece model --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def sp_dir(tmp_path_factory):
    model_file = os.environ.get("GEOPILOT_TEST_SP_MODEL", "")
    if not os.path.isfile(model_file):
        pytest.skip("set GEOPILOT_TEST_SP_MODEL to a SentencePiece tokenizer.model (.ci/run does)")
    folder = tmp_path_factory.mktemp("sp")
    shutil.copy(model_file, folder / "tokenizer.model")
    return folder


@pytest.fixture(scope="session")
def sp_tokenizer(sp_dir):
    from geopilot.tokenizer import load_tokenizer

    return load_tokenizer(sp_dir)
