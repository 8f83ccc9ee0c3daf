"""README.md and docs/*.md: every relative link resolves, every repository path in backticks exists, every table
renders as a table (no blank line or ragged row inside it), nothing points outside the repository, and nothing refers
to the project's issues or review items (a doc states what is true, not which ticket asked for it; an upstream
project's issue is named with its repository, `owner/name#N`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PATH = re.compile(r"`((?:geopilot|tools|data_gen|eval|configs|benchmarks|tests|examples|docs)/[\w./-]+)`")
TICKET = re.compile(r"\b(?:issues?|items?|review(?: item)?s?)\s+#?\d+|\breview (?:items?|rounds?|findings?)\b", re.I)
TOP_LEVEL = {"geopilot", "tools", "data_gen", "eval", "configs", "benchmarks", "tests", "examples", "docs"}


def _prose(text: str) -> str:
    """The text outside fenced code blocks (commands there name files the reader creates)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_and_paths_resolve(doc):
    text = _prose(doc.read_text(encoding="utf-8"))
    for target in LINK.findall(text):
        if re.match(r"[a-z]+://|mailto:|#", target):
            continue
        path = (doc.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{doc.name}: link {target!r} does not resolve"
        assert ROOT in path.parents or path == ROOT, f"{doc.name}: link {target!r} leaves the repository"
    for name in PATH.findall(text):
        name = name.rstrip(".")
        if any(ch in name for ch in "*<>{}"):
            continue  # a pattern, not a file
        assert (ROOT / name).exists() or (ROOT / name.replace("geopilot/", "", 1)).exists() or _packaged(name), (
            f"{doc.name}: `{name}` does not exist"
        )
    assert "../shared" not in text, f"{doc.name}: refers to a file outside the repository"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_no_doc_refers_to_issues_or_review_items(doc):
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), start=1):
        found = TICKET.search(line)
        assert not found, f"{doc.name} line {number}: {found.group(0)!r} refers to an issue or review item"


def _packaged(name: str) -> bool:
    """`geopilot/tools/x.py` is tools/x.py in the checkout (the package maps the top-level folders)."""
    head, _, rest = name.partition("/")
    if head != "geopilot":
        return False
    sub, _, tail = rest.partition("/")
    return sub in TOP_LEVEL and (ROOT / sub / tail).exists()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_tables_render(doc):
    lines = _prose(doc.read_text(encoding="utf-8")).splitlines()
    for number, line in enumerate(lines):
        if re.fullmatch(r"\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?", line.strip()):
            header = lines[number - 1]
            width = _cells(header)
            end = number + 1
            while end < len(lines) and lines[end].strip().startswith("|"):
                cells = _cells(lines[end])
                assert cells == width, f"{doc.name} line {end + 1}: a row of {cells} cells, header {width}"
                end += 1
            rest = lines[end : end + 3]  # a blank line, then rows that no separator introduces: a split table
            if len(rest) >= 2 and not rest[0].strip() and rest[1].strip().startswith("|"):
                is_header = len(rest) == 3 and re.fullmatch(r"\|?[\s:|-]+\|?", rest[2].strip() or "x")
                assert is_header, f"{doc.name} line {end + 1}: a blank line splits the table"


def _cells(row: str) -> int:
    row = re.sub(r"`[^`]*`", "x", row.replace("\\|", "x")).strip()
    return len(row.strip("|").split("|"))
