"""The dependency direction as contracts (what import-linter would check): the core (geopilot/*.py, geopilot/agent,
geopilot/training) imports no tools, data_gen or eval at import time, and serving uses no other package's underscore
names. Checked from the source (ast, naming the file and line) and by importing every core module in a fresh
interpreter (which also catches an indirect import)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "geopilot"
CORE = [
    *sorted(PACKAGE.glob("*.py")),
    *sorted((PACKAGE / "agent").glob("*.py")),
    *sorted((PACKAGE / "training").glob("*.py")),
]
OUTSIDE_CORE = ("geopilot.tools", "geopilot.data_gen", "geopilot.eval")


def module_name(path: Path) -> str:
    parts = path.with_suffix("").parts
    parts = parts[len(parts) - 1 - parts[::-1].index("geopilot") :]  # from the last `geopilot` folder down
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_time_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import that runs when the module is imported: module level, outside functions and
    `if TYPE_CHECKING:` blocks; relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path)
    found = []

    def visit(nodes):
        for node in nodes:
            if isinstance(node, ast.Import):
                found.extend((node.lineno, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
                found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
            elif isinstance(node, ast.If | ast.Try | ast.With):
                visit([*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])])
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(tree.body)
    return found


def test_the_core_source_imports_no_tools_data_gen_or_eval_at_import_time():
    offenders = [
        f"{module_name(path)}:{line} imports {name}"
        for path in CORE
        for line, name in import_time_imports(path)
        if name.startswith(OUTSIDE_CORE)
    ]
    assert offenders == []


def test_importing_every_core_module_loads_no_tools_data_gen_or_eval():
    script = (
        "import importlib, json, sys\n"
        f"names, outside = {[module_name(p) for p in CORE]!r}, {OUTSIDE_CORE!r}\n"
        "seen = {}\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "    for loaded in sys.modules:\n"
        "        if loaded.startswith(outside) or loaded.split('.')[0] in ('tools', 'data_gen', 'eval'):\n"
        "            seen.setdefault(loaded, name)\n"
        "print(json.dumps(seen))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {}  # {loaded module: the core module that loaded it}


def underscore_uses(path: Path) -> list[str]:
    """`from X import _name` and `X._name` for X a module of another geopilot package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    ours = module_name(path).rsplit(".", 1)[0]
    foreign = {}  # local name -> module, for modules of other packages
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("geopilot") and not node.level:
            if node.module.startswith(ours):
                continue
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append(f"{path.name}:{node.lineno} from {node.module} import {alias.name}")
                else:
                    foreign[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("geopilot") and not alias.name.startswith(ours):
                    foreign[alias.asname or alias.name.split(".")[0]] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and node.value.id in foreign
        ):
            found.append(f"{path.name}:{node.lineno} {node.value.id}.{node.attr}")
    return found


def test_serving_uses_no_underscore_names_of_other_packages():
    assert [use for path in sorted((PACKAGE / "serving").glob("*.py")) for use in underscore_uses(path)] == []


def test_the_contract_checks_catch_what_they_forbid(tmp_path):
    """The checkers on a planted file: they would fail on a violation, not pass on anything."""
    (tmp_path / "geopilot" / "serving").mkdir(parents=True)
    planted = tmp_path / "geopilot" / "serving" / "probe.py"
    core = tmp_path / "geopilot" / "probe.py"
    planted.write_text(
        "from geopilot.agent.loop import _private\nimport geopilot.errors as errors\nerrors._hidden\n", encoding="utf-8"
    )
    core.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import geopilot.eval\n"
        "from geopilot.tools import registry\n\ndef lazy():\n    import geopilot.data_gen\n",
        encoding="utf-8",
    )
    assert underscore_uses(planted) == [
        "probe.py:1 from geopilot.agent.loop import _private",
        "probe.py:3 errors._hidden",
    ]
    assert import_time_imports(core) == [(1, "typing.TYPE_CHECKING"), (4, "geopilot.tools.registry")]
