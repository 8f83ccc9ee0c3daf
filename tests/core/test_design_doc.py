"""Issue 25 item 5: the design lives in the project (docs/design.md), every reference points there and cites a
section it has, the README links it, and the agent does not import serving."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("geopilot", "tools", "data_gen", "eval", "configs", "tests", "docs", "benchmarks", "examples")


def files():
    for folder in SOURCES:
        for path in (REPO / folder).rglob("*"):
            if path.suffix in (".py", ".md", ".yaml") and ".venv" not in path.parts:
                yield path
    yield from (REPO / name for name in ("README.md", "train.py", "serve.py"))


def test_every_design_reference_points_to_docs_design_md_and_a_section_it_has():
    sections = {int(n) for n in re.findall(r"^## (\d+)\.", (REPO / "docs/design.md").read_text(), re.M)}
    assert sections == set(range(1, 11))
    for path in files():
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"DESIGN(\.md| §)", text), f"{path} still cites DESIGN"
        for number in re.findall(r"docs/design\.md §(\d+)", text):
            assert int(number) in sections, f"{path} cites docs/design.md §{number}"
    assert "docs/design.md" in (REPO / "README.md").read_text()


def test_the_agent_does_not_import_serving():
    for path in (REPO / "geopilot" / "agent").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.startswith("geopilot.serving") for n in names), f"{path.name} imports serving"
