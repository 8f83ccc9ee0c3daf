"""The wire format: the exact text the LLM reads and writes (docs/design.md §3).

Vicuna v1: `<s> {SYSTEM} USER: <image>\n{q} ASSISTANT: {json}</s>USER: {tool text} ASSISTANT: {json}</s>`
(`geopilot.render` writes it segment by segment, `geopilot.chat_template.CHAT_TEMPLATE` as one string).
Every assistant turn is ONE compact JSON object `{"reasoning", "actions", "value"}`; every tool turn is ONE user
turn written by `format_tool_turn`. data_gen, training and inference all call these functions and nothing else.
"""

from __future__ import annotations

import json

from geopilot.boxes import BoxCodec, text_to_model, view_to_model
from geopilot.sample import IMAGE_PLACEHOLDER, AssistantMessage, Message, ToolMessage, UserMessage
from geopilot.tool_output import ToolOutput, llm_view

SYSTEM_PROMPT = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)
USER_ROLE, ASSISTANT_ROLE = "USER:", "ASSISTANT:"


def dumps(obj) -> str:
    """Compact JSON, unicode kept as is: the one serialisation of everything the LLM sees as JSON."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def assistant_json(message: AssistantMessage, boxes: BoxCodec | None = None) -> str:
    """An assistant turn as the model writes it; `boxes`: its boxes (params, quoted in text) in the model's own
    convention (`geopilot.boxes`; None: as the trace keeps them)."""
    return dumps(
        {
            "reasoning": text_to_model(message.reasoning, boxes),
            "actions": [{"tool": a.tool, "params": view_to_model(a.params, boxes)} for a in message.actions],
            "value": text_to_model(message.value, boxes),
        }
    )


def question_text(user: UserMessage) -> str:
    """The user's question without the image placeholder (quoted back in the tool turn)."""
    return user.content.replace(IMAGE_PLACEHOLDER, "").strip()


def user_text(user: UserMessage) -> str:
    """A user turn as the model reads it: with images, one `<image>` line per image first, in order, then the
    question (LLaVA's preprocessing moves the images to the front the same way); without one, the text as written."""
    count = user.content.count(IMAGE_PLACEHOLDER)
    if not count:
        return user.content
    return f"{IMAGE_PLACEHOLDER}\n" * count + question_text(user)


def format_tool_turn(results: list[tuple[str, ToolOutput]], question: str, boxes: BoxCodec | None = None) -> str:
    """THE formatter: tool outputs -> the user turn the model answers from.

    `results` holds (tool name, canonical output) pairs in call order; a failed call is a ToolOutput with
    `error` set, shown as `{"error": ...}`. `boxes`: the outputs' boxes in the model's convention.
    """
    lines = [f"{name} output: {dumps(view_to_model(llm_view(output), boxes))}" for name, output in results]
    return "\n".join(lines) + f"\n\nAnswer my first question: {question}"


def chat_turns(
    messages: list[Message], tool_role: str = "user", boxes: BoxCodec | None = None
) -> list[tuple[str, str]]:
    """Sample messages -> `[(role, text)]` with role in {"user", "assistant"}: user text by `user_text`, each
    assistant turn as its compact JSON, consecutive tool messages as ONE user turn written by `format_tool_turn`
    (quoting the question of their round). `tool_role` names that turn's role (a ChatML family has a `tool` role);
    `boxes`: every box in the model's convention (`geopilot.boxes`)."""
    turns: list[tuple[str, str]] = []
    question = ""
    pending_tools: list[ToolMessage] = []

    def flush() -> None:
        if pending_tools:
            results = [(t.name, t.content) for t in pending_tools]
            turns.append((tool_role, format_tool_turn(results, question, boxes)))
            pending_tools.clear()

    for message in messages:
        if message.role == "tool":
            pending_tools.append(message)
            continue
        flush()
        if message.role == "user":
            question = question_text(message)
            turns.append(("user", user_text(message)))
        else:
            turns.append(("assistant", assistant_json(message, boxes)))
    flush()
    return turns


def format_repair_turn(error: str, question: str) -> str:
    """The one repair turn: what was wrong with the model's last plan, and what a usable reply looks like."""
    return (
        f"Your last reply could not be used: {error}\n"
        'Reply with one JSON object {"reasoning": "...", "actions": [{"tool": "...", "params": {...}}], "value": null} '
        'that calls only available tools with valid params, or answer directly with "actions": [] and the answer in "value".'
        f"\n\nAnswer my first question: {question}"
    )
