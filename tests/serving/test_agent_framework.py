"""An agent framework drives GeoPilot (issue 25 item 4): the `openai` SDK, as the OpenAI Agents SDK or LangGraph
use it, sends the ten task-level tools (`geopilot tools list --json` as OpenAI function tools), gets the plan as
`tool_calls`, runs each call through `geopilot mcp` over stdio with the official MCP client on the same image,
sends the results back as `role: "tool"` messages and gets the answer; streaming and not, with each tool_choice.

1. Against `geopilot serve --model DIR` (a subprocess) on the tiny random model: the plan grammar keeps its think
   turn a valid plan under every tool_choice. Only SpA-GAN's weights are in the shared folder, so `remove_clouds`
   (the named choice) really runs and its restored image is upstream's; the other tools' calls come back from
   MCP as errors, which the agent returns as their results, as frameworks do.
2. Against `geopilot serve --engine-url URL` (`GeoPilot.from_endpoint`) whose engine is a loopback server that
   renders the export's chat template (tests/helpers/chat_engine.py). There is no grammar over HTTP, so the
   engine's turns are forced (a remove_clouds plan, then an answer); what is checked is that the client's
   results reach the engine as exactly the tool turn THE formatter writes.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import anyio
import httpx
import numpy as np
import pytest
from helpers.chat_engine import engine_app
from helpers.serving import KEY, serving, stop_process
from helpers.weights import FIXTURES, REPO, spa_gan_checkpoint, weights_candidate
from openai import OpenAI
from PIL import Image

from geopilot.sample import Action, AssistantMessage
from geopilot.tool_output import ToolOutput
from geopilot.wire import assistant_json

pytestmark = pytest.mark.slow

CHOICES = ["none", "auto", "required", {"type": "function", "function": {"name": "remove_clouds"}}]
QUESTION = "Remove the clouds from this scene."
MAX_ROUNDS = 2  # tool rounds an agent allows before it asks for the answer (tool_choice "none")
MAX_NEW_TOKENS = 64
TIMEOUT_S = 300
CLOUDY = FIXTURES / "spagan_rice1_input_64.png"


@dataclass
class Reply:
    content: str | None
    tool_calls: list[dict]  # {"id", "name", "arguments"}
    finish_reason: str
    geopilot: dict


@dataclass
class Run:
    replies: list[Reply] = field(default_factory=list)
    results: list[tuple[str, object]] = field(default_factory=list)  # (tool, MCP CallToolResult)
    messages: list[dict] = field(default_factory=list)
    requests: list[list[dict]] = field(default_factory=list)  # the messages each reply answered


def function_tools() -> list[dict]:
    """`geopilot tools list --json` -> OpenAI function tools (the MCP server adds the `image` argument)."""
    listed = subprocess.run(
        [sys.executable, "-m", "geopilot.cli", "tools", "list", "--json", "device=cpu"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    rows = json.loads(listed.stdout)
    assert len(rows) == 11
    return [
        {
            "type": "function",
            "function": {"name": r["name"], "description": r["description"], "parameters": r["input_schema"]},
        }
        for r in rows
    ]


async def complete(client, model: str, messages: list[dict], tools, choice, stream: bool) -> Reply:
    """One chat completion; a stream is folded into the message the way agent frameworks fold it."""
    request = {"model": model, "messages": messages, "tools": tools, "tool_choice": choice}
    if not stream:
        reply = await client.chat.completions.create(**request)
        message, finish = reply.choices[0].message, reply.choices[0].finish_reason
        calls = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls or []
        ]
        return Reply(message.content, calls, finish, reply.model_extra["geopilot"])
    content, calls, finish, extension = None, {}, None, None
    async for chunk in await client.chat.completions.create(**request, stream=True):
        extension = (chunk.model_extra or {}).get("geopilot") or extension
        for choice_ in chunk.choices:
            delta = choice_.delta
            if delta.content:
                content = (content or "") + delta.content
            for piece in delta.tool_calls or []:
                call = calls.setdefault(piece.index, {"id": None, "name": None, "arguments": ""})
                call["id"] = piece.id or call["id"]
                call["name"] = (piece.function.name if piece.function else None) or call["name"]
                call["arguments"] += (piece.function.arguments if piece.function else None) or ""
            finish = choice_.finish_reason or finish
    return Reply(content, [calls[i] for i in sorted(calls)], finish, extension)


async def run_agent(client, model: str, tools, mcp, image: bytes, choice, stream: bool) -> Run:
    """The agent loop: ask; while the reply calls tools, run them over MCP and send their results back."""
    encoded = base64.b64encode(image).decode()
    parts = [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + encoded}}]
    run = Run(messages=[{"role": "user", "content": parts + [{"type": "text", "text": QUESTION}]}])
    for round_ in range(MAX_ROUNDS + 1):
        run.requests.append(list(run.messages))
        reply = await complete(client, model, run.messages, tools, choice if round_ < MAX_ROUNDS else "none", stream)
        run.replies.append(reply)
        if reply.finish_reason != "tool_calls":
            return run
        calls = [
            {"id": c["id"], "type": "function", "function": {k: c[k] for k in ("name", "arguments")}}
            for c in reply.tool_calls
        ]
        run.messages.append({"role": "assistant", "content": reply.content, "tool_calls": calls})
        for call in reply.tool_calls:
            arguments = {"image": encoded, **json.loads(call["arguments"])}  # the same image, inline
            result = await mcp.call_tool(call["name"], arguments)
            run.results.append((call["name"], result))
            run.messages.append({"role": "tool", "tool_call_id": call["id"], "content": result.content[0].text})
        choice = "auto"  # the Agents SDK's reset_tool_choice: a forced choice would call tools forever
    raise AssertionError(f"still calling tools after tool_choice 'none': {run.replies[-1]}")


async def drive(base_url: str, model: str, tools, choices, image: bytes) -> dict[tuple[str, bool], Run]:
    """Every tool_choice, streaming and not, through one `geopilot mcp` stdio session."""
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from openai import AsyncOpenAI

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "geopilot.cli", "mcp", "--transport", "stdio", "device=cpu"],
        env={**os.environ, "GEOPILOT_WEIGHTS_DIR": str(weights_candidate())},
        cwd=str(REPO),
    )
    client = AsyncOpenAI(base_url=base_url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    runs = {}
    with anyio.fail_after(TIMEOUT_S):
        async with stdio_client(params) as (read, write), ClientSession(read, write) as mcp:
            await mcp.initialize()
            assert sorted(t.name for t in (await mcp.list_tools()).tools) == sorted(
                t["function"]["name"] for t in tools
            )
            for choice in choices:
                for stream in (False, True):
                    runs[(label(choice), stream)] = await run_agent(client, model, tools, mcp, image, choice, stream)
    await client.close()
    return runs


def label(choice) -> str:
    return choice if isinstance(choice, str) else choice["function"]["name"]


def restored_matches_upstream(result) -> bool:
    (artifact,) = ToolOutput.model_validate_json(result.content[0].text).artifacts
    expected = np.asarray(Image.open(FIXTURES / "spagan_rice1_expected_64.png"), dtype=np.int16)
    return np.abs(np.asarray(Image.open(artifact.path), dtype=np.int16) - expected).max() <= 1


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from geopilot.model import ModelConfig, build_model, save_model

    return save_model(*build_model(ModelConfig()), tmp_path_factory.mktemp("export") / "geopilot-tiny")


@pytest.fixture(scope="module")
def geopilot_serve(model_dir, tmp_path_factory):
    """`geopilot serve --model DIR` on a free loopback port; yields its base URL."""
    port = free_port()
    log = (tmp_path_factory.mktemp("serve") / "stderr.txt").open("w+")
    command = [sys.executable, "-m", "geopilot.cli", "serve", "--model", str(model_dir), "--port", str(port)]
    command += ["--api-key", KEY, "--device", "cpu", "--max-new-tokens", str(MAX_NEW_TOKENS)]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"geopilot serve exited {process.returncode}: {log.read()[-2000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("geopilot serve did not come up in 120 s")
            time.sleep(0.3)
        yield url
    finally:
        stop_process(process)
        log.close()


def check_protocol(run: Run, names: set[str]) -> None:
    """What every reply of every run holds to, whatever the model chose."""
    for reply in run.replies:
        assert reply.finish_reason == ("tool_calls" if reply.tool_calls else "stop"), reply
        for call in reply.tool_calls:
            assert call["id"].startswith("call_") and call["name"] in names, call
            assert isinstance(json.loads(call["arguments"]), dict), call
    for tool, result in run.results:
        text = result.content[0].text
        if tool == "remove_clouds":
            assert not result.is_error and restored_matches_upstream(result), text
        elif result.is_error:  # weights absent here, or the random model's params invalid: one line
            assert "\n" not in text and text, (tool, text)
        else:
            ToolOutput.model_validate_json(text)
    final = run.replies[-1]
    assert final.finish_reason == "stop" and isinstance(final.content, str)
    if run.results:  # the last request ended with tool results: its first turn answers them
        assert final.geopilot["result"]["turns"][0]["kind"] == "answer"


def test_an_openai_sdk_agent_runs_the_tools_over_mcp_against_geopilot_serve(model_dir, geopilot_serve):
    spa_gan_checkpoint()  # skips without the real weights: then no tool would really run
    tools = function_tools()
    names = {t["function"]["name"] for t in tools}
    runs = anyio.run(drive, geopilot_serve, model_dir.name, tools, CHOICES, CLOUDY.read_bytes())
    for (choice, stream), run in runs.items():
        check_protocol(run, names)
        first = run.replies[0]
        if choice == "none":
            assert not first.tool_calls and len(run.replies) == 1 and not run.results, (choice, stream)
        if choice in ("required", "remove_clouds"):
            assert first.tool_calls and len(run.results) >= len(first.tool_calls), (choice, stream)
        if choice == "remove_clouds":
            assert [c["name"] for c in first.tool_calls] == ["remove_clouds"]
            assert not first.geopilot["result"]["repaired"]  # so its KV cache was parked for the answer
            assert run.replies[1].geopilot["result"]["turns"][0]["kind"] == "answer"
    # the answer continued from the think turn's parked KV cache (a hit prefills the plan and the tool turn only);
    # the same request again misses (an entry is taken once), re-prefills image and prompt too, and says the same
    named = runs[("remove_clouds", False)]
    hit = named.replies[1]
    again = OpenAI(base_url=geopilot_serve + "/v1", api_key=KEY, max_retries=0).chat.completions.create(
        model=model_dir.name, messages=named.requests[1], tools=tools, tool_choice="auto"
    )
    miss = again.model_extra["geopilot"]["result"]
    think_input = named.replies[0].geopilot["result"]["tokens"]["input"]
    assert hit.geopilot["result"]["turns"][0]["new_input_tokens"] + think_input == miss["turns"][0]["new_input_tokens"]
    assert [t["text"] for t in hit.geopilot["result"]["turns"]] == [t["text"] for t in miss["turns"]]
    for (choice, stream), run in runs.items():  # greedy: the stream carries exactly what the plain reply does
        assert transcript(run) == transcript(runs[(choice, False)]), (choice, stream)


def transcript(run: Run) -> list[tuple]:
    """What the replies said (the call ids are fresh each time)."""
    return [(r.content, [(c["name"], c["arguments"]) for c in r.tool_calls], r.finish_reason) for r in run.replies]


PLAN = assistant_json(
    AssistantMessage(reasoning="Clouds hide the ground.", actions=[Action(tool="remove_clouds", params={})])
)
ANSWER = assistant_json(AssistantMessage(reasoning="From the restored image.", value="The clouds are removed."))


def test_the_same_agent_through_an_endpoint_engine(model_dir):
    """`geopilot serve --engine-url URL`: the pilot is `GeoPilot.from_endpoint`; its turns are rendered by the
    exported chat template on a loopback engine."""
    import argparse

    from geopilot.model import load_model
    from geopilot.render import render_text
    from geopilot.sample import ToolMessage, UserMessage
    from geopilot.serving.api import create_app
    from geopilot.serving.cli import add_arguments, build_config, build_pilot
    from geopilot.wire import chat_turns

    spa_gan_checkpoint()
    model, processor = load_model(model_dir)  # the export's own tokenizer and chat template
    seen: list[str] = []
    tools = function_tools()
    with serving(engine_app(model, processor, [PLAN, ANSWER], seen)) as engine:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        argv = ["--model", str(model_dir), "--engine-url", engine + "/v1", "--api-key", KEY]
        args = parser.parse_args(argv + ["--max-new-tokens", str(MAX_NEW_TOKENS)])
        config = build_config(args)
        with serving(create_app(build_pilot(args, config), config)) as url:
            runs = anyio.run(drive, url, config.model_name, tools, CHOICES, CLOUDY.read_bytes())
    names = {t["function"]["name"] for t in tools}
    for (choice, stream), run in runs.items():
        check_protocol(run, names)
        if choice == "none":  # the forced plan breaks tool_choice: the repair turn answers
            assert run.replies[0].content == "The clouds are removed." and run.replies[0].geopilot["result"]["repaired"]
            continue
        first, final = run.replies
        assert [c["name"] for c in first.tool_calls] == ["remove_clouds"] and first.content == "Clouds hide the ground."
        assert final.content == "The clouds are removed." and final.geopilot["result"]["outcome"] == "tools"
        ((_, result),) = run.results
        output = ToolOutput.model_validate_json(result.content[0].text)
        # the engine read the client's result as exactly the tool turn THE formatter writes for a call run here
        expected = [
            UserMessage(content=f"<image>\n{QUESTION}"),
            AssistantMessage(reasoning="Clouds hide the ground.", actions=[Action(tool="remove_clouds", params={})]),
            ToolMessage(name="remove_clouds", content=output),
        ]
        assert render_text(chat_turns(expected), processor.tokenizer) in seen, (choice, stream)
