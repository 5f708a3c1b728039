"""The GPU sampler: its thread, timeline CSV and summary, the sources and the process tree."""

from __future__ import annotations

import itertools
import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pynvml
import pytest

from tests.gpuhost import hosts
from tests.gpuhost.standin import write_host
from tuner.errors import ConfigError, GpuReadError, GpuSamplingUnavailable, GpuTimelineError
from tuner.serving.gpu_sampler import (
    NOT_SAMPLED_NOTE,
    DeviceReading,
    GpuSample,
    GpuSampler,
    GpuSource,
    GpuSourceKind,
    NoneSource,
    NvmlSource,
    ProcessTree,
    SimSource,
    make_source,
    process_tree,
    read_timeline,
    release_watch,
    summarize,
    wait_until_released,
)

pytestmark = pytest.mark.timeout(30)

GiB = 1024**3
TOTAL = 80 * GiB
StandIn = Callable[..., ModuleType]


class FakeGpuSource:
    """A fake GpuSource: device 0 whose used memory grows by 1 GiB a read; may fail reads."""

    name = "fake"

    def __init__(self, *, fail_every: int = 0, devices: int = 1) -> None:
        self.fail_every = fail_every
        self.devices = devices
        self.reads = 0
        self.opened = self.closed = False
        self.pids_seen: list[frozenset[int]] = []
        self.read_threads: set[str] = set()

    def open(self) -> None:
        self.opened = True

    def read(self, pids: frozenset[int]) -> list[DeviceReading]:
        self.reads += 1
        self.pids_seen.append(pids)
        self.read_threads.add(threading.current_thread().name)
        if self.fail_every and self.reads % self.fail_every == 0:
            raise GpuReadError(f"fake read {self.reads} failed")
        used = min(self.reads, 79) * GiB
        return [
            DeviceReading(
                device_index=index,
                total_bytes=TOTAL,
                used_bytes=used + index,
                free_bytes=TOTAL - used - index,
                utilization_percent=float(self.reads % 100),
                power_watts=100.0 + index,
                temperature_c=None if index else 55.0,
                process_used_bytes=used // 2,
            )
            for index in range(self.devices)
        ]

    def close(self) -> None:
        self.closed = True


def sample(t_s: float, used: int, *, device: int = 0, total: int = TOTAL, **kw: Any) -> GpuSample:
    fields: dict[str, Any] = {
        "utilization_percent": 50.0,
        "power_watts": 300.0,
        "temperature_c": 60.0,
        "process_used_bytes": used // 2,
    }
    fields.update(kw)
    return GpuSample(
        t_s=t_s,
        device_index=device,
        total_bytes=total,
        used_bytes=used,
        free_bytes=total - used,
        **fields,
    )


# --- the protocol --------------------------------------------------------------------------


def test_sources_satisfy_the_protocol() -> None:
    sources: list[GpuSource] = [
        FakeGpuSource(),
        NoneSource(),
        NvmlSource(None),
        SimSource("http://127.0.0.1:1"),
    ]
    assert [s.name for s in sources] == ["fake", "none", "nvml", "sim"]


# --- NoneSource ----------------------------------------------------------------------------


def test_none_source_says_memory_was_not_sampled() -> None:
    with GpuSampler(NoneSource(), interval_s=0.01) as sampler:
        time.sleep(0.05)
    summary = sampler.stop()
    assert summary.source == "none"
    assert summary.samples == 0
    assert summary.note == NOT_SAMPLED_NOTE
    assert "not sampled" in summary.note
    assert summary.peak_used_bytes is None and summary.headroom_bytes is None
    assert summary.errors == 0


# --- NvmlSource ----------------------------------------------------------------------------


def test_nvml_without_a_driver_is_one_clear_line() -> None:
    source = NvmlSource(None)
    try:
        source.open()
    except GpuSamplingUnavailable as exc:
        message = str(exc)
        assert "\n" not in message
        assert "NVML" in message and "--gpu-source sim or none" in message
        assert isinstance(exc.__cause__, pynvml.NVMLError)
    else:
        source.close()
        pytest.skip("NVML initialised: this machine has an NVIDIA driver")


def _host_pair() -> dict[str, Any]:
    """Two 80 GiB devices: 10 and 20 GiB used; our pids 100 and 101 on device 0 beside
    another job's 999 and a process whose memory NVML cannot report."""
    host = {
        "devices": [
            {"name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-0000000{i}-aaaa", "total_bytes": TOTAL,
             "used_bytes": (i + 1) * 10 * GiB, "compute_capability": [9, 0], "processes": []}
            for i in range(2)
        ],
        "no_permission": False,
        "state_dir": None,
    }  # fmt: skip
    host["devices"][0]["processes"] = [
        {"pid": 100, "used_bytes": 5 * GiB},
        {"pid": 101, "used_bytes": 1 * GiB},
        {"pid": 999, "used_bytes": 7 * GiB},  # not ours
    ]
    return host


def test_nvml_source_reads_the_visible_devices(standin_nvml: StandIn) -> None:
    nvml = standin_nvml(_host_pair())
    source = NvmlSource(None)
    source.open()
    first, second = source.read(frozenset({100, 101, 102}))
    assert first == DeviceReading(
        device_index=0,
        total_bytes=TOTAL,
        used_bytes=10 * GiB,
        free_bytes=TOTAL - 10 * GiB,
        utilization_percent=50.0,
        power_watts=100.0,
        temperature_c=40.0,
        process_used_bytes=6 * GiB,
    )
    assert second.device_index == 1 and second.used_bytes == 20 * GiB
    assert source.read(frozenset())[0].process_used_bytes == 0
    source.close()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()  # the source shut NVML down again


def test_nvml_source_wraps_read_errors_and_checks_indices(
    standin_nvml: StandIn, tmp_path: Path
) -> None:
    nvml = standin_nvml(_host_pair())
    source = NvmlSource([1])
    source.open()
    assert [r.device_index for r in source.read(frozenset())] == [1]
    host = _host_pair()
    host["devices"][1]["total_bytes"] = None  # the driver stops reporting its memory
    write_host(host, tmp_path / "nvml-host.json")
    with pytest.raises(GpuReadError, match="NVML read failed: Not Supported") as info:
        source.read(frozenset())
    assert isinstance(info.value.__cause__, nvml.NVMLError)
    source.close()
    with pytest.raises(ConfigError, match=r"device index 2 does not exist.*indices 0 to 1"):
        NvmlSource([0, 2]).open()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()  # the failed open shut NVML down again


def test_the_sampler_reads_only_the_visible_gpu(standin_nvml: StandIn) -> None:
    """Device 0 carries another job's 40 GiB; with CUDA_VISIBLE_DEVICES=1 it is never sampled."""
    standin_nvml(hosts.h100_nvl_pair(), visible="1")
    with GpuSampler(make_source("nvml"), interval_s=0.01) as sampler:
        time.sleep(0.1)
    summary = sampler.stop()
    assert summary.samples > 0 and summary.devices == 1
    assert {s.device_index for s in sampler.samples} == {1}
    assert max(s.used_bytes for s in sampler.samples) < hosts.OTHER_JOB_BYTES
    assert summary.headroom_bytes is not None
    assert summary.headroom_bytes > hosts.H100_NVL_BYTES - hosts.OTHER_JOB_BYTES


def test_the_sampler_reads_a_server_given_its_own_devices(standin_nvml: StandIn) -> None:
    standin_nvml(hosts.h100_quad(), visible="0,1")
    source = make_source("nvml", visible="2,3")  # tuner serve --cuda-visible-devices 2,3
    source.open()
    try:
        assert [r.device_index for r in source.read(frozenset())] == [2, 3]
    finally:
        source.close()


def test_a_mig_slice_is_sampled_as_its_mig_device(standin_nvml: StandIn) -> None:
    host = hosts.mig_slice()
    standin_nvml(host, visible=host["devices"][0]["mig_devices"][0]["uuid"])
    source = make_source("nvml")
    source.open()
    try:
        (reading,) = source.read(frozenset())
    finally:
        source.close()
    assert reading.total_bytes == hosts.MIG_3G_40GB_BYTES
    assert math.isnan(reading.utilization_percent) and reading.temperature_c is None


def test_no_visible_gpu_is_one_clear_line(standin_nvml: StandIn) -> None:
    standin_nvml(hosts.h100_nvl_pair(), visible="")
    with pytest.raises(GpuSamplingUnavailable) as err:
        make_source("nvml").open()
    assert "CUDA_VISIBLE_DEVICES ''" in str(err.value) and "\n" not in str(err.value)


def test_the_release_wait_watches_only_the_servers_gpus(
    standin_nvml: StandIn, tmp_path: Path
) -> None:
    """The server on device 1 is gone; another job on device 0 grows meanwhile. The wait
    is over at once: device 0 is not the server's."""
    host = hosts.h100_nvl_pair()
    standin_nvml(host, visible="1")
    source = release_watch("nvml")
    assert source is not None
    source.open()
    try:
        baseline = {r.device_index: r.used_bytes for r in source.read(frozenset())}
        host["devices"][0]["used_bytes"] += 20 * GiB  # the other job takes 20 GiB more
        write_host(host, tmp_path / "nvml-host.json")
        started = time.monotonic()
        released = wait_until_released(
            source, baseline_used_bytes=baseline, timeout_s=1.0, interval_s=0.05
        )
    finally:
        source.close()
    assert released and time.monotonic() - started < 0.5
    assert set(baseline) == {1}


# --- SimSource and make_source ---------------------------------------------------------------


def test_sim_source_read_failure_is_a_read_error() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connection refused
        source = SimSource(f"http://127.0.0.1:{port}", timeout_s=0.5)
        source.open()
        with pytest.raises(GpuReadError, match=rf"GET http://127.0.0.1:{port}/sim/gpu failed"):
            source.read(frozenset())
        source.close()


def test_make_source() -> None:
    assert isinstance(make_source("nvml", base_url=None, device_indices=[0]), NvmlSource)
    assert isinstance(make_source("NONE", base_url=None, device_indices=None), NoneSource)
    sim = make_source("sim", base_url="http://127.0.0.1:8000/", device_indices=None)
    assert isinstance(sim, SimSource) and sim.base_url == "http://127.0.0.1:8000"
    with pytest.raises(ConfigError, match=r"unknown GPU source 'dcgm'; accepted: nvml, sim, none"):
        make_source("dcgm", base_url=None, device_indices=None)
    with pytest.raises(ConfigError, match="needs the sim-serve URL"):
        make_source("sim", base_url=None, device_indices=None)
    with pytest.raises(ConfigError, match="not an http"):
        make_source("sim", base_url="localhost:8000", device_indices=None)


def test_auto_follows_the_backend() -> None:
    assert GpuSourceKind.requested("auto", simulated=True) is GpuSourceKind.SIM
    assert GpuSourceKind.requested("auto", simulated=False) is GpuSourceKind.NVML
    assert GpuSourceKind.requested("none", simulated=False) is GpuSourceKind.NONE
    with pytest.raises(ValueError):
        GpuSourceKind.requested("dcgm", simulated=True)


# --- the sampling thread -------------------------------------------------------------------


def test_samples_at_the_interval() -> None:
    source = FakeGpuSource()
    sampler = GpuSampler(source, interval_s=0.1)
    sampler.start()
    time.sleep(0.55)
    summary = sampler.stop()
    times = [s.t_s for s in sampler.samples]
    assert 4 <= len(times) <= 7, times  # 10 Hz for ~0.5 s: t = 0, 0.1, ..., 0.5
    assert times[0] < 0.05
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(0.07 <= gap <= 0.16 for gap in gaps), gaps
    assert summary.samples == len(times)
    assert source.opened and source.closed
    assert source.read_threads == {"gpu-sampler"}


def test_stop_is_prompt_even_with_a_long_interval() -> None:
    sampler = GpuSampler(FakeGpuSource(), interval_s=10.0)
    sampler.start()
    time.sleep(0.05)
    started = time.monotonic()
    summary = sampler.stop()
    assert time.monotonic() - started < 0.3
    assert summary.samples == 1
    assert sampler.stop() is summary  # idempotent


def test_timeline_csv_reads_back_equal(tmp_path: Path) -> None:
    path = tmp_path / "gpu.csv"
    with GpuSampler(FakeGpuSource(devices=2), interval_s=0.01, timeline_path=path) as sampler:
        time.sleep(0.15)
    samples = sampler.samples
    assert len(samples) >= 10 and {s.device_index for s in samples} == {0, 1}
    assert read_timeline(path) == samples
    assert path.read_text().splitlines()[0].startswith("t_s,device_index,total_bytes,used_bytes")
    rebuilt = summarize(read_timeline(path), source="fake")
    assert rebuilt == sampler.stop()


def test_read_errors_are_counted_and_sampling_goes_on() -> None:
    source = FakeGpuSource(fail_every=3)
    with GpuSampler(source, interval_s=0.01) as sampler:
        time.sleep(0.3)
        assert sampler._thread is not None and sampler._thread.is_alive()
    summary = sampler.stop()
    assert summary.errors == source.reads // 3 > 2
    assert summary.first_error == "fake read 3 failed"
    assert summary.samples == source.reads - summary.errors


def test_a_failing_disk_drops_the_timeline_not_the_sampling(tmp_path: Path) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    with GpuSampler(FakeGpuSource(), interval_s=0.01, timeline_path=Path("/dev/full")) as sampler:
        time.sleep(0.2)
        assert sampler._thread is not None and sampler._thread.is_alive()
    summary = sampler.stop()
    assert summary.errors == 1
    assert summary.first_error == "cannot write GPU timeline /dev/full: No space left on device"
    assert summary.samples >= 10


def test_summary_of_the_sampler_matches_its_samples() -> None:
    pids = frozenset({1234, 1235})
    with GpuSampler(FakeGpuSource(), interval_s=0.01, pids=lambda: pids) as sampler:
        time.sleep(0.1)
    summary = sampler.stop()
    samples = sampler.samples
    peak = max(s.used_bytes for s in samples)
    assert summary.peak_used_bytes == peak
    assert summary.headroom_bytes == TOTAL - peak
    assert summary.total_bytes == TOTAL
    assert summary.peak_process_used_bytes == peak // 2
    assert summary.mean_power_watts == 100.0
    assert summary.devices == 1


def test_pids_are_asked_before_each_read() -> None:
    source = FakeGpuSource()
    calls = iter(range(1000))
    with GpuSampler(source, interval_s=0.01, pids=lambda: frozenset({next(calls)})):
        time.sleep(0.05)
    assert source.pids_seen[:3] == [frozenset({0}), frozenset({1}), frozenset({2})]


def test_interval_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="interval 0 s"):
        GpuSampler(NoneSource(), interval_s=0)


# --- summaries and timelines ------------------------------------------------------------------


def test_summary_peak_p99_and_headroom() -> None:
    samples = [sample(i * 0.1, i * GiB) for i in range(1, 101)]
    summary = summarize(reversed(samples), source="fake")
    assert summary.samples == 100
    assert summary.peak_used_bytes == 100 * GiB
    assert summary.p99_used_bytes == 99 * GiB  # nearest rank: the 99th of 100
    assert summary.headroom_bytes == TOTAL - 100 * GiB
    assert summary.peak_process_used_bytes == 50 * GiB
    assert summary.peak_utilization_percent == 50.0
    assert summary.note is None


def test_summary_over_devices_is_the_tightest_device() -> None:
    samples = [
        sample(0.0, 30 * GiB, device=0),
        sample(0.0, 20 * GiB, device=1, total=40 * GiB, power_watts=math.nan),
        sample(0.1, 35 * GiB, device=0, utilization_percent=math.nan),
        sample(0.1, 38 * GiB, device=1, total=40 * GiB, power_watts=200.0),
    ]
    summary = summarize(samples, source="fake")
    assert summary.samples == 2 and summary.devices == 2
    assert summary.peak_used_bytes == 38 * GiB
    assert summary.headroom_bytes == 2 * GiB and summary.total_bytes == 40 * GiB
    assert summary.mean_power_watts == pytest.approx((300 + 300 + 200) / 3, abs=1e-3)
    assert summary.peak_utilization_percent == 50.0


def test_timeline_keeps_nan_and_missing_temperature(tmp_path: Path) -> None:
    path = tmp_path / "gpu.csv"

    class OddSource(FakeGpuSource):
        def read(self, pids: frozenset[int]) -> list[DeviceReading]:
            return [
                DeviceReading(0, TOTAL, GiB, TOTAL - GiB, math.nan, math.nan, None, 0),
            ]

    with GpuSampler(OddSource(), interval_s=10, timeline_path=path):
        pass
    (back,) = read_timeline(path)
    assert math.isnan(back.utilization_percent) and math.isnan(back.power_watts)
    assert back.temperature_c is None and back.used_bytes == GiB


def test_read_timeline_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "gpu.csv"
    path.write_text(
        "t_s,device_index,total_bytes,used_bytes,free_bytes,utilization_percent,"
        "power_watts,temperature_c,process_used_bytes\n0.0,0,1,1,0,0.0,0.0,,0\n0.1,0,x,1,0,0,0,,0\n"
    )
    with pytest.raises(GpuTimelineError, match=r"gpu.csv:3: malformed GPU sample"):
        read_timeline(path)
    path.write_text("a,b\n")
    with pytest.raises(GpuTimelineError, match="not a GPU timeline"):
        read_timeline(path)
    with pytest.raises(GpuTimelineError, match="cannot read GPU timeline"):
        read_timeline(tmp_path / "missing.csv")


# --- process tree --------------------------------------------------------------------------


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_process_tree_finds_the_children() -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30"], start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        tree: frozenset[int] = frozenset()
        while time.monotonic() < deadline:
            tree = process_tree(proc.pid)
            if sum(comm(pid) == "sleep" for pid in tree) == 2:
                break
            time.sleep(0.02)
        # Both sleeps, whether sh stayed their parent or exec'd the last one itself.
        assert proc.pid in tree
        assert sum(comm(pid) == "sleep" for pid in tree) == 2, {p: comm(p) for p in tree}
        assert all(os.getsid(pid) == proc.pid for pid in tree)
        assert os.getpid() not in tree
        assert proc.pid in process_tree(os.getpid())
        cached = ProcessTree(proc.pid, refresh_s=60)
        assert cached() == tree
        os.kill(max(tree - {proc.pid}), signal.SIGKILL)
        assert cached() == tree  # not rescanned within refresh_s
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert process_tree(proc.pid) == frozenset()
    assert process_tree(2**22 + 1) == frozenset()  # above pid_max: never a process
