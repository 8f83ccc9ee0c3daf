"""The command blocks of README.md and docs/*.md cannot rot. Every ```bash block carries a mark on the line before
its fence (docs/design.md §10): `<!-- runs -->` (or `<!-- runs: how the test scales it down -->`), and the slow test
here runs it; or `<!-- needs: what -->`, naming the real data, weights, GPUs or servers it needs.

The fast tests check the marks; the slow test runs every `runs` block in reading order (README.md, then docs/ by
name) in one scratch clone, the way a new user would, each command scaled down by `small()` and nothing else."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers.serving import stop_process

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"<!--\s*(runs|needs)(?::\s*(.*?))?\s*-->")
PROGRAMS = ("geopilot", "python")  # what a `runs` block may start a line with
SHELL = {"&&", "||", "|", ";", ">", ">>", "<", "&"}
SERVERS = {
    ("geopilot", "indicators", "serve"): "/openapi.json"
}  # started, probed at this path until it answers, stopped
COMMAND_TIMEOUT_S = 1200


@dataclass
class Block:
    doc: Path
    line: int  # of the opening fence, 1-based
    mark: str  # "runs", "needs" or "" (unmarked)
    note: str
    body: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    def commands(self) -> list[list[str]]:
        """Each command as argv: continuation lines joined, comments dropped."""
        text = "\n".join(self.body).replace("\\\n", " ")
        return [argv for line in text.splitlines() if (argv := shlex.split(line, comments=True))]


def blocks(doc: Path) -> list[Block]:
    lines = doc.read_text(encoding="utf-8").splitlines()
    found, index = [], 0
    while index < len(lines):
        if lines[index].startswith("```"):
            end = next(j for j in range(index + 1, len(lines)) if lines[j].startswith("```"))
            if lines[index].strip() == "```bash":
                before = next((line.strip() for line in reversed(lines[:index]) if line.strip()), "")
                mark = MARK.fullmatch(before)
                found.append(
                    Block(
                        doc,
                        index + 1,
                        mark.group(1) if mark else "",
                        (mark.group(2) or "") if mark else "",
                        lines[index + 1 : end],
                    )
                )
            index = end
        index += 1
    return found


def all_blocks() -> list[Block]:
    return [block for doc in DOCS for block in blocks(doc)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_bash_block_is_marked(doc):
    for block in blocks(doc):
        assert block.mark, f"{block.where}: a ```bash block without `<!-- runs -->` or `<!-- needs: ... -->` before it"
        if block.mark == "needs":
            assert len(block.note) >= 8, f"{block.where}: `<!-- needs: ... -->` must say what it needs"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_commands_are_in_bash_blocks(doc):
    """A command in a fence without a language would escape the marks."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    fence = None
    for number, line in enumerate(lines, start=1):
        if line.startswith("```"):
            fence = None if fence is not None else line.strip()
            continue
        command = re.match(r"\s*(geopilot|python3?|torchrun|pip) ", line)
        assert fence in (None, "```bash") or not command, f"{doc.name}:{number}: a command in a {fence!r} fence"


def test_runs_blocks_are_plain_commands_the_runner_knows():
    runs = [block for block in all_blocks() if block.mark == "runs"]
    assert len(runs) >= 6  # README's demo, by-hand steps, ablation and indicators; docs/demo.md, indicators, training
    for block in runs:
        for argv in block.commands():
            assert argv[0] in PROGRAMS, f"{block.where}: {argv[0]!r} is not one of {PROGRAMS}"
            assert not SHELL & set(argv), f"{block.where}: shell syntax in {shlex.join(argv)!r}"
            server = "serve" in argv[:3] or "--transport" in argv  # stdio MCP ends at the end of its input
            known = any(tuple(argv[: len(prefix)]) == prefix for prefix in SERVERS)
            assert known or not server, f"{block.where}: a server the runner cannot stop: {shlex.join(argv)!r}"


def test_the_readme_ablation_line_is_run():
    ablation = [
        block
        for block in blocks(ROOT / "README.md")
        if any(argv[:2] == ["geopilot", "ablate-alpha"] for argv in block.commands())
    ]
    assert [block.mark for block in ablation] == ["runs"]
    assert ["geopilot", "ablate-alpha", "--config", "configs/ablate_alpha.yaml"] in ablation[0].commands()


def test_the_marks_are_documented():
    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    assert "<!-- runs -->" in design and "<!-- needs: " in design and "tests/docs/test_command_blocks.py" in design


# ---- the slow run -------------------------------------------------------------------------------------------------


def small(argv: list[str], fixtures: dict[str, Path]) -> list[str]:
    """The command as the docs write it, at test scale: the only changes the slow test makes."""
    if argv[:2] == ["geopilot", "demo"]:
        return [*argv, "--quick"]  # the default preset takes 10 minutes; tests/demo runs --quick too
    if argv[:2] == ["geopilot", "chat"]:
        return [
            *argv,
            "--max-new-tokens",
            "24",
        ]  # room for the shortest plan the grammar allows (16 on the quick model)
    if argv[:2] == ["geopilot", "ablate-alpha"]:
        config = argv.index("--config") + 1  # the paper's settings need 8 GPUs, a real stage 1 and both benchmarks
        assert argv[config] == "configs/ablate_alpha.yaml", argv
        return [
            *argv[:config],
            "configs/tiny/ablate_alpha.yaml",
            *argv[config + 1 :],
            f"sar_vqa={fixtures['sar_vqa']}",
            f"optical_vqa={fixtures['optical_vqa']}",
        ]
    return argv


def _clone(where: Path) -> Path:
    """A checkout to run in: the repository's files, linked; a runs/ of its own."""
    where.mkdir()
    for entry in ROOT.iterdir():
        if not entry.name.startswith(".") and entry.name != "runs":
            (where / entry.name).symlink_to(entry)
    return where


def _program(name: str) -> str:
    if name == "python":
        return sys.executable
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name!r} is not installed next to {sys.executable}"
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run(argv: list[str], cwd: Path, env: dict, where: str, log: Path) -> None:
    shown = shlex.join(argv)
    command = [_program(argv[0]), *argv[1:]]
    probe = next((path for prefix, path in SERVERS.items() if tuple(argv[: len(prefix)]) == prefix), None)
    with log.open("w", encoding="utf-8") as out:
        if probe is None:
            done = subprocess.run(
                command,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=COMMAND_TIMEOUT_S,
            )
            code, ready = done.returncode, True
        else:
            port = _free_port()
            server = subprocess.Popen(
                [*command, "--port", str(port)],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            try:
                ready = _answers(f"http://127.0.0.1:{port}{probe}", server, deadline=time.monotonic() + 120)
            finally:
                stop_process(server)
            code = 0 if ready else server.returncode
    tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
    assert ready and code == 0, f"{where}: `{shown}` failed (exit {code})\n{tail}"


def _answers(url: str, server: subprocess.Popen, deadline: float) -> bool:
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                return reply.status == 200
        except OSError:
            time.sleep(0.5)
    return False


@pytest.mark.slow
def test_every_runs_block_runs_as_written(tmp_path):
    from helpers.bench_fixtures import write_rsvqa, write_sarlang

    clone = _clone(tmp_path / "clone")
    fixtures = {
        "sar_vqa": write_sarlang(tmp_path / "SARLANG-1M"),
        "optical_vqa": write_rsvqa(tmp_path / "RSVQA-HR", "hr"),
    }
    env = {key: value for key, value in os.environ.items() if key != "GEOPILOT_API_KEY"}
    ran = []
    for block in (block for block in all_blocks() if block.mark == "runs"):
        for number, argv in enumerate(block.commands()):
            _run(small(argv, fixtures), clone, env, block.where, tmp_path / f"log-{len(ran)}.txt")
            ran.append(f"{block.where} #{number}")
    assert len(ran) >= 15, ran
    table = (clone / "runs/tiny/ablate_alpha/ablate_alpha.md").read_text(encoding="utf-8")
    assert "| Multi-Stage | α |" in table and table.count("| ✓ |") == 2  # alphas 0 and 0.2 of the tiny config
