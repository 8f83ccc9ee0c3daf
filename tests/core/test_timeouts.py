"""A timeout ends the work. After a timed-out call no CPU is still spent and no artefact is written."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pydantic import BaseModel

from geopilot.loaded_image import LoadedImage
from geopilot.sample import Action
from geopilot.tool_output import ToolOutput
from geopilot.tool_protocol import ToolRegistry
from geopilot.tools.adapters import CloudRemovalAdapter
from geopilot.tools.spa_gan import SpaGan
from geopilot.tools.task_tools import TASKS_BY_NAME, NoParams, TaskTool

CALL = Action(tool="remove_clouds", params={})


def cloud_registry(
    artifacts: Path, timeout_s: float, side: int = 256, grace_s: float = 1.0
) -> tuple[ToolRegistry, LoadedImage]:
    """SpA-GAN (tiny random weights, the real 17-block architecture) tiled at 128 px: it checks for cancellation
    between tiles and between blocks."""
    remover = SpaGan.tiny(tile_size=128, tile_margin=0)
    tool = TaskTool(TASKS_BY_NAME["remove_clouds"], CloudRemovalAdapter(remover, artifacts), "spa_gan", 10**8)
    pixels = np.random.default_rng(0).integers(0, 255, (side, side, 3), dtype=np.uint8)
    registry = ToolRegistry([tool], timeout_s=timeout_s, cancel_grace_s=grace_s)
    return registry, LoadedImage(Image.fromarray(pixels, "RGB"))


def cpu_growth(seconds: float) -> float:
    """CPU seconds this process spends while the test thread sleeps `seconds` (all threads counted)."""
    before = time.process_time()
    time.sleep(seconds)
    return time.process_time() - before


def test_timed_out_call_stops_and_publishes_nothing(tmp_path):
    artifacts = tmp_path / "artifacts"
    registry, image = cloud_registry(artifacts, timeout_s=0.3, grace_s=5.0)  # a generous grace on a loaded CI box
    result = registry.call(CALL, image)
    assert result.error_kind == "timeout" and "timed out after 0.3 s" in result.error, result.error
    assert "did not stop" not in result.error
    assert result.seconds < 0.3 + registry.cancel_grace_s + 0.5
    assert cpu_growth(1.0) < 0.1  # the abandoned-thread version keeps a core busy for many seconds here
    assert not artifacts.exists() or list(artifacts.iterdir()) == []


def test_untimed_call_still_publishes_its_artefact(tmp_path):
    artifacts = tmp_path / "artifacts"
    registry, image = cloud_registry(artifacts, timeout_s=120, side=24)
    result = registry.call(CALL, image)
    assert result.ok, result.error
    (artifact,) = result.output.artifacts
    assert Path(artifact.path).parent == artifacts.resolve() and Image.open(artifact.path).size == (24, 24)


class Spin:
    """A tool without cancellation points (pure Python busy loop), run in a worker process."""

    name, description, modality, params_model, isolation = "spin", "burns CPU", None, NoParams, "process"

    def __init__(self, pid_file: Path, done_file: Path):
        self.pid_file, self.done_file = pid_file, done_file

    def run(self, image: LoadedImage | None, params: BaseModel) -> ToolOutput:
        self.pid_file.write_text(str(os.getpid()))
        end = time.monotonic() + 5.0
        while time.monotonic() < end:
            pass
        self.done_file.write_text("finished")
        return ToolOutput(message="done")


def test_process_isolated_call_is_killed_on_timeout(tmp_path):
    tool = Spin(tmp_path / "pid", tmp_path / "done")
    result = ToolRegistry([tool], timeout_s=0.5).call(Action(tool="spin", params={}), None)
    assert result.error_kind == "timeout" and "worker process was stopped" in result.error
    assert result.seconds < 2.0
    pid = int(tool.pid_file.read_text())
    assert pid != os.getpid()
    with pytest.raises(ProcessLookupError):  # killed and reaped, not running on
        os.kill(pid, 0)
    assert not tool.done_file.exists()


def test_process_isolated_call_returns_output_and_errors(tmp_path):
    class Echo:
        name, description, modality, params_model, isolation = "echo", "echo", None, NoParams, "process"

        def run(self, image, params):
            return ToolOutput(message=f"from {os.getpid()}")

    class Boom(Echo):
        name = "boom"

        def run(self, image, params):
            raise RuntimeError("backend exploded")

    registry = ToolRegistry([Echo(), Boom()], timeout_s=30)
    ok = registry.call(Action(tool="echo", params={}), None)
    assert ok.ok and ok.output.message != f"from {os.getpid()}"
    failed = registry.call(Action(tool="boom", params={}), None)
    assert failed.error_kind == "tool_error" and "RuntimeError: backend exploded" in failed.error


def test_spa_gan_checks_for_cancellation_between_tiles():
    from geopilot.cancellation import CancelToken, ToolCancelled, cancel_scope

    token = CancelToken()
    token.cancel("timed out after 1 s")
    with cancel_scope(token), pytest.raises(ToolCancelled, match="timed out"):
        SpaGan.tiny(tile_size=16).generate(np.zeros((3, 40, 40), dtype=np.float32))


def test_image_free_thread_tool_runs_without_an_image():
    class Const:
        name, description, modality, params_model = "const", "constant", None, NoParams

        def run(self, image, params):
            return ToolOutput(message="42")

    result = ToolRegistry([Const()], timeout_s=5).call(Action(tool="const", params={}), image=None)
    assert result.ok and result.output.message == "42"


@pytest.mark.slow
def test_twenty_timed_out_calls_leave_no_work_and_no_artefacts(tmp_path):
    """Must show: 20 calls that all time out under a 1 s limit; 2 s after they start the process's CPU time has
    stopped growing and the artefact folder is empty."""
    artifacts = tmp_path / "artifacts"
    registry, image = cloud_registry(artifacts, timeout_s=1.0, side=512)
    results: list = [None] * 20
    started = time.monotonic()

    def call(index: int) -> None:
        results[index] = registry.call(CALL, image)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(r.error_kind == "timeout" and "did not stop" not in r.error for r in results), [r.error for r in results]
    time.sleep(max(0.0, 2.0 - (time.monotonic() - started)))
    growth = cpu_growth(2.0)
    print(f"returned after {max(r.seconds for r in results):.2f} s; CPU over 2 s after: {growth:.3f} s")
    assert growth < 0.1
    assert not artifacts.exists() or list(artifacts.iterdir()) == []
