"""Serving fixtures: servers around a scripted pilot on the session's tiny model (helpers/scripted.py, helpers/serving.py
have the pieces)."""

from __future__ import annotations

import pytest
from helpers.scripted import Detector, HangingTool, KeywordSession, SlowTool
from helpers.serving import KEY, MODEL, serving

from geopilot.tool_protocol import ToolRegistry


@pytest.fixture
def scripted_pilot(tiny):
    """make(delay_s=0.0, tool_timeout_s=5) -> a GeoPilot whose turns follow KeywordSession."""
    from geopilot.agent import GeoPilot

    def make(delay_s: float = 0.0, tool_timeout_s: float = 5.0):
        registry = ToolRegistry([Detector(boxes=2), HangingTool(), SlowTool(0.6)], timeout_s=tool_timeout_s)
        factory = lambda prompts, pixels, options, **images: KeywordSession(tiny[1].tokenizer, prompts, delay_s)  # noqa: E731
        return GeoPilot(tiny[0], tiny[1], registry, session_factory=factory, tool_timeout_s=tool_timeout_s)

    return make


@pytest.fixture
def server(scripted_pilot):
    """make(delay_s=0.0, tool_timeout_s=5.0, api_key=KEY, **config) -> (base URL, app) of a server around a scripted
    pilot (closed at the end of the test)."""
    from geopilot.serving.api import create_app
    from geopilot.serving.config import ServeConfig

    stack = []

    def make(delay_s: float = 0.0, tool_timeout_s: float = 5.0, api_key: str | None = KEY, **config):
        pilot = scripted_pilot(delay_s, tool_timeout_s)
        settings = ServeConfig(model_name=MODEL, api_key=api_key, tool_timeout_s=tool_timeout_s, **config)
        app = create_app(pilot, settings)
        context = serving(app)
        url = context.__enter__()
        stack.append(context)
        return url, app

    yield make
    for context in stack:
        context.__exit__(None, None, None)


@pytest.fixture
def recording(tiny):
    """make(**config) -> (OpenAI client, seen): a server around a scripted pilot (the Detector as its one tool);
    `seen` gets (prompt ids, GenerationOptions) of every request it renders."""
    from openai import OpenAI

    from geopilot.agent import GeoPilot
    from geopilot.serving.api import create_app
    from geopilot.serving.config import ServeConfig

    stack, seen = [], []

    def factory(batch, pixels, options):
        seen.extend((prompt, options) for prompt in batch)
        return KeywordSession(tiny[1].tokenizer, batch, 0.0)

    def make(**config):
        pilot = GeoPilot(tiny[0], tiny[1], ToolRegistry([Detector(boxes=2)]), session_factory=factory)
        context = serving(create_app(pilot, ServeConfig(model_name=MODEL, api_key=KEY, **config)))
        url = context.__enter__()
        stack.append(context)
        return OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0), seen

    yield make
    for context in stack:
        context.__exit__(None, None, None)
