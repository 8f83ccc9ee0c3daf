"""The task-level registry: config validation, the ten tools and their schemas, and bad calls through the dispatcher."""

from __future__ import annotations

import pytest
from PIL import Image
from pydantic import ValidationError

from geopilot.errors import ConfigError
from geopilot.image import load_image
from geopilot.sample import Action
from geopilot.tool_output import Detection, ToolOutput
from geopilot.tool_protocol import Tool, ToolRegistry
from geopilot.tools.registry import BACKENDS, ToolsConfig, build_registry, load_tools_config
from geopilot.tools.task_tools import TASKS, TASKS_BY_NAME, LazyBackend, LazyModel, TaskTool

DESIGN_TABLE = {  # docs/design.md §4: tool -> (backend, modality, required params)
    "detect_objects": ("lae_dino", "optical", ["categories"]),
    "detect_all": ("lae_dino", "optical", []),
    "ground": ("remotesam", "optical", ["expression"]),
    "segment_semantic": ("segearth_ov", "optical", ["classes"]),
    "segment_instances": ("remotesam", "optical", ["categories"]),
    "segment_referring": ("remotesam", "optical", ["expression"]),
    "extract_roads": ("sam_road", "optical", []),
    "remove_clouds": ("spa_gan", "optical", []),
    "sar_detect_all": ("denodet", "sar", []),
    "sar_ground": ("lae_dino", "sar", ["expression"]),
    "detect_changes": ("bit_cd", "optical", []),
}


@pytest.fixture
def image():
    return load_image(Image.new("RGB", (32, 24), (90, 120, 60)))


class _RecordingBackend:
    def __init__(self, output: ToolOutput):
        self.output, self.calls = output, []

    def run(self, tool, image, params):
        self.calls.append((tool, params))
        return self.output


def _registry_with(tool_name: str, backend, max_pixels: int = 10**8) -> ToolRegistry:
    return ToolRegistry([TaskTool(TASKS_BY_NAME[tool_name], backend, "test", max_pixels)], timeout_s=10)


def test_default_config_binds_the_design_table():
    config = load_tools_config()
    registry = build_registry(config=config)
    assert registry.names() == list(DESIGN_TABLE)
    for schema in registry.schemas():
        backend, modality, required = DESIGN_TABLE[schema["name"]]
        assert config.tools[schema["name"]].backend == backend
        assert schema["modality"] == modality
        assert schema["input_schema"].get("required", []) == required
        assert schema["input_schema"]["additionalProperties"] is False
        assert schema["description"].endswith(".")
    assert all(isinstance(tool, Tool) for tool in registry)


@pytest.mark.parametrize(
    ("load", "override", "message"),
    [
        (load_tools_config, "tools.detect_everything.backend=lae_dino", "unknown tools"),
        (load_tools_config, "tools.detect_objects.backend=yolo", "unknown backend 'yolo'"),
        (load_tools_config, "tools.ground.backend=spa_gan", "'spa_gan' cannot serve 'ground'"),
        (load_tools_config, "tools.ground.weigths=x", "misspelt"),
        (build_registry, "tools.remove_clouds.options.variant=RICE9", "tools.remove_clouds.options: variant"),
        (build_registry, "tools.detect_objects.options.tile_overlap=2000", "tile_overlap"),
    ],
)
def test_config_errors_name_the_key(load, override, message):
    with pytest.raises(ConfigError, match=message):
        load(overrides=[override])


def test_an_options_error_is_one_clean_line_even_from_pydantic_itself():
    data = load_tools_config().model_dump()
    data["tools"]["detect_objects"]["options"] = {"model": {"box_treshold": 0.3}}
    with pytest.raises(ValidationError) as err:
        ToolsConfig.model_validate(data)
    assert err.value.errors()[0]["msg"] == "tools.detect_objects.options: model.box_treshold: unknown key (misspelt?)"
    with pytest.raises(ConfigError) as loaded:
        load_tools_config(overrides=["tools.detect_objects.options.model.box_treshold=0.3"])
    assert str(loaded.value).endswith(": tools.detect_objects.options: model.box_treshold: unknown key (misspelt?)")
    assert "Value error" not in str(loaded.value) and "\n" not in str(loaded.value)


@pytest.mark.parametrize(
    ("tool", "params", "field"),
    [
        ("detect_objects", {}, "categories: Field required"),
        ("detect_objects", {"categories": []}, "categories: List should have at least 1 item"),
        ("detect_objects", {"categories": ["  "]}, "categories.0: String should have at least 1 character"),
        ("detect_objects", {"categories": ["ship"], "colour": "red"}, "colour: unexpected parameter"),
        (
            "detect_objects",
            {"categories": ["ship"], "score_threshold": 2},
            "score_threshold: Input should be less than",
        ),
        ("ground", {"expression": ""}, "expression: String should have at least 1 character"),
        ("segment_semantic", {"classes": "water"}, "classes: Input should be a valid list"),
        ("remove_clouds", {"variant": "RICE2"}, "variant: unexpected parameter"),
    ],
)
def test_bad_params_are_rejected_naming_the_field(tool, params, field, image):
    backend = _RecordingBackend(ToolOutput())
    result = _registry_with(tool, backend).call(Action(tool=tool, params=params), image)
    assert result.error_kind == "invalid_params" and field in result.error
    assert backend.calls == []


def test_unknown_tool_and_wrong_modality(image):
    registry = build_registry()
    unknown = registry.call(Action(tool="count_cars", params={}), image)
    assert unknown.error_kind == "unknown_tool" and "detect_objects" in unknown.error
    wrong = registry.call(Action(tool="sar_ground", params={"expression": "the ship"}), image, modality="optical")
    assert wrong.error_kind == "wrong_modality"


def test_repeated_categories_are_collapsed():
    params = TASKS_BY_NAME["detect_objects"].params_model.model_validate({"categories": ["Ship", "ship", " plane "]})
    assert params.categories == ["Ship", "plane"]


def test_out_of_range_box_from_a_backend_never_reaches_the_llm(image):
    # model_construct skips validation, as a buggy backend building raw objects would
    bad = ToolOutput.model_construct(detections=[Detection.model_construct(label="ship", box=(0.2, 0.1, 1.4, 0.5))])
    result = _registry_with("detect_objects", _RecordingBackend(bad)).call(
        Action(tool="detect_objects", params={"categories": ["ship"]}), image
    )
    assert result.output is None and result.error_kind == "invalid_output"
    assert "outside [0, 1]" in result.error
    flipped = ToolOutput.model_construct(detections=[Detection.model_construct(label="ship", box=(0.5, 0.1, 0.2, 0.5))])
    result = _registry_with("detect_objects", _RecordingBackend(flipped)).call(
        Action(tool="detect_objects", params={"categories": ["ship"]}), image
    )
    assert result.error_kind == "invalid_output" and "x1 < x2" in result.error
    outside = ToolOutput.model_construct(
        detections=[
            Detection.model_construct(
                label="ship", box=(0.1, 0.1, 0.2, 0.2), polygon=[(0.1, 0.1), (1.2, 0.1), (0.1, 0.2)]
            )
        ]
    )
    result = _registry_with("detect_objects", _RecordingBackend(outside)).call(
        Action(tool="detect_objects", params={"categories": ["ship"]}), image
    )
    assert result.error_kind == "invalid_output" and "1.2 is outside [0, 1]" in result.error


def test_backend_without_weights_is_a_clear_error_in_the_result(image, tmp_path, monkeypatch):
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(tmp_path))
    result = build_registry().call(Action(tool="extract_roads", params={}), image)
    assert not result.ok and result.error_kind == "tool_error"
    assert "weights not found: put sam_road/cityscale_vitb_512_e10.ckpt at" in result.error


def test_missing_weights_are_reported_at_call_time(image, tmp_path, monkeypatch):
    monkeypatch.setenv("GEOPILOT_WEIGHTS_DIR", str(tmp_path))
    registry = build_registry()  # building needs no weights
    result = registry.call(Action(tool="remove_clouds", params={}), image)
    assert result.error_kind == "tool_error"
    assert f"weights not found: put spa_gan/RICE1/gen_model_epoch_200.pth at {tmp_path}" in result.error


def test_image_over_the_configured_limit_is_refused(image):
    backend = _RecordingBackend(ToolOutput())
    result = _registry_with("detect_all", backend, max_pixels=32 * 24 - 1).call(Action(tool="detect_all"), image)
    assert result.error_kind == "tool_error" and "exceeds the tools limit of 767" in result.error
    assert backend.calls == []


def test_backends_load_lazily_once_and_are_shared(image):
    built = []

    def factory():
        built.append(1)
        return _RecordingBackend(ToolOutput(message="ok"))

    model = LazyModel("fake", factory)
    tools = [
        TaskTool(spec, LazyBackend(model, lambda m: m), "fake", 10**8)
        for spec in TASKS
        if set(spec.params_model.model_fields) <= {"image"}  # every tool takes an optional image reference
    ]
    registry = ToolRegistry(tools)
    assert built == [] and len(registry) == 2
    for name in registry.names():
        assert registry.call(Action(tool=name), image).ok
        assert registry.call(Action(tool=name), image).ok
    assert built == [1]


def test_detect_tools_share_one_model():
    registry = build_registry()
    assert registry.get("detect_objects").backend.model is registry.get("detect_all").backend.model
    assert registry.get("sar_ground").backend.model is not registry.get("detect_objects").backend.model  # SAR weights


def test_every_backend_names_tasks_that_exist():
    for spec in BACKENDS.values():
        assert spec.tasks <= set(TASKS_BY_NAME)


def test_importing_and_building_the_default_registry_imports_no_torch():
    """The registry is lazy: building it (the CLI's `tools list`, the MCP schema listing, data_gen validation) reads
    configs/tools.yaml only; torch and every specialist's module load on a tool's first call."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "import geopilot.tools.registry as registry\n"
        "assert 'torch' not in sys.modules, 'import geopilot.tools.registry imported torch'\n"
        "assert not [m for m in sys.modules if m.startswith('geopilot.data_gen')], 'the tool layer imports data_gen'\n"
        "registry.build_registry()\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'open_clip') if m in sys.modules)\n"
        "assert not heavy, f'build_registry() imported {heavy}'\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
