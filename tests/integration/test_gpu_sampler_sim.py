"""The GPU sampler against a running `tuner sim-serve`, read through its /sim/gpu endpoint."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.simserver import start_sim
from tuner.serving.gpu_sampler import GpuSampler, ProcessTree, SimSource, read_timeline, summarize
from tuner.vllm.gpus import get_gpu

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def sim_server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """sim-serve on a free port, in its own process group, its output in a log file."""
    args = ("--model", "qwen2.5-7b", "--gpu", "H100-80GB", "--max-model-len", "4096")
    server = start_sim(args, tmp_path / "sim-serve.log")
    try:
        yield server.proc, server.url
    finally:
        server.stop()


def stream_completion(url: str, max_tokens: int) -> int:
    body = {
        "model": "qwen2.5-7b",
        "prompt": " ".join(f"w{i}" for i in range(200)),
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    events = 0
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as response:
        response.raise_for_status()
        for line in response.iter_lines():  # read to the end: leaving early aborts the request
            events += line.startswith("data: {")
    return events


def test_sim_source_samples_the_virtual_gpu(
    sim_server: tuple[subprocess.Popen[bytes], str], tmp_path: Path
) -> None:
    proc, url = sim_server
    timeline = tmp_path / "gpu.csv"
    sampler = GpuSampler(
        SimSource(url),
        interval_s=0.05,  # 20 Hz
        timeline_path=timeline,
        pids=ProcessTree(proc.pid),
    )
    with sampler:
        started = time.monotonic()
        events = sum(stream_completion(url, 40) for _ in range(3))
        time.sleep(max(0.0, 0.5 - (time.monotonic() - started)))
    summary = sampler.stop()
    reported = httpx.get(f"{url}/sim/gpu", timeout=5).json()

    assert events >= 3 * 40
    assert summary.errors == 0, summary.first_error
    assert summary.samples > 5
    samples = sampler.samples
    assert all(s.used_bytes <= s.total_bytes for s in samples)
    assert all(s.free_bytes == s.total_bytes - s.used_bytes for s in samples)
    assert summary.peak_used_bytes == reported["used_bytes"]
    assert summary.total_bytes == get_gpu("H100-80GB").nvml_total_bytes
    assert summary.headroom_bytes == summary.total_bytes - reported["used_bytes"]
    # The server is the watched process: NVML-style per-process memory is its own.
    assert reported["process_pid"] == proc.pid
    assert summary.peak_process_used_bytes == reported["process_used_bytes"]
    assert summary.peak_utilization_percent is not None and summary.peak_utilization_percent > 0
    assert summary.mean_power_watts is not None and summary.mean_power_watts >= 70
    assert read_timeline(timeline) == samples
    assert summarize(read_timeline(timeline), source="sim") == summary
