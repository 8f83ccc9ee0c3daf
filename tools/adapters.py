"""Adapters from specialist models to task-level tools: each turns `run(tool, image, params)` into a model call.

- `DetectorAdapter` wraps anything with `.detect(PIL image, categories) -> list[Detection]` (LAE-DINO, DenoDet): category
  detection, fixed-vocabulary detection and top-1 grounding, tiled with overlap + NMS on large scenes; a GeoTIFF's
  tiles are read from the file at full resolution (`LoadedImage.raster`), all-nodata tiles skipped.
The other adapters see the image whole: `LoadedImage.scene()` (a GeoTIFF decimated to fit the tools' `max_pixels`).
- `SegmenterAdapter` wraps `.segment(PIL image, classes) -> list[SegmentClass]` (SegEarth-OV).
- `MaskSegmenterAdapter` wraps RemoteSAM (`.ground`, `.segment_referring`, `.segment_instances`, `.segment_semantic`).
- `RoadExtractorAdapter` wraps `.extract(PIL image) -> RoadGraph` (SAM-Road).
- `CloudRemovalAdapter` wraps `.restore(PIL image) -> CloudRemoval` (SpA-GAN) and writes the restored image
  as an artefact file (a GeoTIFF with the input's CRS and footprint when the input was georeferenced).
- `ChangeDetectorAdapter` wraps `.detect(before, after) -> (H, W) bool` (BIT) for the two-image `detect_changes`:
  the output is `geopilot.tools.change_output`'s, with two artefacts (the after image with its unchanged pixels
  black, which a chain's `"image": "result:N"` counts or segments in, and the mask as a 0/255 PNG).
Each adapter has a typed options model, filled from `options:` in `configs/tools.yaml`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
from PIL import Image
from pydantic import BaseModel, Field, field_validator, model_validator

from geopilot.artifacts import publish_artifact
from geopilot.config import StrictConfig
from geopilot.errors import GeoPilotInputError
from geopilot.loaded_image import LoadedImage
from geopilot.tool_output import Artifact, Detection, RoadGraph, SegmentClass, ToolOutput
from geopilot.tools.geo import save_geotiff
from geopilot.tools.precision import precision_setting
from geopilot.tools.tiling import detect_windows
from geopilot.vocabulary import canonical_class, dataset_classes, segearth_queries, segearth_threshold


class NoOptions(StrictConfig):
    pass


class LaeDinoOptions(StrictConfig):
    """The LAE-DINO model's own options (`LaeDino.from_weights`); `options.model` of a detector binding. Defined
    here, without torch, so a misspelt key fails when configs/tools.yaml loads, not when the model does."""

    box_threshold: float = Field(0.3, ge=0.0, le=1.0)
    text_threshold: float = Field(0.25, ge=0.0, le=1.0)
    max_detections: int = Field(100, ge=1)
    max_per_image: int = Field(300, ge=1)  # upstream test_cfg.max_per_img, per forward
    chunk_size: int = Field(40, ge=1)  # categories per forward
    short_side: int = Field(800, ge=32)
    max_long_side: int = Field(1333, ge=32)
    tokenizer_path: str | None = None  # folder with vocab.txt; default <weights folder>/bert-base-uncased
    precision: precision_setting("lae_dino") = "fp32"  # upstream's; geopilot.tools.precision
    architecture: Literal["swin-t", "tiny"] = "swin-t"  # "tiny" only makes sense for tests of the loading path


class DetectorOptions(StrictConfig):
    tile_size: int = Field(1024, ge=64)
    tile_overlap: int = Field(256, ge=0)
    nms_iou: float = Field(0.5, gt=0.0, le=1.0)
    score_threshold: float = Field(0.3, ge=0.0, le=1.0)
    max_detections: int = Field(100, ge=1)
    # What detect_all / sar_detect_all look for: these class names plus the classes of these datasets, all as canonical
    # names of the class vocabulary (geopilot/vocabulary.yaml), e.g. vocabulary_datasets: [DIOR].
    vocabulary: list[str] = []
    vocabulary_datasets: list[str] = []
    model: LaeDinoOptions = LaeDinoOptions()  # the detector model's options, typed: a misspelt key is a config error

    @model_validator(mode="after")
    def _overlap_below_tile(self) -> DetectorOptions:
        if self.tile_overlap >= self.tile_size:
            raise ValueError(f"tile_overlap ({self.tile_overlap}) must be smaller than tile_size ({self.tile_size})")
        return self

    @field_validator("vocabulary_datasets")
    @classmethod
    def _known_datasets(cls, names: list[str]) -> list[str]:
        for name in names:
            try:
                dataset_classes(name)
            except GeoPilotInputError as err:
                raise ValueError(str(err)) from None
        return names

    def fixed_vocabulary(self) -> list[str]:
        """The canonical categories of a fixed-vocabulary detection, in order, without repeats."""
        names = [canonical_class(v) for v in self.vocabulary if v.strip()]
        names += [c for dataset in self.vocabulary_datasets for c in dataset_classes(dataset)]
        return list(dict.fromkeys(names))


class SegmenterOptions(StrictConfig):
    # Classes are sent to SegEarth-OV as the CLIP-friendly prompts of this upstream class file (geopilot/vocabulary.yaml
    # `segearth_ov`: OpenEarthMap "rangeland" -> "grass", "building" -> "building,roof,house"), with its probability
    # threshold unless `prob_threshold` is set; null = the class names as given, the model's own threshold.
    class_prompts: str | None = "OpenEarthMap"
    prob_threshold: float | None = Field(None, ge=0.0, le=1.0)

    @field_validator("class_prompts")
    @classmethod
    def _known_class_file(cls, name: str | None) -> str | None:
        if name is not None:
            try:
                segearth_threshold(name)
            except GeoPilotInputError as err:
                raise ValueError(str(err)) from None
        return name

    model: dict[str, Any] = {}


class SpaGanOptions(StrictConfig):
    variant: Literal["RICE1", "RICE2"] = "RICE1"  # which checkpoint: thin clouds (RICE1) or thick clouds (RICE2)
    precision: precision_setting("spa_gan") = "fp32"  # upstream's; fp16 (CUDA) allowed: geopilot.tools.precision
    tile_size: int = Field(1024, ge=0)  # larger images run in tiles (same result, bounded memory); 0 = never


class BitCdOptions(StrictConfig):
    precision: precision_setting("bit_cd") = "fp32"  # upstream's; fp16 refused: geopilot.tools.precision


class DenoDetOptions(StrictConfig):
    """The DenoDet model's own options (`DenoDet.from_weights`); `options.model` of a `denodet` binding."""

    input_size: int = Field(512, ge=32)  # the published model: 512 px (its DCT sizes are 64 and 32)
    score_thr: float = Field(0.05, ge=0.0, le=1.0)  # upstream test_cfg
    nms_pre: int = Field(1000, ge=1)
    nms_iou: float = Field(0.6, gt=0.0, le=1.0)
    max_per_img: int = Field(100, ge=1)
    precision: precision_setting("denodet") = "fp32"  # upstream's; fp16 refused: geopilot.tools.precision
    architecture: Literal["resnet50", "tiny"] = "resnet50"  # "tiny" only makes sense for tests of the loading path
    # The checkpoint's label order: mmdet numbers classes in its training annotation JSON's category order. A COCO
    # JSON of SARDet-100K (train.json) gives that order; None = METAINFO's (ship, aircraft, car, tank, bridge, harbor)
    annotation_file: str | None = None


class SarDetectorOptions(DetectorOptions):
    """A DetectorAdapter over DenoDet: the same tiling/threshold options, DenoDet's model options."""

    model: DenoDetOptions = DenoDetOptions()


class SamRoadOptions(StrictConfig):
    """A `sam_road` binding's options (`SamRoad.from_weights`)."""

    preset: Literal["cityscale", "spacenet"] = "cityscale"  # which checkpoint and thresholds
    batch_size: int = Field(8, ge=1)  # patches per encoder forward
    max_patches: int = Field(1024, ge=1)  # scenes needing more patches are refused (crop or resample them)
    sample_margin: int | None = Field(None, ge=0)  # None = upstream's (CityScale 64: a blank border; SpaceNet 0)
    precision: precision_setting("sam_road") = "fp32"  # upstream's; fp16 refused: geopilot.tools.precision
    architecture: Literal["vit-b", "tiny"] = "vit-b"  # "tiny" only makes sense for tests of the loading path


class RemoteSamOptions(StrictConfig):
    """RemoteSAM (`geopilot.tools.remotesam.RemoteSam`); defaults are upstream's post-processing settings."""

    conf_threshold: float = Field(0.01, ge=0.0, le=1.0)  # minimum mean probability of an instance
    nms_iou: float = Field(0.5, gt=0.0, le=1.0)
    max_instances: int = Field(100, ge=1)
    tile_size: int = Field(2048, ge=64)  # category prompts run in tiles on larger scenes
    tile_overlap: int = Field(256, ge=0)
    max_side: int = Field(8192, ge=64)  # referring tools see the scene whole; larger ones are refused
    tokenizer_path: str | None = None  # folder with vocab.txt; default <weights folder>/bert-base-uncased
    precision: precision_setting("remotesam") = "fp32"  # upstream's; fp16 (CUDA) allowed: geopilot.tools.precision
    architecture: Literal["swin-b", "tiny"] = "swin-b"  # "tiny" only makes sense for tests of the loading path
    use_epoc: bool = True  # upstream's detection/counting refine masks with DirectSAM contours (README use_EPOC=True)
    epoc_path: str | None = None  # DirectSAM folder; default <weights folder>/DirectSAM-EntitySeg-1024px-0501
    epoc_threshold: float = Field(0.25, gt=0.0, lt=1.0)  # contour cut-off: upstream DET 0.25 (its CNT eval: 0.15)

    @model_validator(mode="after")
    def _overlap_below_tile(self) -> RemoteSamOptions:
        if self.tile_overlap >= self.tile_size:
            raise ValueError(f"tile_overlap ({self.tile_overlap}) must be smaller than tile_size ({self.tile_size})")
        return self


class Detects(Protocol):
    def detect(self, image: Image.Image, categories: list[str]) -> list[Detection]: ...


class Segments(Protocol):
    def segment(
        self, image: Image.Image, classes: list[str], prob_threshold: float | None = None
    ) -> list[SegmentClass]: ...


class Restores(Protocol):
    def restore(self, image: Image.Image): ...  # -> geopilot.tools.spa_gan.CloudRemoval


class DetectsChanges(Protocol):
    change_class: str  # what the model's "changed" means, e.g. "building" (LEVIR-CD)

    def detect(self, before: Image.Image, after: Image.Image) -> np.ndarray: ...  # (H, W) bool, True = changed


class ExtractsRoads(Protocol):
    def extract(self, image: Image.Image) -> RoadGraph: ...


def _unsupported(adapter: object, tool: str) -> ValueError:
    return ValueError(f"{type(adapter).__name__} cannot serve tool {tool!r} (check the binding in configs/tools.yaml)")


class DetectorAdapter:
    CATEGORY_TOOLS = {"detect_objects"}
    VOCABULARY_TOOLS = {"detect_all", "sar_detect_all"}
    GROUNDING_TOOLS = {"ground", "sar_ground"}

    def __init__(self, detector: Detects, options: DetectorOptions | None = None):
        self.detector, self.options = detector, options or DetectorOptions()

    def _categories(self, tool: str, params: BaseModel) -> list[str]:
        """The detector's prompts. Class names go through the class vocabulary (LAE-DINO is prompted with the
        canonical names the model was trained to emit: "storagetank" -> "storage tank")."""
        if tool in self.CATEGORY_TOOLS:
            return list(dict.fromkeys(canonical_class(c) for c in params.categories))
        if tool in self.VOCABULARY_TOOLS:
            vocabulary = self.options.fixed_vocabulary() or list(getattr(self.detector, "classes", []))  # closed set
            if not vocabulary:
                raise ValueError(
                    f"{tool!r} needs `options.vocabulary_datasets` or `options.vocabulary` (configs/tools.yaml)"
                )
            return vocabulary
        if tool in self.GROUNDING_TOOLS:
            return [params.expression]
        raise _unsupported(self, tool)

    def run(self, tool: str, image: LoadedImage, params: BaseModel) -> ToolOutput:
        categories = self._categories(tool, params)
        o = self.options
        scene = image.raster if image.raster is not None else image.image
        tiled = detect_windows(
            lambda tile: self.detector.detect(tile, categories), scene, o.tile_size, o.tile_overlap, o.nms_iou
        )
        found = tiled.detections
        empty = (
            f"{tiled.empty_tiles} of {tiled.tiles} tiles are all nodata and were skipped" if tiled.empty_tiles else None
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
                nothing = f"nothing in the image matches {params.expression!r}"
                return ToolOutput(message=f"{nothing}; {empty}" if empty else nothing)
        else:  # a closed-set detector labels with its own class names (DenoDet: "aircraft"): canonical ones out
            kept = [d.model_copy(update={"label": canonical_class(d.label)}) for d in kept]
        return ToolOutput(detections=kept[: o.max_detections], message=empty)


class SegmenterAdapter:
    """Requested classes -> SegEarth-OV prompts (and threshold) from the class vocabulary; segments come back
    labelled with the class names as requested."""

    def __init__(self, segmenter: Segments, options: SegmenterOptions | None = None):
        self.segmenter, self.options = segmenter, options or SegmenterOptions()

    def run(self, tool: str, image: LoadedImage, params: BaseModel) -> ToolOutput:
        if tool != "segment_semantic":
            raise _unsupported(self, tool)
        o, classes = self.options, [c.strip() for c in params.classes]
        if o.class_prompts is None:
            return ToolOutput(segments=self.segmenter.segment(image.scene(), classes, o.prob_threshold))
        queries = segearth_queries(classes, o.class_prompts)
        threshold = o.prob_threshold if o.prob_threshold is not None else segearth_threshold(o.class_prompts)
        asked: dict[str, str] = {}  # prompt -> the first class asked for with it
        for name, query in zip(classes, queries, strict=True):
            asked.setdefault(query.strip(), name)
        segments = self.segmenter.segment(image.scene(), queries, threshold)
        return ToolOutput(segments=[s.model_copy(update={"label": asked.get(s.label, s.label)}) for s in segments])


class MaskSegments(Protocol):  # RemoteSAM: every output is derived from one referring mask per prompt
    def ground(self, image: Image.Image, expression: str) -> list[Detection]: ...
    def segment_referring(self, image: Image.Image, expression: str) -> list[Detection]: ...
    def segment_instances(
        self, image: Image.Image, categories: list[str], score_threshold: float | None
    ) -> list[Detection]: ...
    def segment_semantic(self, image: Image.Image, classes: list[str]) -> list[SegmentClass]: ...
    @property
    def instance_note(self) -> str | None: ...  # why instances are not EPOC-refined, None when they are


class MaskSegmenterAdapter:
    def __init__(self, segmenter: MaskSegments):
        self.segmenter = segmenter

    def run(self, tool: str, image: LoadedImage, params: BaseModel) -> ToolOutput:
        s, pil = self.segmenter, image.scene()
        if tool in ("ground", "segment_referring"):
            found = (
                s.ground(pil, params.expression) if tool == "ground" else s.segment_referring(pil, params.expression)
            )
            if not found:
                return ToolOutput(message=f"nothing in the image matches {params.expression!r}")
            return ToolOutput(detections=found)
        if tool == "segment_instances":
            found = s.segment_instances(pil, list(params.categories), params.score_threshold)
            return ToolOutput(detections=found, message=s.instance_note)
        if tool == "segment_semantic":
            return ToolOutput(segments=s.segment_semantic(pil, list(params.classes)))
        raise _unsupported(self, tool)


class CloudRemovalAdapter:
    def __init__(self, remover: Restores, artifacts_dir: str | Path):
        self.remover, self.artifacts_dir = remover, Path(artifacts_dir)

    def run(self, tool: str, image: LoadedImage, params: BaseModel) -> ToolOutput:
        if tool != "remove_clouds":
            raise _unsupported(self, tool)
        result = self.remover.restore(image.scene())
        if image.georef is not None:  # a GeoTIFF in, a GeoTIFF out: same CRS, same footprint
            path = publish_artifact(
                self.artifacts_dir, "remove_clouds", ".tif", lambda to: save_geotiff(result.restored, image.georef, to)
            )
        else:  # a fresh private file, never written through a planted name (geopilot.artifacts)
            path = publish_artifact(
                self.artifacts_dir, "remove_clouds", ".png", lambda to: result.restored.save(to, "PNG")
            )
        width, height = result.restored.size
        return ToolOutput(
            artifacts=[Artifact(kind="image", path=str(path))],
            message=f"cloud-free image restored ({width}x{height})",
        )


class ChangeDetectorAdapter:
    def __init__(self, detector: DetectsChanges, artifacts_dir: str | Path):
        self.detector, self.artifacts_dir = detector, Path(artifacts_dir)

    def run(self, tool: str, image: LoadedImage, params: BaseModel, images: list[LoadedImage]) -> ToolOutput:
        from geopilot.tools.annotations import class_key
        from geopilot.tools.change_output import change_output

        if tool != "detect_changes":
            raise _unsupported(self, tool)
        known = self.detector.change_class
        unknown = [c for c in params.classes or [] if class_key(c) != class_key(known)]
        if unknown:
            raise GeoPilotInputError(f"the change model detects {known} change only; it cannot look for {unknown}")
        before, after = (each.scene() for each in images)
        changed = self.detector.detect(before, after)
        kept = np.asarray(after.convert("RGB")).copy()
        kept[~changed] = 0
        regions = publish_artifact(
            self.artifacts_dir, "detect_changes", ".png", lambda to: Image.fromarray(kept).save(to, "PNG")
        )
        mask = publish_artifact(
            self.artifacts_dir,
            "detect_changes_mask",
            ".png",
            lambda to: Image.fromarray(changed.astype(np.uint8) * 255).save(to, "PNG"),
        )
        artifacts = [Artifact(kind="image", path=str(regions)), Artifact(kind="mask", path=str(mask))]
        return change_output(changed, label=known, artifacts=artifacts)


class RoadExtractorAdapter:
    def __init__(self, extractor: ExtractsRoads):
        self.extractor = extractor

    def run(self, tool: str, image: LoadedImage, params: BaseModel) -> ToolOutput:
        if tool != "extract_roads":
            raise _unsupported(self, tool)
        return ToolOutput(roads=self.extractor.extract(image.scene()))


class ExampleAnnotationsOptions(StrictConfig):
    """The `annotations` backend (geopilot.tools.example_images): the COCO JSON of the example images."""

    annotations: str = "examples/images/annotations.json"  # a relative path is read from the current folder
