"""Adapters from specialist models to task-level tools: each turns `run(tool, image, params)` into a model call.

- `DetectorAdapter` wraps anything with `.detect(PIL image, categories) -> list[Detection]` (LAE-DINO): category
  detection, fixed-vocabulary detection and top-1 grounding, tiled with overlap + NMS on large scenes.
- `SegmenterAdapter` wraps `.segment(PIL image, classes) -> list[SegmentClass]` (SegEarth-OV).
- `CloudRemovalAdapter` wraps `.restore(PIL image) -> CloudRemoval` (SpA-GAN) and writes the restored image
  as an artefact file (a GeoTIFF with the input's CRS and footprint when the input was georeferenced).
Each adapter has a typed options model, filled from `options:` in `configs/tools.yaml`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal, Protocol

from PIL import Image
from pydantic import BaseModel, Field, model_validator

from geopilot.config import StrictConfig
from geopilot.image import LoadedImage
from geopilot.tool_output import Artifact, Detection, SegmentClass, ToolOutput
from geopilot.tools.geo import save_geotiff
from geopilot.tools.tiling import detect_tiled


class NoOptions(StrictConfig):
    pass


class DetectorOptions(StrictConfig):
    tile_size: int = Field(1024, ge=64)
    tile_overlap: int = Field(256, ge=0)
    nms_iou: float = Field(0.5, gt=0.0, le=1.0)
    score_threshold: float = Field(0.3, ge=0.0, le=1.0)
    max_detections: int = Field(100, ge=1)
    vocabulary: list[str] = []  # the categories detect_all / sar_detect_all look for
    model: dict[str, Any] = {}  # passed as keyword arguments to the backend's from_weights

    @model_validator(mode="after")
    def _overlap_below_tile(self) -> DetectorOptions:
        if self.tile_overlap >= self.tile_size:
            raise ValueError(f"tile_overlap ({self.tile_overlap}) must be smaller than tile_size ({self.tile_size})")
        return self


class SegmenterOptions(StrictConfig):
    model: dict[str, Any] = {}


class SpaGanOptions(StrictConfig):
    variant: Literal["RICE1", "RICE2"] = "RICE1"  # which checkpoint: thin clouds (RICE1) or thick clouds (RICE2)
    half: bool = True  # fp16 on CUDA
    tile_size: int = Field(1024, ge=0)  # larger images run in tiles (same result, bounded memory); 0 = never


class Detects(Protocol):
    def detect(self, image: Image.Image, categories: list[str]) -> list[Detection]: ...


class Segments(Protocol):
    def segment(self, image: Image.Image, classes: list[str]) -> list[SegmentClass]: ...


class Restores(Protocol):
    def restore(self, image: Image.Image): ...  # -> geopilot.tools.spa_gan.CloudRemoval


def _unsupported(adapter: object, tool: str) -> ValueError:
    return ValueError(f"{type(adapter).__name__} cannot serve tool {tool!r} (check the binding in configs/tools.yaml)")


class DetectorAdapter:
    CATEGORY_TOOLS = {"detect_objects"}
    VOCABULARY_TOOLS = {"detect_all", "sar_detect_all"}
    GROUNDING_TOOLS = {"ground", "sar_ground"}

    def __init__(self, detector: Detects, options: DetectorOptions | None = None):
        self.detector, self.options = detector, options or DetectorOptions()

    def _categories(self, tool: str, params: BaseModel) -> list[str]:
        if tool in self.CATEGORY_TOOLS:
            return list(params.categories)
        if tool in self.VOCABULARY_TOOLS:
            if not self.options.vocabulary:
                raise ValueError(f"{tool!r} needs `options.vocabulary` in its binding (configs/tools.yaml)")
            return list(self.options.vocabulary)
        if tool in self.GROUNDING_TOOLS:
            return [params.expression]
        raise _unsupported(self, tool)

    def run(self, tool: str, image: LoadedImage, params: BaseModel) -> ToolOutput:
        categories = self._categories(tool, params)
        o = self.options
        found = detect_tiled(
            lambda tile: self.detector.detect(tile, categories), image.image, o.tile_size, o.tile_overlap, o.nms_iou
        )
        threshold = getattr(params, "score_threshold", None)
        threshold = o.score_threshold if threshold is None else threshold
        kept = sorted(
            (d for d in found if d.score is None or d.score >= threshold),
            key=lambda d: -(d.score if d.score is not None else 1.0),
        )
        if tool in self.GROUNDING_TOOLS:
            kept = kept[:1]
            if not kept:
                return ToolOutput(message=f"nothing in the image matches {params.expression!r}")
        return ToolOutput(detections=kept[: o.max_detections])


class SegmenterAdapter:
    def __init__(self, segmenter: Segments):
        self.segmenter = segmenter

    def run(self, tool: str, image: LoadedImage, params: BaseModel) -> ToolOutput:
        if tool != "segment_semantic":
            raise _unsupported(self, tool)
        return ToolOutput(segments=self.segmenter.segment(image.image, list(params.classes)))


class CloudRemovalAdapter:
    def __init__(self, remover: Restores, artifacts_dir: str | Path):
        self.remover, self.artifacts_dir = remover, Path(artifacts_dir)

    def run(self, tool: str, image: LoadedImage, params: BaseModel) -> ToolOutput:
        if tool != "remove_clouds":
            raise _unsupported(self, tool)
        result = self.remover.restore(image.image)
        digest = hashlib.sha256(image.image.tobytes()).hexdigest()[:16]  # same input -> same file name
        self.artifacts_dir.mkdir(parents=True, exist_ok=True)
        if image.georef is not None:  # a GeoTIFF in, a GeoTIFF out: same CRS, same footprint
            path = self.artifacts_dir / f"remove_clouds_{digest}.tif"
            save_geotiff(result.restored, image.georef, path)
        else:
            path = self.artifacts_dir / f"remove_clouds_{digest}.png"
            result.restored.save(path)
        width, height = result.restored.size
        return ToolOutput(
            artifacts=[Artifact(kind="image", path=str(path.resolve()))],
            message=f"cloud-free image restored ({width}x{height})",
        )
