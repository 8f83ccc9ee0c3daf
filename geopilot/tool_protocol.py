"""The tool protocol and the registry type: one definition serves inference, data_gen, evaluation and MCP.

A tool is anything with a name, a modality, a pydantic input model and `run(image, params) -> ToolOutput`.
`ToolRegistry.call` is the ONE dispatcher: it validates the call, resolves its references to earlier results of the
chat (geopilot.tool_chains), runs it with a timeout that ends the work (geopilot.tool_runner), captures every
failure into the `ToolResult` (geopilot.tool_result), and never raises for anything a model (or an MCP client)
sends.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ValidationError

from geopilot.errors import describe_validation_error, echo
from geopilot.loaded_image import LoadedImage
from geopilot.sample import Action, Modality
from geopilot.tool_chains import INPUT_SCHEMA, REFERENCE_PARAMS, ChatCalls, ResolvedInputs, input_number, params_key
from geopilot.tool_output import ToolOutput
from geopilot.tool_result import ToolCallError, ToolResult
from geopilot.tool_runner import CANCEL_GRACE_S, TimedOut, ToolFailed, run_in_process, run_in_thread


@runtime_checkable
class Tool(Protocol):
    name: ClassVar[str] | str  # task-level name the model emits, e.g. "detect_objects"
    description: ClassVar[str] | str  # one sentence for the planner prompt and MCP
    modality: ClassVar[Modality | None] | Modality | None  # None: the tool reads no image (e.g. indicator rasters)
    params_model: ClassVar[type[BaseModel]] | type[BaseModel]

    def run(self, image: LoadedImage, params: BaseModel) -> ToolOutput: ...

    # Optional: `isolation: Isolation = "thread"` (module docstring); read with getattr, so a plain tool needs none.
    # A tool whose params have an `objects` reference is run as `run(image, params, objects=[Detection, ...])`.
    # Optional: `image_count: int = 1`; a tool that reads several images (e.g. 2: before, after) is run as
    # `run(images[0], params, images=[LoadedImage, ...])`, exactly `image_count` of the chat's images in order (its
    # params' `images: InputImages` may name which; docs/design.md §4). Read with getattr, so a plain tool needs none.


def image_count(tool: Tool) -> int:
    """How many of the chat's images a tool reads (1 unless it declares `image_count`)."""
    return getattr(tool, "image_count", 1)


Isolation = Literal["thread", "process"]


UNEXPECTED_PARAMETER = "unexpected parameter"  # how an extra key in a tool call's params is described


def _plan_params(tool: Tool) -> tuple[str, str]:
    """A tool's params schema, with and without its reference params, each checked to compile into the plan grammar
    (ValueError naming the tool otherwise: at registry load, never at request time)."""
    from geopilot.agent.plan_schema import check_params_schema

    schema = tool.params_model.model_json_schema()
    own = {**schema, "properties": {k: v for k, v in schema.get("properties", {}).items() if k not in REFERENCE_PARAMS}}
    if "image" in schema.get("properties", {}):  # a first plan may already pick one of the chat's images
        own["properties"]["image"] = dict(INPUT_SCHEMA)
    if "required" in schema:
        own["required"] = [k for k in schema["required"] if k not in REFERENCE_PARAMS]
    return check_params_schema(tool.name, schema), check_params_schema(tool.name, own)


class ToolRegistry:
    """An explicit, ordered set of tools by name."""

    def __init__(self, tools: Iterable[Tool], timeout_s: float = 120.0, cancel_grace_s: float = CANCEL_GRACE_S):
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self._tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self._tools[tool.name] = tool
        self.timeout_s, self.cancel_grace_s = timeout_s, cancel_grace_s
        self._plan_params: dict[str, tuple[str, str]] | None = None  # compiled on first use (xgrammar loads torch)

    def check_plan_schemas(self) -> None:
        """Compile every tool's params schema for the plan grammar (once); ValueError naming the first tool whose
        schema cannot compile. `GeoPilot` calls it when it loads its registry, before any request."""
        if self._plan_params is None:
            self._plan_params = {name: _plan_params(tool) for name, tool in self._tools.items()}

    def plan_constraint(self, modality: Modality | None = None):
        """The plan a chat's first think turn may write: calls of this registry's tools (those of `modality`
        when it is declared), without `result:N` params (there is no earlier call to name)."""
        from geopilot.agent.plan_schema import PlanConstraint

        names = tuple(n for n, t in self._tools.items() if modality is None or t.modality in (None, modality))
        return PlanConstraint(names, params=tuple((n, self.plan_params(n, references=False)) for n in names))

    def plan_params(self, name: str, references: bool = True) -> str:
        """The params JSON schema (JSON text) a plan's call of `name` is decoded in, compiled at load;
        `references=False` leaves out the `result:N` params (a chat's first plan has no earlier call to name)."""
        self.check_plan_schemas()
        with_refs, without = self._plan_params[name]
        return with_refs if references else without

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    def __iter__(self):
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> list[str]:
        return list(self._tools)

    def get(self, name: str) -> Tool:
        if name not in self._tools:
            raise ToolCallError("unknown_tool", f"unknown tool {echo(name)}; available: {', '.join(self._tools)}")
        return self._tools[name]

    def schemas(self) -> list[dict[str, Any]]:
        """Name, description, modality and JSON schema of every tool: the planner prompt, MCP and docs use this."""
        return [
            {
                "name": t.name,
                "description": t.description,
                "modality": t.modality,
                "input_schema": t.params_model.model_json_schema(),
                **({"data_schema": data_model.model_json_schema()} if (data_model := _data_model(t)) else {}),
            }
            for t in self._tools.values()
        ]

    def validate(
        self, action: Action, modality: Modality | None = None, calls: ChatCalls | None = None
    ) -> tuple[Tool, BaseModel]:
        """Check a planned call against the registry, and its `result:N` references against the chat's `calls`;
        raises ToolCallError saying what is wrong."""
        tool, params = self._checked_params(action, modality)
        self.resolve(tool, params, calls)
        return tool, params

    def resolve(self, tool: Tool, params: BaseModel, calls: ChatCalls | None) -> ResolvedInputs:
        """What the call's references name (module docstring), or ToolCallError; a repeat of an earlier successful
        call of the chat on the same input is `repeated_call`."""
        resolved = ResolvedInputs()
        for field, kind in REFERENCE_PARAMS.items():
            reference = getattr(params, field, None)
            if reference is None:
                continue
            if field == "image" and (number := input_number(reference)) is not None:
                resolved.inputs = [number]
                resolved.computed_on = f"input:{number}" if number > 1 else resolved.computed_on
                continue
            if calls is None:
                raise ToolCallError(
                    "invalid_reference",
                    f"{field} {echo(reference)} names an earlier call of a chat; this call is in none",
                )
            output = calls.resolve(field, reference).output
            if kind == "image":
                resolved.computed_on = reference
                resolved.image_path = next(a.path for a in output.artifacts if a.kind == "image")
            else:
                resolved.objects = list(output.detections)
        if calls is not None and (number := calls.repeat_of(params_key(tool.name, params))) is not None:
            raise ToolCallError(
                "repeated_call",
                f"{tool.name} already ran with these params on the same image (call {number}); use its output above",
            )
        return resolved

    def params_key(self, action: Action) -> str | None:
        """The identity of a call for `repeated_call` (tool + validated params, references included)."""
        try:
            tool, params = self._checked_params(action, None)
        except ToolCallError:
            return None
        return params_key(tool.name, params)

    def _checked_params(self, action: Action, modality: Modality | None) -> tuple[Tool, BaseModel]:
        tool = self.get(action.tool)
        if modality is not None and tool.modality is not None and tool.modality != modality:
            raise ToolCallError(
                "wrong_modality", f"tool {tool.name!r} works on {tool.modality} images, but this image is {modality}"
            )
        try:
            params = tool.params_model.model_validate(action.params)
        except ValidationError as err:
            raise ToolCallError(
                "invalid_params",
                f"invalid params for {tool.name!r}: {describe_validation_error(err, unknown_key=UNEXPECTED_PARAMETER)}",
            ) from None
        return tool, params

    def call(
        self,
        action: Action,
        image: LoadedImage | None,
        modality: Modality | None = None,
        timeout_s: float | None = None,
        calls: ChatCalls | None = None,
        images: list[LoadedImage] | None = None,
    ) -> ToolResult:
        """Validate and run one call (its references resolved against the chat's `calls`). Every failure becomes
        `ToolResult.error`; nothing is raised. The caller records the result in `calls`. `images`: all the chat's
        images in order (None: just `image`); a call reads the one(s) it names (`Tool.image_count`, 'input:K').

        A timeout ends the work (module docstring of `geopilot.cancellation`, and `Tool.isolation`): an in-process
        call is cancelled and waited for up to `cancel_grace_s`, a process-isolated one is killed."""
        result = ToolResult(tool=action.tool, params=dict(action.params))
        start = time.perf_counter()
        try:
            tool, params = self._checked_params(action, modality)
            inputs = self.resolve(tool, params, calls)
            if inputs.image_path is not None:
                image, several = _artifact_image(inputs), None
            else:
                image, several = _chat_images(tool, params, inputs, [image] if images is None else list(images))
        except ToolCallError as err:
            result.error, result.error_kind = str(err), err.kind
            return result
        timeout = self.timeout_s if timeout_s is None else timeout_s
        extra = {} if inputs.objects is None else {"objects": inputs.objects}
        if several is not None:
            extra["images"] = several
        try:
            if timeout <= 0:
                raise TimedOut(f"tool {tool.name!r} was not run: no time left (timeout {timeout:g} s)")
            run = run_in_process if getattr(tool, "isolation", "thread") == "process" else run_in_thread
            output = run(tool, image, params, timeout, self.cancel_grace_s, extra)
        except TimedOut as err:
            result.error, result.error_kind = str(err), "timeout"
        except ValidationError as err:  # a backend built an out-of-range box, an empty label, ...
            result.error = f"tool {tool.name!r} produced an invalid output: {describe_validation_error(err)}"
            result.error_kind = "invalid_output"
        except ToolFailed as err:
            result.error, result.error_kind = str(err), err.kind
        except Exception as err:  # noqa: BLE001 - a tool's failure is data for the model, not a crash
            result.error, result.error_kind = f"tool {tool.name!r} failed: {type(err).__name__}: {err}", "tool_error"
        else:
            self._accept_output(result, tool, output)
            if result.output is not None:  # which image it read: the registry says, never the backend
                result.output = result.output.model_copy(update={"computed_on": inputs.computed_on})
        finally:
            result.seconds = time.perf_counter() - start
        return result

    @staticmethod
    def _accept_output(result: ToolResult, tool: Tool, output: object) -> None:
        """Re-validate what a backend returned (models are frozen but can be built with model_construct)."""
        name = tool.name
        if not isinstance(output, ToolOutput):
            result.error, result.error_kind = (
                f"tool {name!r} returned {type(output).__name__}, not ToolOutput",
                "invalid_output",
            )
            return
        try:
            result.output = ToolOutput.model_validate(output.model_dump())
            if (data_model := _data_model(tool)) is not None and result.output.data is not None:
                data_model.model_validate(result.output.data)
        except ValidationError as err:
            result.output = None
            result.error = f"tool {name!r} produced an invalid output: {describe_validation_error(err)}"
            result.error_kind = "invalid_output"


def _chat_images(
    tool: Tool, params: BaseModel, inputs: ResolvedInputs, chat_images: list[LoadedImage | None]
) -> tuple[LoadedImage | None, list[LoadedImage] | None]:
    """The chat images a call reads: (its `image`, the `images=` list of a several-image tool, else None);
    ToolCallError("missing_image") naming the image the chat lacks, before the tool runs."""
    needed = image_count(tool)
    if needed == 1:
        numbers = inputs.inputs
        if numbers == [1]:  # the chat's image as always (None for a text-only chat: a tool that reads none)
            return (chat_images[0] if chat_images else None), None
    else:
        names = getattr(params, "images", None) or [f"input:{k}" for k in range(1, needed + 1)]
        numbers = [input_number(name) for name in names]
        if len(numbers) != needed:
            raise ToolCallError(
                "invalid_params", f"{tool.name!r} reads {needed} images, but images names {len(numbers)}"
            )
    have = len([image for image in chat_images if image is not None])
    if missing := [k for k in numbers if k > have]:
        reads = f"{needed} images (image 1, then image 2, ... in order)" if needed > 1 else f"image {numbers[0]}"
        raise ToolCallError(
            "missing_image", f"{tool.name} reads {reads}; this chat has {have}: image {missing[0]} is missing"
        )
    picked = [chat_images[k - 1] for k in numbers]
    return picked[0], (picked if needed > 1 else None)


def _artifact_image(inputs: ResolvedInputs) -> LoadedImage:
    """The image artefact a reference names (a file a tool of this chat wrote), loaded like any input image."""
    from geopilot.image import load_image

    try:
        return load_image(inputs.image_path)
    except Exception as err:  # noqa: BLE001 - pruned or unreadable: the reference is unusable, said without the path
        raise ToolCallError(
            "invalid_reference",
            f"image {echo(inputs.computed_on)}: its file can no longer be read ({type(err).__name__})",
        ) from None


def _data_model(tool: Tool) -> type[BaseModel] | None:
    """The schema a tool declares for `ToolOutput.data` (optional: `data_model` next to `params_model`)."""
    return getattr(tool, "data_model", None)
