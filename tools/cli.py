"""`geopilot tools list|run`: the task-level tools from the command line.

    geopilot tools list [--json]
    geopilot tools run remove_clouds --image cloudy.png --out out/          # writes out/output.json + the image
    geopilot tools run detect_objects --image s2.tif --bands 4,3,2 --params '{"categories": ["ship"]}' --out out/
        # on a georeferenced GeoTIFF also out/output.geojson (RFC 7946, WGS 84), out/output.gpkg (native CRS) and,
        # for segment_semantic, out/classes.tif (class ids, COG); geopilot.tools.geo_files
    geopilot tools run detect_objects --image scene.tif --params '{"categories": ["ship"]}' --json device=cpu
    geopilot tools run detect_changes --image before.png --image after.png --out out/   # a two-image tool: in order
    (both take --config configs/tools.yaml and key=value overrides, as every command does: device=cpu
     tools.remove_clouds.options.variant=RICE2)

Exit codes: 0 success; 2 bad input (unknown tool, bad params, unreadable or too large image, missing weights,
a backend that is not available yet); 1 when the tool itself fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from geopilot.argtypes import add_tools_config_argument, output_folder
from geopilot.argtypes import bands as bands_type
from geopilot.cli import Command
from geopilot.config import add_override_arguments
from geopilot.errors import GeoPilotInputError, echo
from geopilot.fileio import atomic_write, overwrites_input, parse_json_object

WRITTEN = ("output.json", "output.geojson", "output.gpkg", "classes.tif")  # what --out may hold afterwards


def _add_common_arguments(parser: argparse.ArgumentParser) -> None:
    add_tools_config_argument(parser, old_names=("--config",))
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--catalog", default=None, help="an indicator catalogue (YAML): its image-free tools instead")


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    _add_common_arguments(parser)
    add_override_arguments(parser, "device=cpu")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    _add_common_arguments(parser)
    parser.add_argument("tool", help="task-level tool name, e.g. detect_objects")
    add_override_arguments(parser, "device=cpu tools.remove_clouds.options.variant=RICE2")
    parser.add_argument(
        "--image",
        action="append",
        default=None,
        help="image file (PNG/JPEG/TIFF/GeoTIFF); repeat for a tool that reads several (before, after, in order, "
        "one size); not with --catalog",
    )
    parser.add_argument(
        "--params", default="{}", help='tool parameters as a JSON object, e.g. \'{"categories": ["ship"]}\''
    )
    parser.add_argument(
        "--out",
        type=output_folder,
        default=None,
        help="folder for output.json, artefacts and, on a GeoTIFF, .geojson/.gpkg/classes.tif",
    )
    parser.add_argument("--bands", type=bands_type, default=None, help="band numbers shown as RGB, e.g. 4,3,2")
    parser.add_argument("--class-polygons", action="store_true", help="semantic classes also as polygons")


def list_tools(args: argparse.Namespace) -> int:
    from geopilot.tools.registry import binding_precision, binding_status, build_registry, load_tools_config

    rows = []
    if args.catalog:
        from geopilot.tools.indicators.tools import build_indicator_registry

        for schema in build_indicator_registry(args.catalog).schemas():
            rows.append(
                {**schema, "modality": "none", "backend": "indicators", "status": "ready", "status_detail": None}
            )
    else:
        config = load_tools_config(args.tools_config, args.overrides)
        for schema in build_registry(config=config).schemas():
            binding = config.tools[schema["name"]]
            status, detail = binding_status(binding)
            precision = binding_precision(binding)
            rows.append({**schema, "backend": binding.backend, **precision, "status": status, "status_detail": detail})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        detail = f" ({row['status_detail']})" if row.get("status_detail") else ""
        precision = f"{row['precision']:<5}" if "precision" in row else f"{'-':<5}"
        print(f"{row['name']:<18} {row['modality']:<8} {row['backend']:<12} {precision} {row['status']}{detail}")
        print(f"{'':<18} {row['description']}")
    return 0


def run_tool(args: argparse.Namespace) -> int:
    from geopilot.image import check_same_size, load_image
    from geopilot.sample import Action
    from geopilot.tool_output import llm_view
    from geopilot.tool_result import ToolCallError
    from geopilot.tools.registry import build_registry, load_tools_config

    params = parse_json_object(args.params, "--params")
    if args.out and args.image:
        clash = next((name for name in WRITTEN if overwrites_input(Path(args.out) / name, args.image)), None)
        if clash is not None:
            raise GeoPilotInputError(
                f"--out {echo(str(args.out))} would write {clash} over the --image: choose another"
            )
    action = Action(tool=args.tool, params=params)
    if args.catalog:
        from geopilot.tools.indicators.tools import build_indicator_registry

        if args.image:
            raise GeoPilotInputError("--image and --catalog do not go together: indicator tools read no image")
        registry = build_indicator_registry(args.catalog, args.out)
        image, images = None, None
        try:
            registry.validate(action)
        except ToolCallError as err:
            raise GeoPilotInputError(str(err)) from None
    else:
        if not args.image:
            raise GeoPilotInputError("--image is required (or --catalog for the indicator tools)")
        config = load_tools_config(args.tools_config, args.overrides)
        if args.out:
            config.artifacts_dir = str(Path(args.out).resolve())
        registry = build_registry(config=config)
        try:
            tool, _ = registry.validate(action)
        except ToolCallError as err:
            raise GeoPilotInputError(str(err)) from None
        images = [
            load_image(path, max_pixels=config.max_pixels, bands=args.bands or config.bands) for path in args.image
        ]
        check_same_size(images)
        for note in dict.fromkeys(n for image in images for n in image.notes):  # said once: bands, CRS, ...
            print(f"geopilot tools run: {note}", file=sys.stderr)
        tool.prepare()  # missing weights or an unavailable backend: exit 2 before anything runs
        image = images[0]
    result = registry.call(action, image, images=images)
    report = {
        "tool": result.tool,
        "params": result.params,
        "ok": result.ok,
        "error": result.error,
        "error_kind": result.error_kind,
        "seconds": round(result.seconds, 3),
        "output": result.output.model_dump(mode="json") if result.output is not None else None,
        "llm_view": llm_view(result.output) if result.output is not None else None,
    }
    if image is not None and image.bands is not None:
        report["image"] = {"bands": list(image.bands.bands), "bands_reason": image.bands.reason, "notes": image.notes}
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        if result.ok and image is not None and image.georef is not None:
            from geopilot.tools.geo_files import write_beside

            written = write_beside(
                result.output, image.georef, result.tool, out, args.class_polygons, config.max_pixels
            )
            report["geo_files"] = [
                {"path": str(w.path), "features": w.features, "empty_masks": w.empty_masks} for w in written
            ]
        atomic_write(out / "output.json", json.dumps(report, indent=2) + "\n")
    if args.json:
        print(json.dumps(report))
    elif result.ok:
        answered_by = "  (provenance: annotations)" if result.output.provenance == "annotations" else ""
        print(f"{result.tool}: {json.dumps(report['llm_view'])}{answered_by}")
        for artifact in result.output.artifacts:
            print(f"{artifact.kind}: {artifact.path}")
        for written in report.get("geo_files", []):
            what = "classes" if written["path"].endswith(".tif") else "features"
            print(f"geo: {written['path']} ({written['features']} {what})")
    if not result.ok:
        print(f"geopilot tools run: error: {result.error}", file=sys.stderr)
        return 2 if result.error_kind in ("unknown_tool", "invalid_params", "wrong_modality", "missing_image") else 1
    return 0


COMMANDS = {
    "list": Command("the tools, their backends and whether they are ready", add_list_arguments, list_tools),
    "run": Command("run one tool on one image", add_run_arguments, run_tool),
}
