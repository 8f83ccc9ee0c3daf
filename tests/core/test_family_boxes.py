"""Each family renders and parses its own boxes (docs/models.md, "Boxes"): Qwen2.5-VL reads and writes absolute
pixels of the image as its processor resizes it, in tool outputs, plan params and answers, and the exported
template agrees token for token; LLaVA keeps the trace's normalised boxes; a plan the tiny Qwen2.5-VL writes in
pixels reaches the tool as the normalised box, and its plan grammar decodes box params as whole pixels."""

from __future__ import annotations

import json

import pytest
from helpers.scripted import BoxSegmenter, Scripts
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from geopilot.agent import GeoPilot
from geopilot.agent.plan_schema import SEPARATORS, PlanConstraint, plan_json_schema
from geopilot.families import llava, qwen2_5_vl
from geopilot.image import DEFAULT_MAX_PIXELS
from geopilot.plan_parser import PlanParseError, parse_plan
from geopilot.sample import AssistantMessage, parse_sample
from geopilot.tool_output import Detection, ToolOutput
from geopilot.tool_protocol import ToolRegistry
from geopilot.training.data import ImageTokens

BOX = [0.25, 0.5, 0.75, 0.75]


def box_sample() -> dict:
    """A box prompt in the plan's params, the tool's output box, and the answer quoting it."""
    return {
        "id": "boxes",
        "image": "scene.png",
        "messages": [
            {"role": "user", "content": "<image>\nSegment the plane in the lower half."},
            {
                "role": "assistant",
                "reasoning": "Segment inside the box.",
                "actions": [{"tool": "segment_box", "params": {"box": BOX}}],
                "value": None,
            },
            {
                "role": "tool",
                "name": "segment_box",
                "content": {"detections": [{"label": "plane", "box": BOX, "score": 0.9}]},
            },
            {
                "role": "assistant",
                "reasoning": "From the tool output.",
                "actions": [],
                "value": "The plane is at [0.25, 0.5, 0.75, 0.75].",
            },
        ],
    }


def rendered_text(processor, folder, size: tuple[int, int]):
    """(decoded training ids, ids, template ids) of `box_sample` on a `size` image, as training renders it."""
    image = Image.new("RGB", size, (90, 120, 60))
    image.save(folder / "scene.png")
    tokens = ImageTokens.of(processor, DEFAULT_MAX_PIXELS)
    path = str(folder / "scene.png")
    sample = parse_sample(box_sample())
    rendered = tokens.family.render_sample(sample, processor.tokenizer, tokens.count(path), None, tokens.boxes(path))
    return processor.tokenizer.decode(rendered.input_ids), rendered.input_ids, tokens.boxes(path)


@pytest.mark.parametrize(("size", "pixels"), [(448, [112, 224, 336, 336]), (896, [224, 448, 672, 672])])
def test_qwen_renders_boxes_in_pixels_of_its_resized_image(qwen, tmp_path, size, pixels):
    _, processor = qwen
    text, ids, boxes = rendered_text(processor, tmp_path, (size, size))
    compact = json.dumps(pixels, separators=(",", ":"))
    assert f'"params":{{"box":{compact}}}' in text  # the plan's box prompt
    assert f'"box":{compact},"score":0.9' in text  # the tool output
    assert f"The plane is at {json.dumps(pixels)}." in text  # the answer quoting it
    assert "0.25" not in text and "0.75" not in text
    # the template, fed the same messages, gives the same tokens once the processor expands the image
    messages = qwen2_5_vl.hf_messages(parse_sample(box_sample()).messages, boxes=boxes)
    template = processor.apply_chat_template(messages, tokenize=False)
    image = Image.open(tmp_path / "scene.png")
    assert processor(text=[template], images=[image], return_tensors="pt")["input_ids"][0].tolist() == ids


def test_a_non_square_image_is_boxed_on_smart_resizes_size(qwen):
    _, processor = qwen
    assert qwen2_5_vl.resized_size(processor, 500, 300) == (308, 504)  # (height, width), multiples of 28
    assert qwen2_5_vl.box_codec(processor, 500, 300).to_model(BOX) == [126, 154, 378, 231]


def test_llava_keeps_the_trace_boxes(tiny, tmp_path):
    _, processor = tiny
    text, _, boxes = rendered_text(processor, tmp_path, (448, 448))
    assert boxes is None
    assert '"params":{"box":[0.25,0.5,0.75,0.75]}' in text and '"box":[0.25,0.5,0.75,0.75],"score":0.9' in text
    assert "The plane is at [0.25, 0.5, 0.75, 0.75]." in text


@pytest.mark.parametrize("size", [(448, 448), (896, 896), (500, 300), (4000, 3000)])
def test_pixel_boxes_round_trip_within_one_pixel(qwen, size):
    import random

    _, processor = qwen
    height, width = qwen2_5_vl.resized_size(processor, *size)
    codec = qwen2_5_vl.box_codec(processor, *size)
    rng = random.Random(0)
    for _ in range(200):
        x1, y1 = rng.uniform(0, 0.5), rng.uniform(0, 0.5)
        box = [x1, y1, x1 + rng.uniform(0.01, 0.5), y1 + rng.uniform(0.01, 0.5)]
        back = codec.from_model(codec.to_model(box))
        scale = (width, height, width, height)
        assert all(abs(a - b) * s <= 1.0 for a, b, s in zip(box, back, scale, strict=True))
        pixels = [rng.randint(0, width), rng.randint(0, height), rng.randint(0, width), rng.randint(0, height)]
        assert codec.to_model(codec.from_model(pixels)) == pixels


def test_a_plan_in_pixels_parses_back_to_normalised_boxes(qwen):
    _, processor = qwen
    codec = qwen2_5_vl.box_codec(processor, 896, 448)  # resized to (448, 896): x scales by 896, y by 448
    text = '{"reasoning":"near [448, 224, 896, 448]","actions":[{"tool":"segment_box","params":{"box":[224,224,672,336]}}],"value":null}'
    plan = parse_plan(text, codec).plan
    assert plan.actions[0].params == {"box": [0.25, 0.5, 0.75, 0.75]}
    assert plan.reasoning == "near [0.5, 0.5, 1, 1]"
    assert parse_plan(text).plan.actions[0].params == {"box": [224, 224, 672, 336]}  # no codec: as written


def test_the_tiny_qwen_agent_runs_a_pixel_plan_with_the_normalised_box(qwen):
    model, processor = qwen
    segmenter = BoxSegmenter()
    think = (
        '{"reasoning":"Segment it.","actions":[{"tool":"segment_box","params":{"box":[112,224,336,336]}}],"value":null}'
    )
    answer = '{"reasoning":"From the tool output.","actions":[],"value":"It is at [112, 224, 336, 336]."}'
    scripts = Scripts(processor.tokenizer, [think, answer])
    pilot = GeoPilot(model, processor, ToolRegistry([segmenter]), session_factory=scripts)
    pieces: list[str] = []  # the answer streamed in 5-character pieces, boxes cut across them
    image = Image.new("RGB", (448, 448), (90, 120, 60))
    result = pilot.chat(image, "Segment the plane in the lower half.", stream=pieces.append)
    assert result.outcome == "tools" and result.error is None
    assert segmenter.received == [tuple(BOX)]  # the tool got the normalised box
    assert '"box":[112,224,336,336],"score":0.9' in scripts.fed[0][0]  # the model read its output in pixels
    assert result.answer == "It is at [0.25, 0.5, 0.75, 0.75]."  # and the chat speaks the trace's boxes
    assert "".join(pieces) == result.answer and len(pieces) > 1
    assert result.messages[1].actions[0].params == {"box": BOX}
    assert result.tool_calls[0].params == {"box": BOX}


def test_qwens_plan_grammar_decodes_box_params_as_whole_pixels():
    import xgrammar

    from geopilot.agent.plan_schema import _byte_vocabulary

    params = json.dumps(BoxSegmenter.params_model.model_json_schema())
    constraint = PlanConstraint(("segment_box",), params=(("segment_box", params),))
    compiler = xgrammar.GrammarCompiler(_byte_vocabulary())
    pixels = '{"reasoning":"r","actions":[{"tool":"segment_box","params":{"box":[112,224,336,336]}}],"value":null}'
    unit = '{"reasoning":"r","actions":[{"tool":"segment_box","params":{"box":[0.25,0.5,0.75,0.75]}}],"value":null}'
    qwen_schema = plan_json_schema(constraint, qwen2_5_vl.BOX_SCHEMA)
    llava_schema = plan_json_schema(constraint, llava.BOX_SCHEMA)
    assert _complete(compiler, qwen_schema, pixels) and not _complete(compiler, qwen_schema, unit)
    assert _complete(compiler, llava_schema, unit)
    assert llava_schema == plan_json_schema(constraint)  # LLaVA: the tool's own schema


def _complete(compiler, schema: dict, text: str) -> bool:
    """Whether the grammar of `schema` accepts `text` as a whole plan."""
    import xgrammar

    grammar = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=SEPARATORS)
    matcher = xgrammar.GrammarMatcher(grammar, terminate_without_stop_token=True)
    return matcher.accept_string(text) and matcher.is_terminated()


def test_client_run_tools_get_normalised_boxes_and_their_results_are_read_in_pixels(qwen):
    """The OpenAI tool protocol's side: a Qwen plan's pixel box is handed to the client normalised (outcome
    `tool_calls`), and the client's normalised result is rendered in pixels for the answer turn."""
    from geopilot.agent import ClientTools
    from geopilot.sample import ToolMessage

    model, processor = qwen
    think = (
        '{"reasoning":"Segment it.","actions":[{"tool":"segment_box","params":{"box":[112,224,336,336]}}],"value":null}'
    )
    answer = '{"reasoning":"From the tool output.","actions":[],"value":"It is at [112, 224, 336, 336]."}'
    image = Image.new("RGB", (448, 448), (90, 120, 60))
    client = ClientTools(("segment_box",))
    scripts = Scripts(processor.tokenizer, [think])
    pilot = GeoPilot(model, processor, ToolRegistry([BoxSegmenter()]), session_factory=scripts)
    handed = pilot.chat(image, "Segment the plane in the lower half.", client_tools=client)
    assert handed.outcome == "tool_calls" and handed.messages[-1].actions[0].params == {"box": BOX}
    result = ToolOutput(detections=[Detection(label="plane", box=BOX, score=0.9)])
    history = [*handed.messages, ToolMessage(name="segment_box", content=result)]
    pilot.engine.session_factory = Scripts(processor.tokenizer, [answer])
    answered = pilot.chat(image, None, history=history, client_tools=client)
    prompt = processor.tokenizer.decode(pilot.engine.session_factory.sessions[-1].prompts[0])
    assert '"params":{"box":[112,224,336,336]}' in prompt and '"box":[112,224,336,336],"score":0.9' in prompt
    assert answered.answer == "It is at [0.25, 0.5, 0.75, 0.75]."


BOXY = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(
            st.sampled_from(["reasoning", "actions", "value", "tool", "params", "box", "boxes"]), inner, max_size=4
        )
    ),
    max_leaves=24,
)


@settings(max_examples=300, deadline=None)
@given(BOXY)
def test_the_parse_contract_holds_with_a_box_codec(obj):
    """Whatever the model writes (NaN and huge numbers in boxes included), a plan or PlanParseError."""
    codec = qwen2_5_vl.box_codec(None, 896, 448)  # no processor: Qwen's default resize
    try:
        parsed = parse_plan(json.dumps(obj), codec)
    except PlanParseError:
        return
    assert isinstance(parsed.plan, AssistantMessage)


def test_inspect_shows_a_qwen_models_boxes_in_pixels(qwen_dir, tmp_path, capsys):
    from geopilot.cli import main

    Image.new("RGB", (500, 300), (90, 120, 60)).save(tmp_path / "scene.png")
    (tmp_path / "samples.jsonl").write_text(json.dumps(box_sample()) + "\n")
    assert main(["inspect", "--data", str(tmp_path / "samples.jsonl"), "--model", str(qwen_dir), "--json"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert '"box":[126,154,378,231],"score":0.9' in row["text"]  # resized to 504 x 308
    assert row["trained_segments"][-1].startswith(
        '{"reasoning":"From the tool output.","actions":[],"value":"The plane is at [126, 154, 378, 231]."}'
    )
