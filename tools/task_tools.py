"""The task-level tools the model emits (docs/design.md §4): input models, descriptions, and the Tool that runs them.

A `TaskTool` is a `geopilot.tool_protocol.Tool`: it checks the image size, asks its backend (loaded on first use)
for the canonical output, and adds RFC 7946 GeoJSON (WGS 84) when the image is georeferenced (`geopilot.tools.geo`). Which backend
serves which tool is configuration (`configs/tools.yaml`, built by `geopilot.tools.registry.build_registry`).
A backend is anything with `run(tool_name, image, params) -> ToolOutput`.

Every tool takes an optional `image`: `"result:N"` runs it on the image artefact of the chat's call N (a chain:
remove_clouds, then detect_objects on the restored image); segment_semantic takes `objects: "result:N"` and says how
many of call N's objects lie inside / outside each class region (docs/chains.md). The registry resolves both.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, WithJsonSchema

from geopilot.cancellation import check_cancelled
from geopilot.errors import ImageInputError
from geopilot.loaded_image import LoadedImage
from geopilot.sample import Modality
from geopilot.tool_chains import (
    IMAGE_REFERENCE_SCHEMA,
    REFERENCE_HELP,
    REFERENCE_SCHEMA,
    InputImages,
    check_image_reference,
    check_reference,
)
from geopilot.tool_output import Detection, ToolOutput
from geopilot.tools.geo import to_geojson


def _text(max_length: int) -> WithJsonSchema:
    """The schema of a stripped, non-empty text: what validates, so a plan decoded in it validates too (xgrammar
    ignores min/maxLength beside a pattern: the pattern holds the length)."""
    return WithJsonSchema({"type": "string", "pattern": rf"^\S[\s\S]{{0,{max_length - 1}}}$"})


Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100), _text(100)]
Expression = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=500), _text(500)]
MAX_CATEGORIES = 60  # LAE-DINO's dynamic vocabulary size in training (DVC)


def _unique(names: list[str]) -> list[str]:
    """Drop repeats (case-insensitive), keeping the first spelling and the order."""
    seen: dict[str, str] = {}
    for name in names:
        seen.setdefault(name.lower(), name)
    return list(seen.values())


Names = Annotated[list[Name], Field(min_length=1, max_length=MAX_CATEGORIES), AfterValidator(_unique)]
Threshold = Annotated[
    float | None, Field(ge=0.0, le=1.0, description="minimum score to keep; backend default if omitted")
]


Reference = Annotated[Annotated[str, WithJsonSchema(REFERENCE_SCHEMA)] | None, AfterValidator(check_reference)]
ImageReference = Annotated[
    Annotated[str, WithJsonSchema(IMAGE_REFERENCE_SCHEMA)] | None, AfterValidator(check_image_reference)
]


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    image: ImageReference = Field(default=None, description=REFERENCE_HELP["image"], examples=["result:1", "input:2"])


class DetectObjectsParams(_Params):
    categories: Names = Field(description="object categories to find, e.g. ['plane', 'storage tank']")
    score_threshold: Threshold = None


class DetectAllParams(_Params):
    score_threshold: Threshold = None


class GroundParams(_Params):
    expression: Expression = Field(description="a referring expression, e.g. 'the largest ship near the dock'")


class SegmentSemanticParams(_Params):
    classes: Names = Field(description="land-cover classes to segment, e.g. ['water', 'building', 'tree']")
    objects: Reference = Field(
        default=None, description=REFERENCE_HELP["objects"] + "; the output counts them inside / outside each class"
    )


class SegmentInstancesParams(_Params):
    categories: Names = Field(description="object categories to segment instance by instance")
    score_threshold: Threshold = None


class SegmentReferringParams(_Params):
    expression: Expression = Field(description="a referring expression naming the region or object to segment")


class NoParams(_Params):
    pass


class SarDetectAllParams(_Params):
    score_threshold: Threshold = None


class SarGroundParams(_Params):
    expression: Expression = Field(description="a referring expression for an object in the SAR image")


class DetectChangesParams(BaseModel):
    """Two images by position (the chat's images 1 and 2: before, after, unless `images` names others)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    images: InputImages
    classes: Annotated[Names | None, Field(description="change classes to keep, e.g. ['building']; omit for all")] = (
        None
    )


@dataclass(frozen=True)
class TaskSpec:
    name: str
    description: str
    modality: Modality
    params_model: type[BaseModel]
    image_count: int = 1  # how many of the chat's images the tool reads, in order (geopilot.tool_protocol)


# The task-level tools, in docs/design.md §4 order. Names and params are what the model is trained to emit.
TASKS: list[TaskSpec] = [
    TaskSpec(
        "detect_objects",
        "Detect objects of the given categories; returns labelled boxes.",
        "optical",
        DetectObjectsParams,
    ),
    TaskSpec(
        "detect_all",
        "Detect every object of a fixed remote-sensing vocabulary; returns labelled boxes.",
        "optical",
        DetectAllParams,
    ),
    TaskSpec(
        "ground", "Locate the object(s) a referring expression describes; returns their boxes.", "optical", GroundParams
    ),
    TaskSpec(
        "segment_semantic",
        "Segment the image into the given land-cover classes; returns the area fraction of each class.",
        "optical",
        SegmentSemanticParams,
    ),
    TaskSpec(
        "segment_instances",
        "Segment each object of the given categories; returns boxes, areas and masks.",
        "optical",
        SegmentInstancesParams,
    ),
    TaskSpec(
        "segment_referring",
        "Segment the region a referring expression describes; returns its box, area and mask.",
        "optical",
        SegmentReferringParams,
    ),
    TaskSpec(
        "extract_roads", "Extract the road network; returns a graph of road nodes and edges.", "optical", NoParams
    ),
    TaskSpec(
        "remove_clouds",
        "Remove clouds and haze from an optical image; returns the restored image.",
        "optical",
        NoParams,
    ),
    TaskSpec(
        "sar_detect_all",
        "Detect ships, aircraft, cars, tanks, bridges and harbors in a SAR image.",
        "sar",
        SarDetectAllParams,
    ),
    TaskSpec(
        "sar_ground",
        "Locate the object a referring expression describes in a SAR image; returns its box.",
        "sar",
        SarGroundParams,
    ),
    TaskSpec(
        "detect_changes",
        "Compare a before and an after image of the same place; returns the change mask, the changed fraction and "
        "the changed regions with boxes.",
        "optical",
        DetectChangesParams,
        image_count=2,
    ),
]
TASKS_BY_NAME: dict[str, TaskSpec] = {spec.name: spec for spec in TASKS}


class Backend(Protocol):
    # A backend of a several-image tool (TaskSpec.image_count > 1) is also given `images=[LoadedImage, ...]`.
    def run(self, tool: str, image: LoadedImage, params: BaseModel) -> ToolOutput: ...


class LazyModel:
    """A model loaded on first use (weights are read then, not when the registry is built), once, thread-safely.

    Tools bound to the same backend, weights and model options share one LazyModel (detect_objects and
    detect_all use one LAE-DINO in memory)."""

    def __init__(self, name: str, load: Callable[[], Any]):
        self.name = name
        self._load = load
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def get(self) -> Any:
        with self._lock:
            if self._model is None:
                self._model = self._load()
            return self._model


class LazyBackend:
    """A backend for one tool: its adapter is built around the shared model when the tool is first called."""

    def __init__(self, model: LazyModel, adapt: Callable[[Any], Backend]):
        self.model, self._adapt = model, adapt
        self._backend: Backend | None = None
        self._lock = threading.Lock()

    def get(self) -> Backend:
        model = self.model.get()
        with self._lock:
            if self._backend is None:
                self._backend = self._adapt(model)
            return self._backend

    def run(self, tool: str, image: LoadedImage, params: BaseModel, **images: list[LoadedImage]) -> ToolOutput:
        return self.get().run(tool, image, params, **images)


class TaskTool:
    """One task-level tool bound to one backend."""

    def __init__(self, spec: TaskSpec, backend: Backend, backend_name: str, max_pixels: int, isolation: str = "thread"):
        self.spec, self.isolation = spec, isolation  # isolation: how ToolRegistry.call stops it on timeout
        self.name, self.description = spec.name, spec.description
        self.modality, self.params_model = spec.modality, spec.params_model
        self.image_count = spec.image_count
        self.backend, self.backend_name, self.max_pixels = backend, backend_name, max_pixels

    def prepare(self) -> None:
        """Load the backend now (the CLI does this so missing weights are reported before anything runs)."""
        if isinstance(self.backend, LazyBackend):
            self.backend.get()

    def run(
        self,
        image: LoadedImage,
        params: BaseModel,
        objects: list[Detection] | None = None,
        images: list[LoadedImage] | None = None,
    ) -> ToolOutput:
        several = self._images(image, images)
        for each in several or [image]:
            width, height = each.scene_size
            if width * height > self.max_pixels:
                raise ImageInputError(
                    f"image of {width}x{height} = {width * height:,} pixels exceeds the tools limit of "
                    f"{self.max_pixels:,}"
                )
        check_cancelled()  # timed out while waiting for the model to load
        output = self.backend.run(self.name, image, params, **({"images": several} if several else {}))
        if image.georef is not None and (output.detections or output.roads is not None):
            output = output.model_copy(update={"geojson": to_geojson(output, image.georef, self.name)})
        if objects is not None:
            output = output.model_copy(update={"data": objects_in_regions(output, objects, params.objects)})
        return output

    def _images(self, image: LoadedImage, images: list[LoadedImage] | None) -> list[LoadedImage] | None:
        """A several-image tool's images (the registry passes exactly `image_count`; a direct caller may not):
        ImageInputError naming the missing one, or a pair of different sizes (`geopilot.image.check_same_size`)."""
        from geopilot.image import check_same_size

        if self.image_count == 1:
            return None
        given = list(images) if images else [image]
        if len(given) < self.image_count:
            raise ImageInputError(
                f"{self.name} reads {self.image_count} images (image 1 before, image 2 after); got {len(given)}: "
                f"image {len(given) + 1} is missing"
            )
        check_same_size(given)
        return given[: self.image_count]


def objects_in_regions(output: ToolOutput, objects: list[Detection], reference: str) -> dict:
    """How many of `objects` (an earlier detection call's) have their box centre inside / outside each class
    region of a segmentation `output`: the spatial answer of a detection + segmentation chain."""
    from geopilot.tools.canonical import rle_contains

    inside: dict[str, int] = {}
    for segment in output.segments:
        if segment.mask is None:
            raise ValueError(f"class {segment.label!r} has no mask, so objects cannot be placed in it")
        centres = [((d.box[0] + d.box[2]) / 2, (d.box[1] + d.box[3]) / 2) for d in objects]
        inside[segment.label] = sum(rle_contains(segment.mask, centres))
    return {
        "objects_from": reference,
        "objects": len(objects),
        "inside": inside,
        "outside": {label: len(objects) - n for label, n in inside.items()},
    }
