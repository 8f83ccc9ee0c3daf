"""Serving fixtures: the tiny model and a scripted pilot (tests/serving/helpers.py has the pieces)."""

from __future__ import annotations

import pytest

from geopilot.tool_protocol import ToolRegistry
from serving.helpers import Detector, HangingTool, ScriptSession, SlowTool


@pytest.fixture(scope="session")
def tiny():
    from geopilot.model import ModelConfig, build_model

    model, processor = build_model(ModelConfig())
    return model.eval(), processor


@pytest.fixture
def scripted_pilot(tiny):
    """make(delay_s=0.0, tool_timeout_s=5) -> a GeoPilot whose turns follow ScriptSession."""
    from geopilot.agent import GeoPilot

    def make(delay_s: float = 0.0, tool_timeout_s: float = 5.0):
        registry = ToolRegistry([Detector(), HangingTool(), SlowTool()], timeout_s=tool_timeout_s)
        factory = lambda prompts, pixels, options: ScriptSession(tiny[1].tokenizer, prompts, delay_s)  # noqa: E731
        return GeoPilot(tiny[0], tiny[1], registry, session_factory=factory, tool_timeout_s=tool_timeout_s)

    return make
