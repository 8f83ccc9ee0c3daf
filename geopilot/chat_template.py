"""The wire format as a transformers/vLLM chat template, and a sample in the HF message form (docs/chat_template.md).

`CHAT_TEMPLATE` renders exactly the text `geopilot.render.render_text` writes for the same conversation, so a
checkpoint served through `apply_chat_template` (transformers, vLLM, TGI) reads the prompts it was trained on:

    <s> {system} USER: <image>\\n{question} ASSISTANT: {json}</s>USER: {tool} output: {view}\\n\\nAnswer my first question: {question} ASSISTANT: {json}</s>

- the default Vicuna system prompt, unless a first `system` message replaces it;
- every image part first (`<image>\\n` per image, in order, then the text), whatever the part order, as LLaVA's
  preprocessing does;
- consecutive `tool` messages merged into ONE user turn, as `geopilot.wire.format_tool_turn` writes it;
- `{% generation %}` around each assistant turn (` {json}</s>`), for `return_assistant_tokens_mask=True`;
- `add_generation_prompt` appends ` ASSISTANT:` after a final user or tool turn.
An unknown role, a tool message without `name`, a misplaced system message or turns out of order raise a
`TemplateError` naming the problem.
"""

from __future__ import annotations

import json

from geopilot.boxes import BoxCodec, view_to_model
from geopilot.sample import IMAGE_PLACEHOLDER, Message
from geopilot.tool_output import llm_view
from geopilot.wire import ASSISTANT_ROLE, SYSTEM_PROMPT, USER_ROLE, assistant_json, dumps, question_text

_TEMPLATE = """\
{#- GeoPilot's wire format; docs/chat_template.md describes the message form. -#}
{%- macro text_of(content, role) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is iterable and content is not mapping -%}
        {%- for part in content -%}
            {%- if part is not mapping or part['type'] not in ['text', 'image', 'image_url'] -%}
                {{- raise_exception(role + ' content parts must be {"type": "text", "text": ...} or {"type": "image"}') -}}
            {%- endif -%}
        {%- endfor -%}
        {{- content | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('\\n') -}}
    {%- else -%}
        {{- raise_exception(role + ' content must be a string or a list of parts, not ' + (content | string)) -}}
    {%- endif -%}
{%- endmacro -%}
{%- macro close_user_turn(next_role) -%}
    @USER_CLOSE@
    {%- if next_role == 'assistant' or (next_role is none and add_generation_prompt) -%}
        {{- @ASSISTANT_OPEN@ -}}
    {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(system=@SYSTEM@, question='') -%}
{%- set conversation = messages -%}
{%- if messages and messages[0]['role'] == 'system' -%}
    {%- set ns.system = text_of(messages[0]['content'], 'system') -%}
    {%- set conversation = messages[1:] -%}
{%- endif -%}
@BOS@{%- for message in conversation -%}
    {%- set role = message['role'] -%}
    {%- set previous = none if loop.first else loop.previtem['role'] -%}
    {%- set next_role = none if loop.last else loop.nextitem['role'] -%}
    {%- if role == 'user' -%}
        {%- if previous not in [none, 'assistant'] -%}
            {{- raise_exception('a user message must come first or follow an assistant message, not a ' + previous + ' message') -}}
        {%- endif -%}
        {%- set text = text_of(message['content'], 'user') -%}
        {%- set images = (0 if message['content'] is string else message['content'] | selectattr('type', 'in', ['image', 'image_url']) | list | length) + text.count(@IMAGE@) -%}
        {%- set ns.question = text | replace(@IMAGE@, '') | trim -%}
        {%- if loop.first -%}
            {{- @SYSTEM_TURN@ -}}
        {%- endif -%}
        {{- @USER_OPEN@ + @IMAGE_LINE@ * images + (ns.question if images else text) -}}
        {{- close_user_turn(next_role) -}}
    {%- elif role == 'tool' -%}
        {%- if message['name'] is not defined or message['name'] is not string or not message['name'] -%}
            {{- raise_exception('a tool message needs "name": the tool whose output it holds') -}}
        {%- endif -%}
        {%- if previous not in ['assistant', 'tool'] -%}
            {{- raise_exception('a tool message must follow the assistant message that called the tool') -}}
        {%- endif -%}
        {{- '\\n' if previous == 'tool' else @USER_OPEN@ -}}
        {{- message['name'] + ' output: ' + text_of(message['content'], 'tool') -}}
        {%- if next_role != 'tool' -%}
            {{- '\\n\\nAnswer my first question: ' + ns.question -}}
            {{- close_user_turn(next_role) -}}
        {%- endif -%}
    {%- elif role == 'assistant' -%}
        {%- if previous not in ['user', 'tool'] -%}
            {{- raise_exception('an assistant message must follow a user or tool message') -}}
        {%- endif -%}
        {%- generation -%}
            {{- @ASSISTANT_TEXT@ -}}
        {%- endgeneration -%}
        @AFTER_ASSISTANT@
    {%- elif role == 'system' -%}
        {{- raise_exception('a system message may only be the first message') -}}
    {%- else -%}
        {{- raise_exception('unknown role ' + (role | string) + ': use system, user, assistant or tool') -}}
    {%- endif -%}
{%- endfor -%}
"""

IM_START, IM_END = "<|im_start|>", "<|im_end|>"  # ChatML's turn delimiters (special tokens of its tokenizer)


def _fill(parts: dict[str, str]) -> str:
    text = _TEMPLATE.replace("@SYSTEM@", json.dumps(SYSTEM_PROMPT))
    for marker, value in parts.items():
        text = text.replace(marker, value)
    return text.replace("@IMAGE_LINE@", json.dumps(IMAGE_PLACEHOLDER + "\n")).replace(
        "@IMAGE@", json.dumps(IMAGE_PLACEHOLDER)
    )


# Vicuna v1, LLaVA-1.5's: `<s> {system} USER: ... ASSISTANT: {json}</s>USER: ...`
CHAT_TEMPLATE = _fill(
    {
        "@BOS@": "{{- bos_token -}}\n",
        "@SYSTEM_TURN@": "' ' + (ns.system + ' ' if ns.system else '')",
        "@USER_OPEN@": json.dumps(USER_ROLE + " "),
        "@USER_CLOSE@": "",
        "@ASSISTANT_OPEN@": json.dumps(" " + ASSISTANT_ROLE),
        "@ASSISTANT_TEXT@": "' ' + text_of(message['content'], 'assistant') + eos_token",
        "@AFTER_ASSISTANT@": "",
    }
)

# ChatML, for a language model instruction-tuned on it (SmolLM2-135M-Instruct): every message is
# `<|im_start|>{role}\n{content}<|im_end|>\n`; tool outputs are one user message, as in Vicuna's wire text
CHATML_TEMPLATE = _fill(
    {
        "@BOS@": "",
        "@SYSTEM_TURN@": f"({json.dumps(IM_START + 'system' + chr(10))} + ns.system + {json.dumps(IM_END + chr(10))} if ns.system else '')",
        "@USER_OPEN@": json.dumps(IM_START + "user\n"),
        "@USER_CLOSE@": "{{- " + json.dumps(IM_END + "\n") + " -}}",
        "@ASSISTANT_OPEN@": json.dumps(IM_START + "assistant\n"),
        "@ASSISTANT_TEXT@": "text_of(message['content'], 'assistant') + " + json.dumps(IM_END),
        "@AFTER_ASSISTANT@": "{{- '\\n' -}}",
    }
)


def current_template(saved) -> str:
    """The template a loaded tokenizer gets: ChatML's for any version of GeoPilot's ChatML template (an export keeps
    its kind when the template text changes between versions), else Vicuna's (upstream templates included)."""
    ours = isinstance(saved, str) and saved.startswith("{#- GeoPilot's wire format")  # every version's first words
    return CHATML_TEMPLATE if ours and IM_START in saved else CHAT_TEMPLATE


def hf_messages(messages: list[Message], system: str | None = None, boxes: BoxCodec | None = None) -> list[dict]:
    """Sample messages -> the HF message form `CHAT_TEMPLATE` reads (and `render_text` agrees with):
    a user turn with images is `[{"type": "image"}, ..., {"type": "text", "text": question}]` (one image part per
    image, in order), one without is a
    string; an assistant turn is its compact JSON; a tool turn is `{"role": "tool", "name": ..., "content":
    compact JSON of llm_view(output)}`. `system` replaces the default Vicuna system prompt; `boxes`: the boxes in
    the model's convention (`geopilot.boxes`; None for LLaVA, whose convention is the trace's)."""
    out: list[dict] = [] if system is None else [{"role": "system", "content": system}]
    for message in messages:
        if message.role == "user":
            if count := message.content.count(IMAGE_PLACEHOLDER):
                content = [{"type": "image"}] * count + [{"type": "text", "text": question_text(message)}]
                out.append({"role": "user", "content": content})
            else:
                out.append({"role": "user", "content": message.content})
        elif message.role == "assistant":
            out.append({"role": "assistant", "content": assistant_json(message, boxes)})
        else:
            view = view_to_model(llm_view(message.content), boxes)
            out.append({"role": "tool", "name": message.name, "content": dumps(view)})
    return out
