"""Every launch waits for the previous server's GPU memory to be released.

On a GPU host the device memory of a stopped vLLM can stay in use for a moment; a
launch right after would see less free memory than it asks for (a false startup OOM,
worst at the edge probes). Here the physical GPU is replaced by a fake NVML source with
NVML's interface (``GpuSource``) and the simulated engine serves: every launch path
(trials, edge probes, confirmations, ``tuner serve``) must write in its server log that
it waited for the release, through the one factory of memory sources.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tuner.search.context
import tuner.serving.gpu_sampler
from tests.integration.tune_run import SMALL_TUNE_ARGS
from tuner.cli.main import build_parser, main
from tuner.cli.tune import overrides_of
from tuner.search.config import load_config
from tuner.search.tune import run_tune
from tuner.serving.gpu_sampler import DeviceReading

pytestmark = pytest.mark.integration

GiB = 1 << 30
RELEASED = "# tuner: GPU memory released"


class FakeNvml:
    """NVML's interface on a 24 GiB device: a stopped server's memory is freed two reads
    after its process group is gone, as vLLM's workers free theirs a moment late."""

    name = "nvml"
    opened = 0
    baselines = 0

    def __init__(self, device_indices: object = None, *, visible: object = None) -> None:
        self.reads = 0

    def open(self) -> None:
        FakeNvml.opened += 1

    def read(self, pids: frozenset[int]) -> list[DeviceReading]:
        self.reads += 1
        if self.reads == 1 and not pids:
            FakeNvml.baselines += 1
        # Before the launch: 1 GiB used; after the stop: 20 GiB for two more reads.
        used = 1 * GiB if self.reads == 1 or self.reads > 3 else 20 * GiB
        total = 24 * GiB
        return [DeviceReading(0, total, used, total - used, 0.0, 70.0, None, 0)]

    def close(self) -> None:
        pass


@pytest.fixture
def fake_gpu_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tuner.serving.gpu_sampler, "NvmlSource", FakeNvml)
    monkeypatch.setattr(tuner.search.context, "detect_gpu_name", lambda: "NVIDIA L4")
    FakeNvml.opened = FakeNvml.baselines = 0


def _released(log: Path) -> bool:
    return RELEASED in log.read_text(errors="replace")


def test_trials_edge_probes_and_confirmations_wait_for_the_release(
    tmp_path: Path, fake_gpu_host: None
) -> None:
    run_dir = tmp_path / "run"
    args = build_parser().parse_args(
        ["tune", *SMALL_TUNE_ARGS, "--trials", "1", "--max-edge-launches", "1", "--no-twin-search",
         "--backend", "sim", "--gpu-source", "nvml", "--run-dir", str(run_dir)]
    )  # fmt: skip
    config = load_config(None, overrides_of(args))
    lines: list[str] = []
    summary = run_tune(config, lines.append)
    assert summary.backend == "sim", lines
    logs = {
        path.relative_to(run_dir).parts[0]: path for path in sorted(run_dir.rglob("server.log"))
    }
    assert {"trials", "edge"} <= set(logs), sorted(run_dir.rglob("server.log"))
    confirm = [
        p
        for p in run_dir.rglob("server.log")
        if p.parts[len(run_dir.parts)] not in ("trials", "edge")
    ]
    assert confirm, "no confirmation launch"
    every = list(run_dir.rglob("server.log"))
    assert all(_released(log) for log in every), [str(p) for p in every if not _released(p)]
    assert FakeNvml.baselines >= len(every)


def test_serve_waits_for_the_release(tmp_path: Path, fake_gpu_host: None) -> None:
    run_dir = tmp_path / "serve"
    code = main(
        ["serve", "--model", "qwen2.5-7b", "--max-model-len", "4096", "--gpu-source", "nvml",
         "--sim-startup-delay", "0.1", "--run-dir", str(run_dir)]
    )  # fmt: skip
    assert code == 0
    assert _released(run_dir / "server.log")
