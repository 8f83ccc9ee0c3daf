"""The OpenAI chat-completions request, read into a GeoPilot chat: every field either works or is refused with a
400 naming it (docs/serving.md lists them all), and the messages become the sample format.

- A first `system` (or `developer`) message replaces the Vicuna system prompt, as the chat template does; one
  anywhere else is refused, as the template refuses it.
- The images are `image_url` parts of the first user message, in order (before, after; at most the server's
  `max_images`, one size); an image elsewhere is 400.
- `tools` turns on client-run tools: the think turn's plan comes back as `tool_calls`, and the client's
  `role: "tool"` results (matched to the calls by `tool_call_id`) become the tool turn THE formatter writes.
  Tools the registry does not know are refused, unless the server allows them (`--allow-unknown-tools`): then
  their schemas are appended to the system prompt, which the model was never trained on.
- Size: every character the client writes but its image (texts, tool names, descriptions, parameter schemas, call
  arguments, tool results) counts against the server's text limit; a request has at most 128 tools, each schema
  passes `geopilot.json_limits.check_tool_schema`, and no JSON it carries nests more than 64 levels.
- The plans in the history are held to what a plan this server hands back is: strict JSON arguments (NaN and
  Infinity are not JSON, and would come back as null), calls of a tool the request offers (GeoPilot's own tools
  without `tools`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from geopilot.agent.client_tools import ClientTools, tool_output
from geopilot.errors import GeoPilotInputError, clipped
from geopilot.json_limits import MAX_JSON_DEPTH, check_depth, check_tool_schema, loads, measure
from geopilot.sample import IMAGE_PLACEHOLDER, Action, AssistantMessage
from geopilot.serving.security import ServeError
from geopilot.wire import SYSTEM_PROMPT, dumps

FUNCTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"
MAX_TOOLS = 128  # tools per request, OpenAI's own limit
UNTRAINED_TOOLS = "Tools you may also call (you were not trained on them; their JSON schemas follow):"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ImageURL(_Strict):
    url: str
    detail: Literal["auto", "low", "high"] | None = None  # accepted; the image is always read at 336 px


class ContentPart(_Strict):
    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: ImageURL | None = None


class FunctionCall(_Strict):
    name: str
    arguments: str  # JSON text


class ToolCall(_Strict):
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessageIn(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None  # a participant's name: accepted, not shown to the model
    tool_calls: list[ToolCall] | None = None  # assistant messages: the calls of a client-run plan
    tool_call_id: str | None = None  # tool messages: which call this result answers
    refusal: str | None = None  # assistant messages echoed back: accepted, not shown to the model


class FunctionDefinition(_Strict):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # accepted: calls of trained tools are validated against their params model anyway


class ToolDefinition(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_Strict):
    include_usage: bool | None = None  # True: a last chunk with `choices: []` and the usage
    include_obfuscation: bool | None = None  # accepted; no padding is sent


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class GeoPilotOptions(_Strict):
    max_rounds: int | None = Field(None, ge=0)
    modality: Literal["optical", "sar"] | None = None
    visualize: bool = False
    bands: list[int] | None = None  # band numbers shown as R, G, B (or one, grey); geopilot.bands decides otherwise


class ChatCompletionRequest(_Strict):
    """Every field a request may carry; any other is refused (400 naming it)."""

    model: str
    messages: list[ChatMessageIn] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int | None = None  # only 1
    seed: int | None = Field(
        None, ge=-(2**63), le=2**63 - 1
    )  # seeds sampling (a seeded request runs alone, so the same seed gives the same reply)
    stop: str | list[str] | None = None  # up to 4 non-empty strings; the answer ends before the first one
    logprobs: bool | None = None  # only false
    top_logprobs: int | None = None  # only 0
    response_format: ResponseFormat | None = None  # only text
    frequency_penalty: float | None = None  # only 0
    presence_penalty: float | None = None  # only 0
    logit_bias: dict[str, float] | None = None  # only empty
    repetition_penalty: float | None = Field(None, gt=0)  # vLLM's extension; GenerationOptions.repetition_penalty
    min_tokens: int | None = Field(None, ge=0)  # vLLM's extension; GenerationOptions.min_new_tokens
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # false: at most one call per plan
    user: str | None = None  # an end-user id: accepted, not used
    metadata: dict[str, str] | None = None  # accepted, not used (nothing is stored)
    store: bool | None = None  # only false: nothing is stored
    service_tier: Literal["auto", "default"] | None = None
    geopilot: GeoPilotOptions = GeoPilotOptions()

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


def refuse_unsupported(body: ChatCompletionRequest) -> None:
    """400 naming the first field whose value asks for what this server does not do."""
    refusals = [
        ("n", body.n not in (None, 1), "only 1 choice per request"),
        ("logprobs", bool(body.logprobs), "log probabilities are not returned"),
        ("top_logprobs", bool(body.top_logprobs), "log probabilities are not returned"),
        (
            "response_format",
            body.response_format is not None and body.response_format.type != "text",
            "only {'type': 'text'}: the answer is the model's text (its plans are JSON already)",
        ),
        ("frequency_penalty", bool(body.frequency_penalty), "only 0; use repetition_penalty"),
        ("presence_penalty", bool(body.presence_penalty), "only 0; use repetition_penalty"),
        ("logit_bias", bool(body.logit_bias), "not supported"),
        ("store", bool(body.store), "nothing is stored"),
        ("stream_options", body.stream_options is not None and not body.stream, "only with stream: true"),
        ("tool_choice", body.tool_choice is not None and body.tools is None, "needs tools"),
        ("tools", body.tools == [], "an empty list; leave it out for GeoPilot's own tools"),
    ]
    for name, refused, why in refusals:
        if refused:
            raise ServeError(400, f"{name}: {why}", code="unsupported_field", param=name)
    stops = body.stops()
    if len(stops) > 4 or any(not s for s in stops):
        raise ServeError(400, "stop: up to 4 non-empty strings", code="bad_request", param="stop")


def text_of(content) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "\n".join(part.text or "" for part in content if part.type == "text")


def images_of(content) -> list[str]:
    if content is None or isinstance(content, str):
        return []
    return [part.image_url.url for part in content if part.type == "image_url" and part.image_url is not None]


def check_request_size(body: ChatCompletionRequest, max_text_chars: int) -> None:
    """400 for a request over the server's limits before any of it is rendered: more than MAX_TOOLS tools, a tool
    schema over its size or depth, or more than `max_text_chars` characters of `client_text`."""
    tools = body.tools or []
    if len(tools) > MAX_TOOLS:
        raise ServeError(
            400, f"tools: {len(tools)} tools, over the limit of {MAX_TOOLS}", code="bad_request", param="tools"
        )
    for index, tool in enumerate(tools):
        where = f"tools.{index}.function.parameters"
        if tool.function.parameters is not None:
            try:
                check_tool_schema(tool.function.parameters, where)
            except GeoPilotInputError as err:
                raise ServeError(400, str(err), code="bad_request", param=where) from None
    chars = measure(client_text(body), MAX_JSON_DEPTH + 4)[1]  # the schemas are bounded now; the rest is flat
    if chars > max_text_chars:  # refused before tokenising: the tokenizer would hold the model thread for seconds
        raise ServeError(
            400,
            f"the request has {chars:,} characters of text (messages, tools and their schemas), over this server's "
            f"limit of {max_text_chars:,} (no model context holds that many)",
            code="context_length_exceeded",
        )


def client_text(body: ChatCompletionRequest) -> list:
    """Everything in a request the client wrote but its image and the fields' fixed values: message texts, names,
    call ids and arguments, tool names, descriptions and schemas, the named tool_choice, stop strings, `user`,
    `metadata`."""
    messages = [
        [text_of(m.content), m.name, m.refusal, m.tool_call_id]
        + [[c.id, c.function.name, c.function.arguments] for c in m.tool_calls or []]
        for m in body.messages
    ]
    tools = [[t.function.name, t.function.description, t.function.parameters] for t in body.tools or []]
    schema = body.response_format.json_schema if body.response_format is not None else None
    choice = body.tool_choice.function.name if isinstance(body.tool_choice, NamedToolChoice) else None
    return [messages, tools, choice, body.stop, body.user, body.metadata, body.logit_bias, schema]


@dataclass
class Dialogue:
    """The request's conversation in the sample format: what `GeoPilot.chat` takes."""

    system: str | None
    history: list[dict] = field(default_factory=list)
    query: str | None = None  # None: the conversation ends with tool results to answer from
    calls: list[tuple[str, Action]] = field(default_factory=list)  # the history's planned calls, by request key


def read_dialogue(body: ChatCompletionRequest) -> Dialogue:
    """The messages -> system prompt, history and query; 400 naming the message for what the chat template or
    the tool protocol would not accept."""
    messages = list(enumerate(body.messages))
    dialogue = Dialogue(system=None)
    if messages[0][1].role in ("system", "developer"):
        dialogue.system = text_of(messages.pop(0)[1].content)
    calls: dict[str, int] = {}  # the last plan's call ids -> their position
    names: list[str] = []
    results: list[dict | None] = []
    out = dialogue.history

    def flush(where: str) -> None:
        missing = [i for i, r in enumerate(results) if r is None]
        if missing:
            ids = clipped(", ".join(repr(k) for k, v in calls.items() if v in missing))
            raise _bad(where, f"no tool message answers the call(s) {ids} of the preceding assistant message")
        out.extend({"role": "tool", "name": names[i], "content": result} for i, result in enumerate(results))
        calls.clear(), names.clear(), results.clear()

    for index, message in messages:
        where = f"messages.{index}"
        role = message.role
        if role != "tool" and calls:
            flush(where)
        if role in ("system", "developer"):
            raise _bad(where, "a system message may only be the first message")
        if images_of(message.content) and (role != "user" or out):
            raise _bad(where, "the image must be in the first user message of a conversation")
        if role == "user":
            text = text_of(message.content)
            if IMAGE_PLACEHOLDER in text:
                raise _bad(where, f"the text must not contain {IMAGE_PLACEHOLDER!r}; send the image as image_url")
            placeholders = f"{IMAGE_PLACEHOLDER}\n" * len(images_of(message.content))
            out.append({"role": "user", "content": placeholders + text if not out else text})
        elif role == "assistant" and message.tool_calls:
            actions = [_action(f"{where}.tool_calls.{j}", call) for j, call in enumerate(message.tool_calls)]
            dialogue.calls += [(f"{where}.tool_calls.{j}", action) for j, action in enumerate(actions)]
            for position, call in enumerate(message.tool_calls):
                if call.id in calls:
                    raise _bad(f"{where}.tool_calls.{position}.id", f"{clipped(repr(call.id))} is used twice")
                calls[call.id] = position
            names[:] = [a.tool for a in actions]
            results[:] = [None] * len(actions)
            plan = [a.model_dump() for a in actions]
            out.append({"role": "assistant", "reasoning": text_of(message.content), "actions": plan, "value": None})
        elif role == "assistant":
            out.append({"role": "assistant", "reasoning": "", "actions": [], "value": text_of(message.content)})
        else:  # tool
            if not calls:
                raise _bad(where, "a tool message must follow the assistant message whose tool_calls it answers")
            if message.tool_call_id not in calls:
                known = clipped(", ".join(repr(k) for k in calls))
                raise _bad(
                    f"{where}.tool_call_id",
                    f"{clipped(repr(message.tool_call_id))} matches no call of the plan (its calls: {known})",
                )
            position = calls[message.tool_call_id]
            if results[position] is not None:
                raise _bad(f"{where}.tool_call_id", f"{clipped(repr(message.tool_call_id))} is answered twice")
            results[position] = _tool_result(f"{where}.content", text_of(message.content))
    if calls:
        flush(f"messages.{len(body.messages)}")
    if not out or out[0]["role"] != "user":
        raise ServeError(400, "the conversation must start with a user message", code="bad_request")
    if IMAGE_PLACEHOLDER not in out[0]["content"]:
        raise ServeError(400, "a conversation needs an image (an image_url part of its first user message)")
    last = out[-1]
    if last["role"] == "tool":
        if body.tools is None:
            raise ServeError(400, "the messages end with tool results: send the tools too", code="bad_request")
        return dialogue
    if last["role"] != "user":
        raise ServeError(400, "the last message must be the user's question or tool results", code="bad_request")
    out.pop()
    dialogue.query = last["content"].replace(IMAGE_PLACEHOLDER, "").strip()
    return dialogue


def _action(where: str, call: ToolCall) -> Action:
    """A call of a plan in the history, read as the model's own plan is: strict JSON arguments (NaN and Infinity
    are not JSON numbers), an object, nesting at most MAX_JSON_DEPTH."""
    try:
        params = loads(call.function.arguments or "{}", f"{where}.function.arguments")
    except GeoPilotInputError as err:
        raise ServeError(400, str(err), code="bad_request", param=f"{where}.function.arguments") from None
    if not isinstance(params, dict):
        raise _bad(f"{where}.function.arguments", f"must be a JSON object, got {type(params).__name__}")
    if not call.function.name:
        raise _bad(f"{where}.function.name", "is empty")
    return Action(tool=call.function.name, params=params)


def _tool_result(where: str, text: str) -> dict:
    """A tool message's content as the canonical ToolOutput's JSON; 400 for JSON nested past MAX_JSON_DEPTH (the
    output could not be written back out)."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None  # not JSON: the result is the text itself
    except RecursionError:
        raise _bad(where, f"nests more than {MAX_JSON_DEPTH} levels deep") from None
    try:
        check_depth(value, where)
    except GeoPilotInputError as err:
        raise ServeError(400, str(err), code="bad_request", param=where) from None
    return tool_output(text).model_dump(mode="json", exclude_defaults=True)


def check_history_calls(dialogue: Dialogue, offered: tuple[str, ...]) -> None:
    """400 naming the call for a plan in the history that names a tool the request does not offer (`offered`: its
    `tools`, or GeoPilot's own tools without them): no plan this server hands back does. (Params a tool would
    refuse stay: a plan whose calls still break them after the repair turn is handed back as it is.)"""
    for where, action in dialogue.calls:
        if action.tool not in offered:
            raise _bad(
                f"{where}.function.name",
                f"{clipped(repr(action.tool))} is not a tool of this request (its tools: {clipped(', '.join(offered))})",
            )


def _bad(where: str, why: str) -> ServeError:
    return ServeError(400, f"{where}: {why}", code="bad_request", param=where)


def client_tools(
    body: ChatCompletionRequest, known: list[str], allow_unknown: bool, system: str | None
) -> tuple[ClientTools | None, str | None]:
    """The request's `tools` / `tool_choice` / `parallel_tool_calls` -> ClientTools (None without `tools`) and
    the system prompt (with the untrained tools' schemas appended, where they are allowed)."""
    if body.tools is None:
        return None, system
    names = tuple(t.function.name for t in body.tools)
    if len(set(names)) != len(names):
        raise ServeError(400, "tools: two tools have the same name", code="bad_request", param="tools")
    unknown = tuple(n for n in names if n not in known)
    if unknown and not allow_unknown:
        raise ServeError(
            400,
            f"tools: {', '.join(unknown)} unknown to this model; it was trained on {', '.join(known)} "
            "(the server's --allow-unknown-tools offers others untrained)",
            code="unknown_tool",
            param="tools",
        )
    choice = body.tool_choice or "auto"
    if isinstance(choice, NamedToolChoice):
        choice = choice.function.name
        if choice not in names:
            raise ServeError(
                400, f"tool_choice: {clipped(repr(choice))} is not in tools", code="bad_request", param="tool_choice"
            )
    declared: list[tuple[str, str]] = []
    if unknown:
        schemas = [t.function.model_dump(exclude_none=True) for t in body.tools if t.function.name in unknown]
        system = f"{SYSTEM_PROMPT if system is None else system}\n{UNTRAINED_TOOLS} {dumps(schemas)}"
        declared = _plan_schemas(body, unknown)
    parallel = body.parallel_tool_calls is not False
    return ClientTools(names, unknown, choice, parallel, tuple(declared)), system


def _plan_schemas(body: ChatCompletionRequest, unknown: tuple[str, ...]) -> list[tuple[str, str]]:
    """The untrained tools' `parameters` for the plan grammar, refused (400) when too big, too deep or recursive
    before anything compiles them; a tool without `parameters` takes any object."""
    from geopilot.agent.plan_schema import check_client_schema

    declared = []
    for tool in body.tools:
        if tool.function.name in unknown and tool.function.parameters is not None:
            try:
                declared.append((tool.function.name, check_client_schema(tool.function.name, tool.function.parameters)))
            except ValueError as err:
                raise ServeError(400, f"tools: {err}", code="bad_request", param="tools") from None
    return declared


def tool_call_entries(plan: AssistantMessage) -> list[dict]:
    """A plan's calls in the OpenAI shape (`arguments` as JSON text), each with a fresh id."""
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": action.tool, "arguments": json.dumps(action.params, ensure_ascii=False)},
        }
        for action in plan.actions
    ]
