"""Items 1-4 as a hostile MCP client sees them: paths outside the image roots, symlinks planted in the image root and
in the artefact folder, EPS bytes, and the HTTP API key. Every refusal is one line and never says whether a path
exists. In-process (fast), and over stdio and streamable HTTP with `geopilot mcp` as a subprocess (slow)."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import sys
from pathlib import Path

import anyio
import httpx
import pytest
from helpers.mcp_http import mcp_http_server
from mcp import Client, StdioServerParameters
from PIL import Image

from geopilot.cli import main
from geopilot.image_access import ImageAccessPolicy
from geopilot.tool_output import ToolOutput
from geopilot.tools.mcp_server import build_server
from geopilot.tools.registry import build_registry

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240
EPS = (
    b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\n%%EndComments\n"
    b"newpath 0 0 moveto 8 8 lineto stroke showpage\n%%EOF\n"
)
PATH_PROBES = ("outside_exists", "outside_missing", "etc_passwd", "etc_missing", "escape", "symlink", "artifact_link")


class Layout:
    """An image root with one image, a secret image next to it (outside), an artefact folder, planted symlinks."""

    def __init__(self, tmp: Path):
        self.root, self.artifacts = tmp / "root", tmp / "artifacts"
        self.root.mkdir()
        self.artifacts.mkdir()
        self.image = self.root / "in.png"
        Image.new("RGB", (24, 24), (120, 130, 140)).save(self.image)
        self.secret = tmp / "secret.png"
        Image.new("RGB", (24, 24), (10, 20, 30)).save(self.secret)
        (self.root / "link.png").symlink_to(self.secret)  # inside the root, pointing out of it
        (self.artifacts / "planted.png").symlink_to(self.secret)
        self.victim = tmp / "victim.txt"
        self.victim.write_text("must stay as it is")
        # the name the old code wrote the restored image to (sha256 of the pixels): planted, pointing at the victim
        digest = hashlib.sha256(Image.open(self.image).convert("RGB").tobytes()).hexdigest()[:16]
        (self.artifacts / f"remove_clouds_{digest}.png").symlink_to(self.victim)

    def probes(self) -> dict[str, str]:
        return {
            "outside_exists": str(self.secret),
            "outside_missing": str(self.secret.with_name("missing.png")),
            "etc_passwd": "/etc/passwd",
            "etc_missing": "/etc/no-such-file-here",
            "escape": f"{self.root}/../{self.secret.name}",
            "symlink": str(self.root / "link.png"),
            "artifact_link": str(self.artifacts / "planted.png"),
            "eps": base64.b64encode(EPS).decode(),
            "eps_uri": "data:image/png;base64," + base64.b64encode(EPS).decode(),
        }

    def overrides(self, weights: Path) -> list[str]:
        return [
            "device=cpu",
            f"image_roots=[{self.root}]",
            f"artifacts_dir={self.artifacts}",
            f"tools.remove_clouds.weights={weights}",
        ]


@pytest.fixture
def layout(tmp_path) -> Layout:
    return Layout(tmp_path)


@pytest.fixture
def spa_gan_weights(tmp_path) -> Path:
    import torch

    from geopilot.tools.spa_gan import SpaNet

    torch.manual_seed(0)
    path = tmp_path / "spa_gan_random.pth"
    torch.save(SpaNet().state_dict(), path)
    return path


async def _probe(client, layout: Layout) -> dict:
    out = {}
    for name, value in layout.probes().items():
        out[name] = await client.call_tool("remove_clouds", {"image": value})
    out["ok"] = await client.call_tool("remove_clouds", {"image": str(layout.image)})
    out["ok_relative"] = await client.call_tool("remove_clouds", {"image": "in.png"})
    return out


def _text(result) -> str:
    return result.content[0].text


def _check(results: dict, layout: Layout) -> None:
    refusals = {name: _text(results[name]) for name in PATH_PROBES}
    for name, text in refusals.items():
        assert results[name].is_error, (name, text)
        assert "\n" not in text and "Traceback" not in text
        assert layout.secret.name not in text and "passwd" not in text and "missing" not in text, (name, text)
    assert len(set(refusals.values())) == 1, refusals  # existing or not, file or link: the same words
    assert refusals["outside_exists"].startswith("image: not accepted")
    for name in ("eps", "eps_uri"):
        assert results[name].is_error and "\n" not in _text(results[name])
        assert "not an image file in a format GeoPilot reads" in _text(results[name]), _text(results[name])
    for name in ("ok", "ok_relative"):
        assert not results[name].is_error, _text(results[name])
        (artifact,) = ToolOutput.model_validate_json(_text(results[name])).artifacts
        path = Path(artifact.path)
        assert path.parent == layout.artifacts.resolve() and path.is_file() and not path.is_symlink()
        assert Image.open(path).size == (24, 24)
    assert layout.victim.read_text() == "must stay as it is"  # nothing written through the planted symlink


def _run(fn):
    async def bounded():
        with anyio.fail_after(TIMEOUT_S):
            return await fn()

    return anyio.run(bounded)


def test_in_process_probes_are_refused_without_revealing_paths(layout, spa_gan_weights):
    from geopilot.tools.registry import load_tools_config

    config = load_tools_config(overrides=layout.overrides(spa_gan_weights))
    server = build_server(build_registry(config=config), 10**6, ImageAccessPolicy.from_roots(config.image_roots))

    async def session():
        async with Client(server) as client:
            return await _probe(client, layout)

    _check(_run(session), layout)


def test_without_roots_no_path_is_read(layout):
    policy = ImageAccessPolicy()
    from geopilot.image_access import ImageAccessError

    messages = set()
    for value in (str(layout.image), "/etc/passwd", "/etc/no-such-file-here"):
        with pytest.raises(ImageAccessError) as err:
            policy.load(value)
        messages.add(str(err.value))
    assert messages == {policy.refused} and "none configured" in policy.refused
    assert policy.load("data:image/png;base64," + _png_b64()).image.size == (4, 4)


def _png_b64() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_non_loopback_http_needs_an_api_key(monkeypatch, capsys):
    from geopilot.network import server_api_key

    monkeypatch.delenv("GEOPILOT_API_KEY", raising=False)
    assert main(["mcp", "--transport", "http", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "without an API key" in err
    assert server_api_key("mcp", "127.0.0.1", None) is None
    assert server_api_key("mcp", "0.0.0.0", "k3y") == "k3y"
    assert "warning: serving on 0.0.0.0" in capsys.readouterr().err
    monkeypatch.setenv("GEOPILOT_API_KEY", "from-env")
    assert server_api_key("mcp", "10.0.0.5", None) == "from-env"


def test_mcp_help_shows_defaults(capsys):
    assert main(["mcp", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 127.0.0.1)" in out and "(default: 8765)" in out and "GEOPILOT_API_KEY" in out


@pytest.mark.slow
def test_stdio_probes(layout, spa_gan_weights):
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "geopilot.cli", "mcp", "--transport", "stdio", *layout.overrides(spa_gan_weights)],
        env=dict(os.environ),
        cwd=str(REPO),
    )

    async def session():
        async with Client(params) as client:
            return await _probe(client, layout)

    _check(_run(session), layout)


@pytest.mark.slow
def test_http_probes_and_api_key(layout, spa_gan_weights):
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    with mcp_http_server("--api-key", "s3cret", *layout.overrides(spa_gan_weights), timeout_s=TIMEOUT_S) as url:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            refused = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=headers)
            assert refused.status_code == 401 and "API key" in refused.text

        async def session():
            http = create_mcp_http_client(headers={"Authorization": "Bearer s3cret"})
            async with Client(streamable_http_client(url, http_client=http)) as client:
                return await _probe(client, layout)

        _check(_run(session), layout)
