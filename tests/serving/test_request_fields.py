"""Every request field works or is refused naming it (issue 25 item 2): system messages replace the Vicuna system
prompt as the chat template does; n, logprobs, response_format, seed, the penalties, several images."""

from __future__ import annotations

import copy

import httpx
import numpy as np
import pytest
from helpers.scripted import Detector
from helpers.serving import KEY, MODEL, data_url, image_message, png_bytes, serving
from openai import BadRequestError, OpenAI

from geopilot.model import num_image_tokens
from geopilot.render import render_turns
from geopilot.tool_protocol import ToolRegistry
from geopilot.wire import SYSTEM_PROMPT


def test_a_system_message_replaces_the_system_prompt_as_the_chat_template_does(recording, tiny):
    client, seen = recording()
    tok, images = tiny[1].tokenizer, num_image_tokens(tiny[0].config)
    turns = [("user", "<image>\nwhat is this?")]
    for role, system in (("system", "You map airports."), ("developer", "You map airports."), ("system", "")):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": role, "content": system}, *image_message("what is this?")]
        )
        assert seen[-1][0] == render_turns(turns, tok, images, system=system).input_ids
        # the exported chat template renders the same text
        text = tok.apply_chat_template(
            [
                {"role": "system", "content": system},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is this?"}]},
            ],
            tokenize=False,
            add_generation_prompt=True,
        )
        assert tok.decode(seen[-1][0]).replace("<image>" * images, "<image>") == text.replace("<image>", "<image>")
    client.chat.completions.create(model=MODEL, messages=image_message("what is this?"))
    assert seen[-1][0] == render_turns(turns, tok, images, system=SYSTEM_PROMPT).input_ids
    with pytest.raises(BadRequestError) as late:
        client.chat.completions.create(
            model=MODEL, messages=image_message("hi") + [{"role": "system", "content": "late"}]
        )
    assert "a system message may only be the first message" in late.value.message and late.value.param == "messages.1"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 2),
        ("logprobs", True),
        ("top_logprobs", 3),
        ("response_format", {"type": "json_object"}),
        ("response_format", {"type": "json_schema", "json_schema": {"name": "x"}}),
        ("frequency_penalty", 0.5),
        ("presence_penalty", -1.0),
        ("logit_bias", {"42": 5}),
        ("store", True),
        ("stream_options", {"include_usage": True}),  # without stream
        ("service_tier", "flex"),
        ("functions", [{"name": "f"}]),
        ("reasoning_effort", "low"),
        ("seed", 2**64),
    ],
)
def test_what_is_not_done_is_refused_naming_the_field(server, field, value):
    url, _ = server()
    body = {"model": MODEL, "messages": image_message("hi"), field: value}
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEY}"})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == field or error["message"].startswith(f"request: {field}"), error


def test_what_is_done_is_accepted(recording):
    client, seen = recording()
    reply = client.chat.completions.create(
        model=MODEL,
        messages=image_message("what is this?"),
        n=1,
        logprobs=False,
        response_format={"type": "text"},
        frequency_penalty=0,
        presence_penalty=0,
        logit_bias={},
        store=False,
        user="analyst-7",
        metadata={"run": "a"},
        service_tier="auto",
        temperature=0.7,
        top_p=0.9,
        seed=11,
        extra_body={"repetition_penalty": 1.1, "min_tokens": 3},
    )
    assert reply.choices[0].message.content == "A direct answer about the scene." and reply.choices[0].logprobs is None
    options = seen[-1][1]
    assert (options.seed, options.repetition_penalty, options.min_new_tokens) == (11, 1.1, 3)
    assert options.do_sample and (options.temperature, options.top_p) == (0.7, 0.9)


def test_images_are_read_in_order_up_to_the_limit_and_only_from_the_first_message(server):
    url, _ = server(max_images=2)
    client = OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    two = image_message("compare")
    two[0]["content"].append({"type": "image_url", "image_url": {"url": data_url(png_bytes(seed=1))}})
    reply = client.chat.completions.create(model=MODEL, messages=two)
    assert reply.choices[0].message.content  # two image parts of one size: one conversation
    three = copy.deepcopy(two)
    three[0]["content"].append({"type": "image_url", "image_url": {"url": data_url(png_bytes(seed=2))}})
    sizes = image_message("compare")
    sizes[0]["content"].append({"type": "image_url", "image_url": {"url": data_url(png_bytes(width=32, height=32))}})
    later = [{"role": "user", "content": "first"}] + [
        {"role": "assistant", "content": "ok"},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": data_url(png_bytes())}},
                {"type": "text", "text": "and this?"},
            ],
        },
    ]
    for messages, needle in (
        (three, "3 images (image_url parts), over this server's limit of 2"),
        (sizes, "the images of one chat must be the same size"),
        (later, "first user message"),
    ):
        with pytest.raises(BadRequestError) as refused:
            client.chat.completions.create(model=MODEL, messages=messages)
        assert needle in refused.value.message


def test_a_seed_makes_sampling_repeat(tiny):
    """With the tiny model in transformers: the same seed, the same sampled answer (a seeded request runs alone)."""
    from geopilot.agent import GeoPilot
    from geopilot.serving.api import create_app
    from geopilot.serving.config import ServeConfig

    pilot = GeoPilot(tiny[0], tiny[1], ToolRegistry([Detector()]))
    app = create_app(pilot, ServeConfig(model_name=MODEL, api_key=KEY, max_new_tokens=24, max_rounds=0))
    messages = image_message("what is this?", data_url(png_bytes(seed=3)))
    with serving(app) as url:
        client = OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)

        def sample(seed):
            reply = client.chat.completions.create(model=MODEL, messages=messages, temperature=1.0, seed=seed)
            return reply.model_extra["geopilot"]["result"]["turns"][0]["text"]

        first, again, other = sample(5), sample(5), sample(6)
    assert first == again and len(first) > 5
    assert np.mean([first != other]) == 1.0  # another seed, other samples
