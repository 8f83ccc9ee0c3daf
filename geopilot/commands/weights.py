"""`geopilot weights check [--json] [--tools-config F]`: per configured backend, which files its load reads are
present, missing, ambiguous or not the published file (SHA-256), without loading anything. Exit 2 when a configured
backend cannot load. docs/weights.md says where each file comes from."""

from __future__ import annotations

import argparse
import json
import sys

from geopilot.cli import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tools-config", default=None, help="tools YAML (default: configs/tools.yaml)")
    parser.add_argument("--json", action="store_true", help="one JSON object per backend")


def run(args: argparse.Namespace) -> int:
    from geopilot.tools.registry import BACKENDS, binding_files, load_tools_config
    from geopilot.tools.weights import WEIGHTS_DIR_ENV

    config = load_tools_config(args.tools_config)
    seen: dict[tuple, dict] = {}
    for tool, binding in config.tools.items():
        if binding.backend == "annotations":
            continue
        options = BACKENDS[binding.backend].options_model.model_validate(binding.options)
        folder, checks = binding_files(binding, options, hashes=True)
        files = [check.as_dict() for check in checks]
        key = (binding.backend, str(folder), json.dumps(files))
        if key in seen:  # tools sharing one backend and folder: one entry
            seen[key]["tools"].append(tool)
            continue
        if folder is None:
            status = f"missing: ${WEIGHTS_DIR_ENV} is unset and the tools config gives no `weights:`"
        else:
            status = next((f["problem"] for f in files if f["problem"]), "present")
        seen[key] = {
            "backend": binding.backend,
            "tools": [tool],
            "folder": None if folder is None else str(folder),
            "status": status.split(":")[0],
            "detail": None if status == "present" else status,
            "files": files,
        }
    report = list(seen.values())
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for entry in report:
            print(f"{entry['backend']:<12} {entry['status']:<10} {', '.join(entry['tools'])}")
            if entry["detail"]:
                print(f"{'':<12} {entry['detail']}")
    failed = next((entry for entry in report if entry["status"] != "present"), None)
    if failed is None:
        return 0
    print(f"geopilot weights check: error: {failed['backend']}: {failed['detail']}", file=sys.stderr)
    return 2


COMMANDS = {
    "check": Command("check the weights every configured backend needs (no model is loaded)", add_arguments, run)
}
