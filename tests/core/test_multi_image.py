"""Several images in one conversation (before, after): both families render one image per placeholder, in order,
equal to their chat templates token for token with the loss mask unchanged; each tiny model reads the images in
the order given (swapping them swaps the features at the image tokens) and trains one step on a two-image sample;
tools get the chat's images by position; bad input (sizes, placeholders, too many images) is one clear line."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.samples import assistant, user
from helpers.scripted import Detector, answer, plan
from PIL import Image
from pydantic import BaseModel, ConfigDict

from geopilot.chat_template import hf_messages
from geopilot.errors import GeoPilotInputError, ImageInputError
from geopilot.families import family_of_processor, qwen2_5_vl
from geopilot.image import load_image
from geopilot.model import load_model
from geopilot.render import IGNORE_INDEX, render_sample, render_text
from geopilot.sample import Action, parse_sample
from geopilot.tool_chains import InputImages
from geopilot.tool_output import ToolOutput
from geopilot.tool_protocol import ToolRegistry
from geopilot.wire import chat_turns

QUESTION = "What changed between the two dates?"


def pair_sample(**extra) -> dict:
    return {
        "id": "levir/test_1/change/0",
        "images": ["A/test_1.png", "B/test_1.png"],
        "source": "LEVIR-CD",
        "ability": "change_detection",
        "messages": [
            user(f"<image>\n<image>\n{QUESTION}"),
            assistant("Compare the dates.", actions=({"tool": "detect_objects", "params": {"categories": ["house"]}},)),
            {"role": "tool", "name": "detect_objects", "content": {"detections": []}},
            assistant("No houses in either.", "Nothing changed."),
        ],
        **extra,
    }


def scene(seed: int, size: tuple[int, int] = (112, 84)) -> Image.Image:
    width, height = size
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def qwen(qwen_dir):
    return load_model(qwen_dir)


# -- rendering ------------------------------------------------------------------------------------------------------


def test_llava_renders_each_image_where_its_placeholder_is_equal_to_the_template(tiny_tokenizer):
    sample = parse_sample(pair_sample())
    messages, turns = hf_messages(sample.messages), chat_turns(sample.messages)
    assert messages[0]["content"][:2] == [{"type": "image"}, {"type": "image"}]
    text = tiny_tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == render_text(turns, tiny_tokenizer) and text.count("<image>") == 2
    assert f"USER: <image>\n<image>\n{QUESTION} ASSISTANT:" in text
    out = tiny_tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    image_id, per_image = tiny_tokenizer.convert_tokens_to_ids("<image>"), 3
    ids, mask = [], []
    for token, flag in zip(out["input_ids"], out["assistant_masks"], strict=True):
        ids += [token] * (per_image if token == image_id else 1)
        mask += [flag] * (per_image if token == image_id else 1)
    rendered = render_sample(sample, tiny_tokenizer, per_image)
    assert rendered.input_ids == ids and [bool(m) for m in mask] == [x != IGNORE_INDEX for x in rendered.labels]
    assert rendered.input_ids.count(image_id) == 2 * per_image


def test_qwen_renders_one_vision_block_per_image_equal_to_upstreams_template(qwen):
    _, processor = qwen
    sample = parse_sample(pair_sample())
    messages = qwen2_5_vl.hf_messages(sample.messages)
    text = processor.apply_chat_template(messages, tokenize=False)
    assert text.count("<|vision_start|><|image_pad|><|vision_end|>") == 2
    assert "<|vision_start|><|image_pad|><|vision_end|><|vision_start|><|image_pad|><|vision_end|>" + QUESTION in text
    before, after = scene(1), scene(2)
    expected = processor(text=[text], images=[before, after], return_tensors="pt")["input_ids"][0].tolist()
    per_image = qwen2_5_vl.image_token_count(processor, *before.size)
    rendered = qwen2_5_vl.render_sample(sample, processor.tokenizer, per_image)
    assert rendered.input_ids == expected
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert rendered.input_ids.count(pad) == 2 * per_image
    turns = [m["content"] for m in messages if m["role"] == "assistant"]
    spans = rendered.trained_spans()
    assert [processor.tokenizer.decode(rendered.input_ids[a:b]) for a, b in spans] == [t + "<|im_end|>" for t in turns]


# -- the tiny model of each family: order, and one training step --------------------------------------------------


def _rows(tmp_path, processor, order: tuple[int, int]) -> list[dict]:
    paths = []
    for seed in order:
        paths.append(str(tmp_path / f"scene_{seed}.png"))
        scene(seed).save(paths[-1])
    family = family_of_processor(processor)
    sample = parse_sample(pair_sample())
    count = family.sample_image_tokens(processor, paths[0], 10**8)
    rendered = family.render_sample(sample, processor.tokenizer, count)
    return [{"id": sample.id, "images": paths, "input_ids": rendered.input_ids, "labels": rendered.labels}]


PROJECTOR = {"llava": "multi_modal_projector", "qwen2_5_vl": "visual.merger"}


@pytest.mark.parametrize("family_name", ["llava", "qwen2_5_vl"])
def test_each_family_reads_two_images_in_order_and_trains_one_step(family_name, tiny_model_dir, qwen_dir, tmp_path):
    import torch

    from geopilot.training.batching import Collator

    model, processor = load_model(tiny_model_dir if family_name == "llava" else qwen_dir)
    family = family_of_processor(processor)
    assert family.NAME == family_name
    seen: list = []
    hook = model.model.language_model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["inputs_embeds"].detach().clone()), with_kwargs=True
    )
    collator = Collator(processor)
    image_token = processor.image_token_id
    features = {}
    for order in ((1, 2), (2, 1)):
        batch = collator(_rows(tmp_path, processor, order))
        positions = (batch["input_ids"][0] == image_token).nonzero().flatten()
        with torch.no_grad():
            model(**{k: v for k, v in batch.items() if k != "sample_ids"})
        features[order] = seen[-1][0, positions]
        assert len(positions) % 2 == 0
    hook.remove()
    half = len(features[(1, 2)]) // 2
    # the same images swapped: each image's features move with it, to the other image's token positions
    torch.testing.assert_close(features[(1, 2)][:half], features[(2, 1)][half:])
    torch.testing.assert_close(features[(1, 2)][half:], features[(2, 1)][:half])
    assert not torch.allclose(features[(1, 2)][:half], features[(1, 2)][half:])

    model.train()
    batch = collator(_rows(tmp_path, processor, (1, 2)))
    loss = model(**{k: v for k, v in batch.items() if k != "sample_ids"}).loss
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for n, p in model.named_parameters() if PROJECTOR[family_name] in n]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def test_the_collator_refuses_a_pair_of_two_sizes(tiny, tmp_path):
    from geopilot.training.batching import Collator

    _, processor = tiny
    rows = _rows(tmp_path, processor, (1, 2))
    scene(3, (64, 64)).save(rows[0]["images"][1])
    with pytest.raises(ImageInputError, match="its images must be one size, got 112x84, 64x64"):
        Collator(processor)(rows)


# -- tools read the chat's images by position --------------------------------------------------------------------


class PairParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    images: InputImages = None


class PairTool:
    """Reads two images (before, after): says the mean grey of each, in the order it got them."""

    name, description, modality, params_model, image_count = "compare", "compares two dates", None, PairParams, 2

    def run(self, image, params, images) -> ToolOutput:
        assert image is images[0]
        return ToolOutput(data={"means": [round(float(np.asarray(i.image).mean()), 3) for i in images]})


class ImageParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    image: str | None = None


class MeanTool:
    name, description, modality, params_model = "mean", "mean grey of one image", None, ImageParams

    def run(self, image, params) -> ToolOutput:
        return ToolOutput(data={"mean": round(float(np.asarray(image.image).mean()), 3)})


def _loaded(*values: int):
    return [load_image(np.full((8, 8, 3), value, dtype=np.uint8)) for value in values]


def test_a_two_image_tool_gets_the_images_in_order_or_says_which_is_missing():
    registry = ToolRegistry([PairTool(), MeanTool()])
    before, after = _loaded(10, 200)
    result = registry.call(Action(tool="compare", params={}), before, images=[before, after])
    assert result.ok and result.output.data == {"means": [10.0, 200.0]}
    swapped = registry.call(
        Action(tool="compare", params={"images": ["input:2", "input:1"]}), before, images=[before, after]
    )
    assert swapped.output.data == {"means": [200.0, 10.0]}
    alone = registry.call(Action(tool="compare", params={}), before)
    assert alone.error_kind == "missing_image"
    assert (
        alone.error
        == "compare reads 2 images (image 1, then image 2, ... in order); this chat has 1: image 2 is missing"
    )
    wrong = registry.call(Action(tool="compare", params={"images": ["input:1"]}), before, images=[before, after])
    assert wrong.error_kind == "invalid_params" and "reads 2 images, but images names 1" in wrong.error


def test_a_one_image_tool_reads_the_first_or_the_image_its_params_name():
    from tools.task_tools import DetectObjectsParams

    registry = ToolRegistry([MeanTool()])
    before, after = _loaded(10, 200)
    first = registry.call(Action(tool="mean", params={}), before, images=[before, after])
    assert first.output.data == {"mean": 10.0} and first.output.computed_on == "input"
    second = registry.call(Action(tool="mean", params={"image": "input:2"}), before, images=[before, after])
    assert second.output.data == {"mean": 200.0} and second.output.computed_on == "input:2"
    third = registry.call(Action(tool="mean", params={"image": "input:3"}), before, images=[before, after])
    assert third.error_kind == "missing_image" and "this chat has 2: image 3 is missing" in third.error
    assert DetectObjectsParams(categories=["house"], image="input:2").image == "input:2"
    with pytest.raises(ValueError, match="'input:K'"):
        DetectObjectsParams(categories=["house"], image="/etc/passwd")


# -- the agent: GeoPilot.chat([before, after], query) -------------------------------------------------------------


def test_chat_takes_a_list_of_images_and_runs_tools_on_them(make_pilot):
    registry = ToolRegistry([PairTool(), Detector()])
    pilot, scripts = make_pilot([plan(("compare", {})), answer("Brighter.")], tools=registry)
    before, after = np.full((48, 64, 3), 10, np.uint8), np.full((48, 64, 3), 200, np.uint8)
    result = pilot.chat([before, after], QUESTION)
    assert result.outcome == "tools" and result.tool_calls[0].output.data == {"means": [10.0, 200.0]}
    assert result.messages[0].content == f"<image>\n<image>\n{QUESTION}"
    assert scripts.image_counts == [2] and result.tokens.image == 2 * pilot.image_tokens
    prompt = scripts.sessions[-1].prompts[0]
    assert prompt.count(pilot.tokenizer.convert_tokens_to_ids("<image>")) == 2 * pilot.image_tokens
    again = pilot.chat([before, after], "And now?", history=result.messages)  # a two-image history goes on
    assert again.messages[0].content == result.messages[0].content


@pytest.mark.parametrize(
    "images, history, message",
    [
        ("sizes", None, "image 2 is 32x32 px but image 1 is 64x48: the images of one chat must be the same size"),
        ("five", None, "5 images, over the limit of 4 per request"),
        ("pair", "one", "history: message 0.content: 2 images need 2 '<image>', found 1"),
        ("one", "pair", "history: message 0.content: '<image>' appears more than once"),
        ("missing", None, "image 2: "),
    ],
)
def test_bad_image_lists_are_one_line_errors(images, history, message, make_pilot, tmp_path):
    pilot, _ = make_pilot([answer("x")])
    a, b = np.zeros((48, 64, 3), np.uint8), np.ones((48, 64, 3), np.uint8)
    given = {
        "sizes": [a, np.zeros((32, 32, 3), np.uint8)],
        "five": [a] * 5,
        "pair": [a, b],
        "one": a,
        "missing": [a, str(tmp_path / "nope.png")],
    }[images]
    past = None
    if history:
        first = "<image>\n" * (2 if history == "pair" else 1) + "Q?"
        past = [
            {"role": "user", "content": first},
            {"role": "assistant", "reasoning": "", "actions": [], "value": "A."},
        ]
    with pytest.raises(GeoPilotInputError) as err:
        pilot.chat(given, QUESTION, history=past)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_max_images_is_configurable(make_pilot):
    pilot, _ = make_pilot([answer("x")], max_images=1)
    a = np.zeros((48, 64, 3), np.uint8)
    with pytest.raises(GeoPilotInputError, match="2 images, over the limit of 1 per request"):
        pilot.chat([a, a], QUESTION)
    with pytest.raises(GeoPilotInputError, match="max_images must be a whole number >= 1"):
        make_pilot([answer("x")], max_images=0)


@pytest.mark.parametrize("family_name", ["llava", "qwen2_5_vl"])
def test_answer_turn_with_kv_reuse_equals_a_re_prefill_with_two_images(family_name, tiny, qwen):
    """Each family's KV session over a batch of a two-image and a one-image conversation: the answer turn on the
    reused cache equals a full re-prefill (each row's image features and grid rows stay with it)."""
    import torch

    from geopilot.generation import GenerationOptions, KVSession

    model, processor = tiny if family_name == "llava" else qwen
    family, tok = family_of_processor(processor), processor.tokenizer
    count = family.image_token_count(processor, *scene(1).size)
    pair = [{"role": "user", "content": f"<image>\n<image>\n{QUESTION}"}]
    one = [{"role": "user", "content": "<image>\nAny ships?"}]
    prompts = [family.prompt_ids(parse_messages(m), tok, count) for m in (pair, one)]
    inputs = family.image_inputs(processor, [scene(1), scene(2), scene(3)])
    pixels = inputs.pop("pixel_values")
    think = GenerationOptions(max_new_tokens=4, min_new_tokens=4)
    reuse = KVSession(model, tok, prompts, pixels, think, image_counts=[2, 1], **inputs)
    again = KVSession(model, tok, prompts, pixels, think, reuse_cache=False, image_counts=[2, 1], **inputs)
    assert [t.token_ids for t in reuse.generate([0, 1])] == [t.token_ids for t in again.generate([0, 1])]
    tail = family.tail_ids(tok, "detect_objects output: {}\n\nAnswer my first question: " + QUESTION)
    answer_options = GenerationOptions(max_new_tokens=5, min_new_tokens=5)
    reuse.generation_config = again.generation_config = answer_options.generation_config(tok)
    answers = [session.generate([0, 1], [tail, tail], keep_logits=True) for session in (reuse, again)]
    for a, b in zip(*answers, strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=0)
    rows = KVSession(model, tok, prompts, pixels, think, image_counts=[2, 1], **inputs)
    rows.generate([1])  # the two-image row leaves: the one-image row keeps its own image
    grid = inputs.get("image_grid_thw")
    last = 1 if grid is None else int(grid[2].prod())  # the third image's pixel rows
    assert rows.image_counts == [1] and torch.equal(rows.pixel_rows[0].cpu(), pixels[-last:].to(model.dtype))


def parse_messages(messages: list[dict]):
    from pydantic import TypeAdapter

    from geopilot.sample import Message

    return TypeAdapter(list[Message]).validate_python(messages)


# -- `geopilot chat --image A --image B` on the real tiny model ----------------------------------------------------


@pytest.fixture(scope="module")
def dates(tmp_path_factory) -> list[str]:
    folder = tmp_path_factory.mktemp("dates")
    paths = [str(folder / name) for name in ("before.png", "after.png", "small.png")]
    for index, (path, size) in enumerate(zip(paths, [(80, 60), (80, 60), (40, 40)], strict=True)):
        scene(index, size).save(path)
    return paths


def test_cli_chat_reads_two_images_in_order(tiny_model_dir, dates, capsys):
    import json

    from geopilot.cli import main

    base = ["chat", "--model", str(tiny_model_dir), "--device", "cpu", "--max-new-tokens", "24", "--json"]
    assert main([*base, "--image", dates[0], "--image", dates[1], QUESTION]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["messages"][0]["content"] == f"<image>\n<image>\n{QUESTION}"
    assert data["tokens"]["image"] == 2 * 16  # the tiny LLaVA's 16 tokens per image
    assert main([*base, "--image", dates[0], QUESTION]) == 0  # one --image: as always
    one = json.loads(capsys.readouterr().out)
    assert one["messages"][0]["content"] == f"<image>\n{QUESTION}" and one["tokens"]["image"] == 16


@pytest.mark.parametrize(
    "images, extra, message",
    [
        ([0, 2], [], "image 2 is 40x40 px but image 1 is 80x60"),
        ([0, 1, 0], ["--max-images", "2"], "3 --image given, over the limit of 2 (--max-images)"),
    ],
)
def test_cli_bad_image_lists_exit_2_with_one_line(tiny_model_dir, dates, capsys, images, extra, message):
    from geopilot.cli import main

    args = [a for i in images for a in ("--image", dates[i])]
    assert main(["chat", "--model", str(tiny_model_dir), "--device", "cpu", *args, *extra, QUESTION]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
