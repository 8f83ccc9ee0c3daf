"""`geopilot geo export --image FILE --tool-output TOOL_OUTPUT.json --out PATH [--class-polygons]`.

Converts a saved canonical tool output (what `geopilot tools run --json` prints or `--out` saves as output.json; a
bare ToolOutput object works too) for a georeferenced image into PATH, the format by its suffix: `.geojson` = RFC
7946 in WGS 84, `.gpkg` = GeoPackage in the image's own CRS, `.tif` = the class-id COG of a semantic segmentation
(geopilot.tools.geo_files). Only the image's header is read. Exit 2 for bad input (no CRS, a CRS that cannot be
reprojected to WGS 84 for .geojson, no class masks for .tif, an unknown suffix, an unreadable output file, a tool
output over `TOOL_OUTPUT_MAX_BYTES` or not a regular file, a mask that is not of the image or over `--max-pixels`,
an `--out` that is an input or lies in no folder). PATH is written beside itself and renamed: a failed export
leaves nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from geopilot.argtypes import add_deprecated_name, int_in
from geopilot.cli import Command
from geopilot.errors import GeoPilotInputError, echo
from geopilot.fileio import MiB, overwrites_input, read_json, regular_file
from geopilot.tool_output import MASK_MAX_PIXELS

TOOL_OUTPUT_MAX_BYTES = 256 * MiB  # a saved tool output: masks of a 10k x 10k scene take a few MB


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image", required=True, help="the GeoTIFF the tool ran on")
    parser.add_argument("--tool-output", help="the tool output JSON (`geopilot tools run --json`); required")
    add_deprecated_name(parser, "--output", "--tool-output")
    parser.add_argument("--out", required=True, help="file to write: .geojson, .gpkg or .tif")
    parser.add_argument("--class-polygons", action="store_true", help="also write semantic classes as polygons")
    parser.add_argument(
        "--max-pixels",
        type=int_in(1, 10**12),
        default=MASK_MAX_PIXELS,
        help="the largest mask decoded (height x width); a larger size claim is refused before decoding",
    )


def run(args: argparse.Namespace) -> int:
    from geopilot.image import GEOTIFF_SUFFIXES
    from geopilot.raster import read_georef
    from geopilot.tools.geo_files import export

    if args.tool_output is None:
        raise GeoPilotInputError("--tool-output is required: the tool output JSON to export")
    image, saved, out = Path(args.image), Path(args.tool_output), Path(args.out)
    if image.suffix.lower() not in GEOTIFF_SUFFIXES:
        raise GeoPilotInputError(f"--image {echo(str(image))}: not a GeoTIFF file (.tif/.tiff)")
    regular_file(image, "--image GeoTIFF")
    if overwrites_input(saved, [image]):
        raise GeoPilotInputError("--image and --tool-output are the same file: --tool-output is the tool output JSON")
    clash = overwrites_input(out, [image, saved])
    if clash is not None:
        raise GeoPilotInputError(f"--out {echo(str(out))} is the input {echo(clash)}: refusing to write over it")
    folder = out.resolve().parent
    if not folder.is_dir():
        state = "is not a folder" if folder.exists() else "does not exist"
        raise GeoPilotInputError(f"--out {echo(str(out))}: its folder {echo(str(folder))} {state}")
    if out.is_dir():
        raise GeoPilotInputError(f"--out {echo(str(out))} is a folder; name the file to write")
    tool, output = read_tool_output(saved)
    written = export(output, read_georef(image), tool, out, args.class_polygons, args.max_pixels)
    empty = f", {written.empty_masks} zero-pixel masks left out" if written.empty_masks else ""
    what = "classes" if written.path.suffix.lower() in (".tif", ".tiff") else "features"
    print(f"{written.path}: {written.features} {what}{empty}")
    return 0


def read_tool_output(path: Path):
    """(tool name, ToolOutput) of a saved `tools run` report or a bare ToolOutput JSON object."""
    from pydantic import ValidationError

    from geopilot.errors import describe_validation_error
    from geopilot.tool_output import ToolOutput

    data = read_json(path, TOOL_OUTPUT_MAX_BYTES, "--tool-output tool output")
    if not isinstance(data, dict):
        raise GeoPilotInputError(f"--tool-output {echo(str(path))}: expected a JSON object")
    report = "output" in data and "tool" in data
    if report and data["output"] is None:
        failed = f"the tool call failed ({echo(data.get('error'))})"
        raise GeoPilotInputError(f"--tool-output {echo(str(path))}: {failed}; nothing to export")
    try:
        output = ToolOutput.model_validate(data["output"] if report else data)
    except ValidationError as err:
        raise GeoPilotInputError(f"--tool-output {echo(str(path))}: {describe_validation_error(err)}") from None
    return (str(data["tool"]) if report else "tool"), output


COMMANDS = {
    "export": Command("a saved tool output -> .geojson (WGS 84), .gpkg (native CRS) or .tif", add_arguments, run)
}
