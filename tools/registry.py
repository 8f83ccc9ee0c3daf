"""The task-level tool registry: `configs/tools.yaml` -> a `geopilot.tool_protocol.ToolRegistry` of the task tools.

    registry = build_registry()                                  # configs/tools.yaml, weights loaded on first call
    registry = build_registry(overrides=["device=cpu", "tools.remove_clouds.options.variant=RICE2"])
    registry = build_registry(annotations=record)                # ground truth for data_gen (provenance=annotations)
    registry = annotation_registry(record, root)                 # the same, without reading configs/tools.yaml

`BACKENDS` below is the one place that says which specialist model serves which tools and how it is built.
Backend modules are imported inside their constructor functions, so the registry builds without them
(and without any weights); a missing backend or missing weights is a clear error at call time, in `ToolResult`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from geopilot.argtypes import output_folder_problem
from geopilot.artifacts import artifacts_dir as resolve_artifacts_dir
from geopilot.config import StrictConfig, describe_validation_error, load_config
from geopilot.errors import ConfigError, GeoPilotInputError, WeightsError
from geopilot.image import DEFAULT_MAX_PIXELS
from geopilot.records import AnnotationRecord
from geopilot.tool_protocol import ToolRegistry
from geopilot.tools.adapters import (
    BitCdOptions,
    ChangeDetectorAdapter,
    CloudRemovalAdapter,
    DetectorAdapter,
    DetectorOptions,
    ExampleAnnotationsOptions,
    MaskSegmenterAdapter,
    RemoteSamOptions,
    RoadExtractorAdapter,
    SamRoadOptions,
    SarDetectorOptions,
    SegmenterAdapter,
    SegmenterOptions,
    SpaGanOptions,
)
from geopilot.tools.task_tools import TASKS, TASKS_BY_NAME, Backend, LazyBackend, LazyModel, TaskTool
from geopilot.tools.weight_files import BIT_CD_CHECKPOINT, SPA_GAN_CHECKPOINT
from geopilot.tools.weights import pick_device, resolve_weights

DEFAULT_TIMEOUT_S = 120.0  # per tool call
# configs/ ships inside the distribution as `geopilot.configs`, so the default works from a wheel too.
DEFAULT_CONFIG = Path(str(resources.files("geopilot.configs") / "tools.yaml"))
EXAMPLES_CONFIG = Path(str(resources.files("geopilot.configs") / "tools_examples.yaml"))  # no weights needed


class ToolBinding(StrictConfig):
    backend: str
    weights: str | None = None  # explicit file or folder; else $GEOPILOT_WEIGHTS_DIR/<weights_name or backend>/
    weights_name: str | None = None  # folder name under $GEOPILOT_WEIGHTS_DIR when it differs from the backend's
    options: dict[str, Any] = {}
    # "thread": cooperative cancellation (GPU-safe, the default); "process": a forked worker killed on timeout (CPU
    # only, for a backend without cancellation points). geopilot/tool_protocol.py explains both.
    isolation: Literal["thread", "process"] = "thread"


class ToolsConfig(StrictConfig):
    device: str = "auto"  # "auto" = CUDA when present
    timeout_s: float = Field(DEFAULT_TIMEOUT_S, gt=0)
    max_pixels: int = Field(DEFAULT_MAX_PIXELS, ge=1)  # larger images are refused by every tool
    artifacts_dir: str | None = None  # where restored images go; default: a private per-process folder (0700)
    # Folders whose files the MCP server (and `geopilot serve`) may read as images; none by default, so those
    # accept inline image bytes only. The CLI on the user's own files does not use this (geopilot/image_access.py).
    image_roots: list[str] = []
    bands: list[int] | None = None  # band numbers shown as R, G, B (or one, grey); None: geopilot.bands decides
    tools: dict[str, ToolBinding]

    @field_validator("artifacts_dir")
    @classmethod
    def _a_folder_to_write(cls, path: str | None) -> str | None:
        problem = None if path is None else output_folder_problem(path)
        if problem:
            raise ValueError(problem)
        return path

    @model_validator(mode="after")
    def _binds_the_ten_tools(self) -> ToolsConfig:
        unknown = sorted(set(self.tools) - set(TASKS_BY_NAME))
        missing = [name for name in TASKS_BY_NAME if name not in self.tools]
        if unknown:
            raise _config_problem(f"unknown tools {unknown}; the task-level tools are {list(TASKS_BY_NAME)}")
        if missing:
            raise _config_problem(f"no binding for tools {missing}")
        for name, binding in self.tools.items():
            spec = BACKENDS.get(binding.backend)
            if spec is None:
                raise _config_problem(
                    f"tools.{name}.backend: unknown backend {binding.backend!r}; known: {list(BACKENDS)}"
                )
            if name not in spec.tasks:
                raise _config_problem(
                    f"tools.{name}.backend: {binding.backend!r} cannot serve {name!r} (it serves {sorted(spec.tasks)})"
                )
            try:  # typed options (a misspelt key fails here, when the config loads, not at the first call)
                backend_options(name, binding)
            except ConfigError as err:
                raise _config_problem(str(err)) from None
        return self


def _config_problem(message: str) -> PydanticCustomError:
    """A tools-config problem whose pydantic message is exactly `message` (no "Value error, " prefix), one line."""
    return PydanticCustomError("tools_config", "{message}", {"message": message})


@dataclass(frozen=True)
class BackendSpec:
    tasks: frozenset[str]  # task-level tools this backend can serve
    options_model: type[StrictConfig]
    load: Callable[[Path, str, Any], Any]  # (weights, device, options) -> model
    adapt: Callable[[Any, Any, Path], Backend]  # (model, options, artifacts_dir) -> the backend of one tool
    load_key: Callable[[Any], str] = lambda options: ""  # the options that change what is loaded
    weights_file: Callable[[Any], str | None] = lambda options: None  # file under the weights folder, if one
    precision: Callable[[Any], str] = lambda options: options.precision  # the configured `precision` setting
    needs_weights: bool = True  # False: the annotation-backed example tools


def _load_examples(weights: None, device: str, options):
    from geopilot.tools.example_images import ExampleAnnotationsBackend, ExampleSet, annotations_file

    return ExampleAnnotationsBackend(ExampleSet.read(annotations_file(options.annotations)))


def _load_lae_dino(weights: Path, device: str, options: DetectorOptions):
    from geopilot.tools.lae_dino import LaeDino

    return LaeDino.from_weights(str(weights), device=device, **options.model.model_dump())


def _load_segearth_ov(weights: Path, device: str, options: SegmenterOptions):
    from geopilot.tools.segearth_ov import SegEarthOV

    return SegEarthOV.from_weights(str(weights), device=device, **options.model)


def _load_spa_gan(weights: Path, device: str, options: SpaGanOptions):
    from geopilot.tools.spa_gan import SpaGan

    return SpaGan.from_weights(weights, device=device, precision=options.precision, tile_size=options.tile_size)


def _load_bit_cd(weights: Path, device: str, options: BitCdOptions):
    from geopilot.tools.bit_cd import BitCd

    return BitCd.from_weights(weights, device=device, precision=options.precision)


def _load_remotesam(weights: Path, device: str, options: RemoteSamOptions):
    from geopilot.tools.remotesam import RemoteSam

    return RemoteSam.from_weights(weights, device=device, **options.model_dump())


def _load_sam_road(weights: Path, device: str, options: SamRoadOptions):
    from geopilot.tools.sam_road import SamRoad

    return SamRoad.from_weights(weights, device=device, **options.model_dump())


def _sam_road_checkpoint(options: SamRoadOptions) -> str:
    from geopilot.tools.sam_road_graph import PRESETS  # torch-free

    return PRESETS[options.preset].checkpoint


def _load_denodet(weights: Path, device: str, options: SarDetectorOptions):
    from geopilot.tools.denodet import DenoDet

    return DenoDet.from_weights(weights, device=device, **options.model.model_dump())


def _model_options(options) -> str:
    model = options.model.model_dump(mode="json") if isinstance(options.model, StrictConfig) else options.model
    return json.dumps(model, sort_keys=True, default=str)


def _detector(tasks: set[str], options_model: type[StrictConfig], load: Callable[[Path, str, Any], Any]) -> BackendSpec:
    """A detector backend (LAE-DINO, DenoDet): served through `DetectorAdapter`; its model options decide the load."""
    return BackendSpec(
        tasks=frozenset(tasks),
        options_model=options_model,
        load=load,
        adapt=lambda model, options, artifacts_dir: DetectorAdapter(model, options),
        load_key=_model_options,
        precision=lambda options: options.model.precision,
    )


# backend name -> what it serves and how it is built.
BACKENDS: dict[str, BackendSpec] = {
    "lae_dino": _detector(
        {"detect_objects", "detect_all", "ground", "sar_detect_all", "sar_ground"}, DetectorOptions, _load_lae_dino
    ),
    "segearth_ov": BackendSpec(
        tasks=frozenset({"segment_semantic"}),
        options_model=SegmenterOptions,
        load=_load_segearth_ov,
        adapt=lambda model, options, artifacts_dir: SegmenterAdapter(model, options),
        load_key=_model_options,
        precision=lambda options: options.model.get("precision", "fp32"),  # validated when the model loads
    ),
    "spa_gan": BackendSpec(
        tasks=frozenset({"remove_clouds"}),
        options_model=SpaGanOptions,
        load=_load_spa_gan,
        adapt=lambda model, options, artifacts_dir: CloudRemovalAdapter(model, artifacts_dir),
        load_key=lambda options: f"{options.variant}/{options.precision}/{options.tile_size}",
        weights_file=lambda options: f"{options.variant}/{SPA_GAN_CHECKPOINT}",
    ),
    "bit_cd": BackendSpec(
        tasks=frozenset({"detect_changes"}),
        options_model=BitCdOptions,
        load=_load_bit_cd,
        adapt=lambda model, options, artifacts_dir: ChangeDetectorAdapter(model, artifacts_dir),
        load_key=lambda options: options.precision,
        weights_file=lambda options: BIT_CD_CHECKPOINT,
    ),
    "remotesam": BackendSpec(
        tasks=frozenset({"ground", "segment_instances", "segment_referring", "segment_semantic"}),
        options_model=RemoteSamOptions,
        load=_load_remotesam,
        adapt=lambda model, options, artifacts_dir: MaskSegmenterAdapter(model),
        load_key=lambda options: options.model_dump_json(),
        weights_file=lambda options: "checkpoint.pth",  # geopilot.tools.remotesam.CHECKPOINT
    ),
    "sam_road": BackendSpec(
        tasks=frozenset({"extract_roads"}),
        options_model=SamRoadOptions,
        load=_load_sam_road,
        adapt=lambda model, options, artifacts_dir: RoadExtractorAdapter(model),
        load_key=lambda options: options.model_dump_json(),
        weights_file=_sam_road_checkpoint,
    ),
    "denodet": _detector({"sar_detect_all"}, SarDetectorOptions, _load_denodet),
    # configs/tools_examples.yaml: the example images' annotations answer (no weights; geopilot.tools.example_images)
    "annotations": BackendSpec(
        tasks=frozenset(TASKS_BY_NAME),
        options_model=ExampleAnnotationsOptions,
        load=_load_examples,
        adapt=lambda model, options, artifacts_dir: model,
        load_key=lambda options: options.annotations,
        precision=lambda options: "-",
        needs_weights=False,
    ),
}


def load_tools_config(config_path: str | Path | None = None, overrides: list[str] | None = None) -> ToolsConfig:
    return load_config(ToolsConfig, config_path if config_path is not None else DEFAULT_CONFIG, overrides)


def backend_options(name: str, binding: ToolBinding) -> StrictConfig:
    """The binding's options, typed by its backend; a problem is one line naming `tools.<name>.options.<key>`."""
    try:
        return BACKENDS[binding.backend].options_model.model_validate(binding.options)
    except ValidationError as err:
        raise ConfigError(describe_validation_error(err, f"tools.{name}.options")) from None


def weights_path(binding: ToolBinding, options: StrictConfig) -> Path:
    """Where this binding's weights are (raises WeightsError saying where to put them)."""
    spec = BACKENDS[binding.backend]
    path = resolve_weights(binding.weights_name or binding.backend, binding.weights, spec.weights_file(options))
    _, checks = binding_files(binding, options)
    problems = [check.problem for check in checks if check.problem]
    if problems:  # the same list `tools list` shows: nothing is loaded from a folder that lacks a file
        raise WeightsError(f"weights not found for {binding.backend!r}: " + "; ".join(problems))
    return path


def binding_precision(binding: ToolBinding) -> dict[str, str]:
    """`precision` (configured; CUDA only, CPU runs fp32) and `upstream_precision` for `geopilot tools list`."""
    from geopilot.tools.precision import PRECISIONS

    options = BACKENDS[binding.backend].options_model.model_validate(binding.options)
    if not BACKENDS[binding.backend].needs_weights:
        return {"precision": "-", "upstream_precision": "-"}
    return {
        "precision": BACKENDS[binding.backend].precision(options),
        "upstream_precision": PRECISIONS[binding.backend].upstream,
    }


def binding_files(binding: ToolBinding, options: StrictConfig, hashes: bool = False) -> tuple[Path | None, list]:
    """(the binding's weights folder, a FileCheck per file it loads); folder None when $GEOPILOT_WEIGHTS_DIR is
    unset and no `weights:` is given."""
    from geopilot.tools.weight_files import check_files
    from geopilot.tools.weights import weights_root

    given_file = None
    if binding.weights is not None:
        folder = Path(binding.weights).expanduser()
        if folder.is_file():
            folder, given_file = folder.parent, folder
    else:
        root = weights_root()
        if root is None:
            return None, []
        folder = root / (binding.weights_name or binding.backend)
    return folder, check_files(binding.backend, options, folder, given_file, hashes)


def binding_status(binding: ToolBinding) -> tuple[str, str | None]:
    """(`ready` | `weights missing`, what is missing and where it goes) for `geopilot tools list`: every file the
    backend loads must be there (`geopilot.tools.weight_files`)."""
    options = BACKENDS[binding.backend].options_model.model_validate(binding.options)
    if not BACKENDS[binding.backend].needs_weights:
        from geopilot.tools.example_images import annotations_file

        annotations = annotations_file(options.annotations)
        return ("ready", None) if annotations.is_file() else ("annotations missing", f"{annotations} does not exist")
    try:
        weights_path(binding, options)
    except GeoPilotInputError as err:
        return "weights missing", str(err)
    return "ready", None


def _artifacts_dir(config: ToolsConfig) -> Path:
    """The configured folder, or this process's private one (mode 0700; geopilot.artifacts)."""
    return resolve_artifacts_dir(config.artifacts_dir)


def annotation_registry(
    record: AnnotationRecord,
    root: str | Path | None = None,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> ToolRegistry:
    """The ten task-level tools, every one answering from `record` (ground truth, provenance "annotations").

    What data_gen validates plans with and calls tools through; it needs no tools config (no specialist is bound)."""
    from geopilot.tools.annotations import AnnotationBackend

    truth = AnnotationBackend(record, root=root)
    return ToolRegistry([TaskTool(spec, truth, "annotations", max_pixels) for spec in TASKS], timeout_s)


def build_registry(
    config_path: str | Path | None = None,
    overrides: list[str] | None = None,
    annotations: AnnotationRecord | None = None,
    *,
    config: ToolsConfig | None = None,
    annotations_root: str | Path | None = None,
) -> ToolRegistry:
    """The ten task-level tools as a ToolRegistry. With `annotations`, every tool answers from that record."""
    config = config if config is not None else load_tools_config(config_path, overrides)
    if annotations is not None:
        return annotation_registry(
            annotations, annotations_root, max_pixels=config.max_pixels, timeout_s=config.timeout_s
        )

    models: dict[tuple, LazyModel] = {}  # one model in memory per (backend, weights, load options)
    tools = []
    for spec in TASKS:
        binding = config.tools[spec.name]
        tools.append(
            TaskTool(
                spec,
                _backend(binding, backend_options(spec.name, binding), config, models),
                binding.backend,
                config.max_pixels,
                isolation=binding.isolation,
            )
        )
    return ToolRegistry(tools, config.timeout_s)


def _backend(
    binding: ToolBinding, options: StrictConfig, config: ToolsConfig, models: dict[tuple, LazyModel]
) -> Backend:
    spec = BACKENDS[binding.backend]
    key = (binding.backend, binding.weights, binding.weights_name, spec.load_key(options))
    if key not in models:
        models[key] = LazyModel(
            binding.backend,
            lambda: spec.load(
                weights_path(binding, options) if spec.needs_weights else None, str(pick_device(config.device)), options
            ),
        )
    # the artefact folder is resolved when the adapter is built (first call), so a registry alone makes no folder
    return LazyBackend(models[key], lambda model: spec.adapt(model, options, _artifacts_dir(config)))
