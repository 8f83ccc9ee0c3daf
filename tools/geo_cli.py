"""`geopilot geo export --image FILE --tool-output TOOL_OUTPUT.json --out PATH [--class-polygons]`.

Converts a saved canonical tool output (what `geopilot tools run --json` prints or `--out` saves as output.json; a
bare ToolOutput object works too) for a georeferenced image into PATH, the format by its suffix: `.geojson` = RFC
7946 in WGS 84, `.gpkg` = GeoPackage in the image's own CRS, `.tif` = the class-id COG of a semantic segmentation
(geopilot.tools.geo_files). Only the image's header is read. Exit 2 for bad input (no CRS, a CRS that cannot be
reprojected to WGS 84 for .geojson, no class masks for .tif, an unknown suffix, an unreadable output file).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from geopilot.argtypes import add_deprecated_name
from geopilot.cli import Command
from geopilot.errors import GeoPilotInputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image", required=True, help="the GeoTIFF the tool ran on")
    parser.add_argument("--tool-output", help="the tool output JSON (`geopilot tools run --json`); required")
    add_deprecated_name(parser, "--output", "--tool-output")
    parser.add_argument("--out", required=True, help="file to write: .geojson, .gpkg or .tif")
    parser.add_argument("--class-polygons", action="store_true", help="also write semantic classes as polygons")


def run(args: argparse.Namespace) -> int:
    from geopilot.image import GEOTIFF_SUFFIXES
    from geopilot.raster import read_georef
    from geopilot.tools.geo_files import export

    if args.tool_output is None:
        raise GeoPilotInputError("--tool-output is required: the tool output JSON to export")
    tool, output = read_tool_output(Path(args.tool_output))
    image = Path(args.image)
    if image.suffix.lower() not in GEOTIFF_SUFFIXES or not image.is_file():
        raise GeoPilotInputError(f"--image {image}: not a GeoTIFF file (.tif/.tiff)")
    written = export(output, read_georef(image), tool, Path(args.out), args.class_polygons)
    empty = f", {written.empty_masks} zero-pixel masks left out" if written.empty_masks else ""
    what = "classes" if written.path.suffix.lower() in (".tif", ".tiff") else "features"
    print(f"{written.path}: {written.features} {what}{empty}")
    return 0


def read_tool_output(path: Path):
    """(tool name, ToolOutput) of a saved `tools run` report or a bare ToolOutput JSON object."""
    from pydantic import ValidationError

    from geopilot.errors import describe_validation_error
    from geopilot.tool_output import ToolOutput

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise GeoPilotInputError(f"--tool-output {path}: cannot be read as JSON ({err})") from None
    if not isinstance(data, dict):
        raise GeoPilotInputError(f"--tool-output {path}: expected a JSON object")
    report = "output" in data and "tool" in data
    if report and data["output"] is None:
        raise GeoPilotInputError(f"--tool-output {path}: the tool call failed ({data.get('error')}); nothing to export")
    try:
        output = ToolOutput.model_validate(data["output"] if report else data)
    except ValidationError as err:
        raise GeoPilotInputError(f"--tool-output {path}: {describe_validation_error(err)}") from None
    return (str(data["tool"]) if report else "tool"), output


COMMANDS = {
    "export": Command("a saved tool output -> .geojson (WGS 84), .gpkg (native CRS) or .tif", add_arguments, run)
}
