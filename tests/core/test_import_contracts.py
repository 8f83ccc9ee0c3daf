"""The dependency direction as contracts (what import-linter would check): the core (geopilot/*.py, geopilot/agent,
geopilot/training) imports no tools, data_gen or eval at import time, and serving uses no other package's underscore
names. Checked from the source (ast, naming the file and line) and by importing every core module in a fresh
interpreter (which also catches an indirect import).

Imports inside functions count too: the first-party imports of the four packages, at any depth, form no cycle and
point down the layers (core < tools < data_gen < eval). A function-level import is for a heavy optional dependency
(third-party, not checked here) or a lazy command; the command modules that may reach up are listed in
`ENTRY_MODULES`, and `UPWARD_ALLOWED` holds the other exceptions, each with its reason."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
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


def underscore_uses(path: Path, name: str | None = None) -> list[str]:
    """`from X import _name` and `X._name` for X a module of another geopilot package (`name`: the file's module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = name or module_name(path)
    ours = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
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


def test_no_package_uses_another_package_s_underscore_names():
    """A name one package shares with another is public (e.g. the SARLANG reader's `find_image`, which evaluation's
    loader reads the same files with)."""
    assert [use for name, path in modules_under(ROOT).items() for use in underscore_uses(path, name)] == []


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


# -- every first-party import, inside functions included ------------------------------------------------------------

ROOT = PACKAGE.parent
FOLDERS = {"geopilot": "geopilot", "tools": "geopilot.tools", "data_gen": "geopilot.data_gen", "eval": "geopilot.eval"}
LAYERS = ("geopilot", "geopilot.tools", "geopilot.data_gen", "geopilot.eval")  # lowest first
ENTRY_MODULES = {  # lazy commands: they wire the layers together, so they may import any layer inside a function
    "geopilot.cli": "the console script's dispatcher",
    "geopilot.commands": "`geopilot <command>` modules (train wires in eval's planning probe)",
    "geopilot.demo": "`geopilot demo`: data, training and evaluation in one pipeline",
    "geopilot.serving.cli": "`geopilot serve`: builds the tool registry it serves",
}
UPWARD_ALLOWED = {  # (importer, imported): why
    ("geopilot.agent.pilot", "geopilot.tools.registry"): "GeoPilot.tools: the `tools` extra's default registry, "
    "built on first use when no registry is passed (pip install geopilot without extras still imports)",
}

CYCLE_EXCEPTIONS: dict[tuple[str, str], str] = {}  # (importer, imported) inside a function closing a cycle: why


def modules_under(root: Path) -> dict[str, Path]:
    """import name -> file, for the four mapped folders under `root` (setup.py's mapping)."""
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            name = ".".join([package, *parts])
            found[name.removesuffix(".__init__")] = path
    return found


def first_party_imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[int, str]]:
    """(line, imported module) of every import of a first-party module in `path`, at any depth, except in
    `if TYPE_CHECKING:` blocks (never run) and `if __name__ == "__main__":` blocks (run as the program, an entry
    point, never when the module is imported)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []

    def target(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "__name__ == '__main__'"):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, t) for alias in node.names if (t := target(alias.name)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                kept = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*kept, base]).strip(".")
            found.extend((node.lineno, t) for alias in node.names if (t := target(f"{base}.{alias.name}")))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return [(line, imported) for line, imported in found if imported != name]


def import_graph(root: Path) -> dict[str, list[tuple[int, str]]]:
    modules = modules_under(root)
    return {name: first_party_imports(name, path, modules) for name, path in modules.items()}


def cycle_in(graph: dict[str, list[tuple[int, str]]]) -> list[str]:
    """One import cycle (a -> b -> ... -> a), or [] when the imports form none."""
    try:
        TopologicalSorter({name: {imported for _, imported in edges} for name, edges in graph.items()}).prepare()
    except CycleError as err:
        return list(err.args[1])
    return []


def layer(name: str) -> int:
    return max(i for i, top in enumerate(LAYERS) if name == top or name.startswith(top + "."))


def is_entry(name: str) -> bool:
    return any(name == entry or name.startswith(entry + ".") for entry in ENTRY_MODULES)


def upward_imports(graph: dict[str, list[tuple[int, str]]]) -> list[str]:
    """Imports, at any depth, of a higher layer, outside the entry modules and `UPWARD_ALLOWED`."""
    return [
        f"{name}:{line} imports {imported}"
        for name, edges in graph.items()
        for line, imported in edges
        if layer(imported) > layer(name) and not is_entry(name) and (name, imported) not in UPWARD_ALLOWED
    ]


def test_first_party_imports_form_no_cycle_even_inside_functions():
    graph = import_graph(ROOT)
    kept = {
        name: [(line, m) for line, m in edges if (name, m) not in CYCLE_EXCEPTIONS] for name, edges in graph.items()
    }
    assert cycle_in(kept) == []


def test_no_import_points_up_the_layers_even_inside_functions():
    assert upward_imports(import_graph(ROOT)) == []


def test_the_allowlists_name_real_imports():
    graph = import_graph(ROOT)
    edges = {(name, imported) for name, found in graph.items() for _, imported in found}
    assert set(UPWARD_ALLOWED) | set(CYCLE_EXCEPTIONS) <= edges  # a stale exception is removed, not kept
    assert all(any(is_entry(name) and name.startswith(entry) for name in graph) for entry in ENTRY_MODULES)


def test_the_graph_checks_fail_on_a_planted_function_level_cycle_and_upward_import(tmp_path):
    """A test of the test: a cycle hidden in a function body, and a core module reaching into eval from one."""
    for folder in FOLDERS:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "geopilot" / "a.py").write_text("from geopilot.b import helper\n", encoding="utf-8")
    (tmp_path / "geopilot" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from geopilot.eval import scorer\n\n"
        "def helper():\n    from geopilot.a import thing\n    return thing\n",
        encoding="utf-8",
    )
    (tmp_path / "geopilot" / "c.py").write_text("def late():\n    from geopilot.eval import scorer\n", encoding="utf-8")
    (tmp_path / "eval" / "scorer.py").write_text("from ..b import helper\n", encoding="utf-8")
    graph = import_graph(tmp_path)
    assert sorted(cycle_in(graph)[:-1]) == ["geopilot.a", "geopilot.b"]
    assert upward_imports(graph) == ["geopilot.c:2 imports geopilot.eval.scorer"]
    (tmp_path / "geopilot" / "b.py").write_text("def helper():\n    return 1\n", encoding="utf-8")
    (tmp_path / "geopilot" / "c.py").write_text("", encoding="utf-8")
    graph = import_graph(tmp_path)
    assert cycle_in(graph) == [] and upward_imports(graph) == []
