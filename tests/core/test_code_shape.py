"""The shape of the code the formatter cannot see, outside the files that mirror upstream code line for line (where
keeping upstream's layout is the point): the formatter is never switched off (ruff's skip/off comments), and no
function is longer than a page (`MAX_FUNCTION_LINES`, decorators and docstring included)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("geopilot", "tools", "data_gen", "eval", "tests", "benchmarks", "examples")
UPSTREAM_MIRRORS = {  # path: what it mirrors
    "tests/tools/test_lae_dino_upstream.py": "mmdet/mmcv's LAE-DINO modules, in upstream's own layout",
}
MAX_FUNCTION_LINES = 150
FORMATTER_OFF = re.compile(r"#\s*fmt:\s*(skip|off)\b")


def our_files() -> list[Path]:
    files = [*ROOT.glob("*.py"), *(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))]
    return sorted(p for p in files if p.relative_to(ROOT).as_posix() not in UPSTREAM_MIRRORS)


def formatter_off_lines(path: Path, root: Path = ROOT) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [f"{path.relative_to(root)}:{i}" for i, line in enumerate(lines, 1) if FORMATTER_OFF.search(line)]


def test_the_formatter_is_never_switched_off_outside_upstream_mirrors():
    assert [where for path in our_files() for where in formatter_off_lines(path)] == []


def test_the_mirrors_exist_and_the_check_sees_a_planted_skip(tmp_path):
    assert all((ROOT / path).is_file() for path in UPSTREAM_MIRRORS)
    planted = tmp_path / "probe.py"
    planted.write_text("y = 1\nx = [1,2]  # " + "fmt: skip\n", encoding="utf-8")
    assert formatter_off_lines(planted, tmp_path) == ["probe.py:2"]


def long_functions(path: Path, root: Path = ROOT, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (lines := node.end_lineno - min([node.lineno, *(d.lineno for d in node.decorator_list)]) + 1) > limit
    ]


def test_no_function_is_longer_than_a_page():
    assert [where for path in our_files() for where in long_functions(path)] == []


def test_the_length_check_sees_a_planted_long_function(tmp_path):
    planted = tmp_path / "probe.py"
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    planted.write_text(f"def short():\n    return 1\n\n\nasync def long():\n{body}", encoding="utf-8")
    assert long_functions(planted, tmp_path) == [f"probe.py:5 long ({MAX_FUNCTION_LINES + 1} lines)"]
