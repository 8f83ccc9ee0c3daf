"""The fixed tool layer every agent is measured on, and the one tool-description prompt every prompted agent reads.

The planning benchmark grades plans, so by default the ten task-level tools run on the *planning fixture*:
each call is validated exactly as in production (the tool's pydantic params model, its modality, the image
size limit; `geopilot.tool_protocol.ToolRegistry.call`) and a valid call returns an empty canonical output.
That keeps the layer offline, deterministic and identical for every agent. `--tools-config FILE` binds the real
backends instead (`geopilot.tools.registry.build_registry`) for end-to-end runs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pydantic import BaseModel

from geopilot.image import DEFAULT_MAX_PIXELS
from geopilot.loaded_image import LoadedImage
from geopilot.tool_output import ToolOutput
from geopilot.tool_protocol import ToolRegistry

FIXTURE = "planning-fixture"
PROMPT_VERSION = "planning-v1"


class FixtureBackend:
    """Answers every validated call with an empty canonical output (the planning metrics never read it)."""

    def run(self, tool: str, image: LoadedImage, params: BaseModel, **images: list[LoadedImage]) -> ToolOutput:
        return ToolOutput()


def build_tool_layer(
    tools_config: str | Path | None = None, catalog: str | Path | None = None
) -> tuple[ToolRegistry, str]:
    """(registry, name of the layer): the planning fixture, the real backends of a tools config, or the indicator
    tools of a catalogue (a second domain on the same harness: docs/indicators.md)."""
    if catalog is not None:
        from geopilot.tools.indicators.tools import build_indicator_registry

        if tools_config is not None:
            raise ValueError("a tools config and an indicator catalogue are two different tool layers: pick one")
        return build_indicator_registry(catalog), f"indicators:{Path(catalog).name}"
    if tools_config is not None:
        from geopilot.tools.registry import build_registry

        return build_registry(tools_config), f"tools-config:{Path(tools_config).name}"
    from geopilot.tools.task_tools import TASKS, TaskTool

    backend = FixtureBackend()
    return ToolRegistry([TaskTool(spec, backend, FIXTURE, DEFAULT_MAX_PIXELS) for spec in TASKS], 30.0), FIXTURE


class AnnotationLookup:
    """The annotation-backed backend over many images: the record whose image (or cloud-free pair) has exactly
    these pixels answers (geopilot.tools.annotations); an image with no record is the call's error."""

    def __init__(self, records: list, root: Path):
        from geopilot.image import load_image
        from geopilot.tools.annotations import AnnotationBackend

        self.backends: dict[str, AnnotationBackend] = {}
        for record in records:
            backend = AnnotationBackend(record, root)
            for path in (record.image, record.cloud_free_image):
                if path is not None:
                    self.backends.setdefault(_pixels_key(load_image(root / path)), backend)

    def run(self, tool: str, image: LoadedImage, params: BaseModel, **images: list[LoadedImage]) -> ToolOutput:
        backend = self.backends.get(_pixels_key(image))  # a pair's record is found by its image 1 (before)
        if backend is None:
            raise ValueError("this image has no annotations in the suite")
        return backend.run(tool, image, params, **images)


def _pixels_key(image: LoadedImage) -> str:
    import numpy as np

    return hashlib.sha256(np.asarray(image.image).tobytes()).hexdigest()


def annotation_layer(annotations: str | Path) -> tuple[ToolRegistry, str]:
    """The task tools answering from a suite's annotation records (`<stem>.annotations.json` next to its case file,
    e.g. the chain suite's, or the change suite's before/after pairs with their labels): real outputs, so a chain's
    second step has the first one's artefact to read and a change question has the label's numbers."""
    from geopilot.records import AnnotationRecord, ObjectAnnotation, ReferringExpression, SemanticSegmentation
    from geopilot.tools.task_tools import TASKS, TaskTool

    path = Path(annotations)
    records = []
    for raw in json.loads(path.read_text(encoding="utf-8")):
        semantic = raw.get("semantic")
        records.append(
            AnnotationRecord(
                source=raw.get("source", "suite"),
                image=raw["image"],
                width=raw["width"],
                height=raw["height"],
                modality=raw["modality"],
                record_id=raw["image"],
                objects=[
                    ObjectAnnotation(
                        o["label"],
                        tuple(o["box"]),
                        polygon=tuple(tuple(p) for p in o["polygon"]) if o.get("polygon") else None,
                    )
                    for o in raw.get("objects", [])
                ],
                referring=[ReferringExpression(e, tuple(ix)) for e, ix in raw.get("referring", [])],
                semantic=None
                if semantic is None
                else SemanticSegmentation(
                    semantic["mask_path"], {int(k): v for k, v in semantic["class_names"].items()}
                ),
                cloud_free_image=raw.get("cloud_free_image"),
                after_image=raw.get("after_image"),
                change_mask=raw.get("change_mask"),
            )
        )
    backend = AnnotationLookup(records, path.parent)
    tools = [TaskTool(spec, backend, "annotations", DEFAULT_MAX_PIXELS) for spec in TASKS]
    return ToolRegistry(tools, 30.0), f"annotations:{path.name}"


def suite_annotations(cases: str | Path) -> Path | None:
    """The annotation file a case file ships with (`<stem>.annotations.json`), if any."""
    candidate = Path(cases).with_name(Path(cases).stem + ".annotations.json")
    return candidate if candidate.is_file() else None


def tool_prompt(registry: ToolRegistry) -> str:
    """The system prompt of every prompted agent: the tool descriptions and the reply format (GeoPilot JSON)."""
    schemas = registry.schemas()
    reads_images = any(schema["modality"] is not None for schema in schemas)
    lines = [
        "You are a remote-sensing assistant. You can call these tools on the user's image:"
        if reads_images
        else "You are a geospatial analysis assistant. You can call these tools:",
        "",
    ]
    for schema in schemas:
        params = json.dumps(schema["input_schema"].get("properties", {}), sort_keys=True, separators=(",", ":"))
        lines.append(f"- {schema['name']}{_reads(schema)}: {schema['description']} params: {params}")
    lines += [
        "",
        "Reply with ONE JSON object and nothing else:",
        '{"reasoning": "...", "actions": [{"tool": "<tool name>", "params": {...}}], "value": null}',
        "to call tools, or, when the question needs no tool, answer directly:",
        '{"reasoning": "...", "actions": [], "value": "<your answer>"}',
        "After the tool outputs arrive, answer with actions [] and the answer in value.",
    ]
    return "\n".join(lines)


def openai_tools(registry: ToolRegistry) -> list[dict]:
    """The same tools as OpenAI function definitions (`--tools-as openai`)."""
    return [
        {
            "type": "function",
            "function": {
                "name": schema["name"],
                "description": f"{schema['description']}{_reads(schema)}",
                "parameters": schema["input_schema"],
            },
        }
        for schema in registry.schemas()
    ]


def _reads(schema: dict) -> str:
    return f" ({schema['modality']} images)" if schema["modality"] is not None else ""


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
