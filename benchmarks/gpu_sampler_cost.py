"""CPU cost of the GPU sampler's thread at 10 Hz and 50 Hz, per source.

For each source and rate the sampler runs for ``--duration-s`` seconds (default 10);
the figure is the sampling thread's own CPU time (``time.thread_time()`` inside the
thread, ``GpuSampler.thread_cpu_s``) as a percentage of one core. Sources:

* ``none``: the floor (the thread waking up and nothing else);
* ``sim``: ``GET /sim/gpu`` of a running ``tuner sim-serve`` (Qwen2.5-7B on H100-80GB,
  idle), over one kept-alive connection; the server's own CPU for answering is shown
  beside it (from /proc);
* ``sim+tree``: the same, with ``pids=ProcessTree(server_pid)`` (a /proc scan at most
  once a second), as a trial runs it;
* ``sim+scan``: the same, with ``pids=lambda: process_tree(server_pid)``: a /proc scan
  every sample (its cost grows with the number of processes on the machine);
* ``nvml``: the real driver, where there is one; otherwise the line says it is unavailable.

Run: ``python benchmarks/gpu_sampler_cost.py [--duration-s 10]`` (Linux).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tuner.errors import GpuSamplingUnavailable
from tuner.serving.gpu_sampler import (
    GpuSampler,
    GpuSource,
    NoneSource,
    NvmlSource,
    ProcessTree,
    SimSource,
    process_tree,
)

RATES_HZ = (10, 50)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process, from /proc/<pid>/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def start_sim_serve(log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "tuner.cli",
        "sim-serve",
        "--model",
        "qwen2.5-7b",
        "--gpu",
        "H100-80GB",
        "--max-model-len",
        "4096",
        "--port",
        str(port),
        "--startup-delay",
        "0.1",
    ]
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"sim-serve exited with {proc.returncode}; see {log_path}")
        try:
            with opener.open(f"{url}/health", timeout=1) as response:
                if response.status == 200:
                    return proc, url
        except OSError:
            pass
        time.sleep(0.05)
    stop(proc)
    raise SystemExit(f"sim-serve not healthy after 30 s; see {log_path}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def measure(
    label: str,
    source: GpuSource,
    rate_hz: int,
    duration_s: float,
    *,
    pids: Callable[[], frozenset[int]] = lambda: frozenset(),
    server_pid: int | None = None,
) -> None:
    sampler = GpuSampler(source, interval_s=1.0 / rate_hz, pids=pids)
    server_cpu_start = process_cpu_s(server_pid) if server_pid else 0.0
    started = time.monotonic()
    sampler.start()
    time.sleep(duration_s)
    summary = sampler.stop()
    wall_s = time.monotonic() - started
    thread_pct = 100 * sampler.thread_cpu_s / wall_s
    wakeups = int(wall_s * rate_hz) + 1
    us_per_wakeup = 1e6 * sampler.thread_cpu_s / wakeups
    server = ""
    if server_pid:
        server_pct = 100 * (process_cpu_s(server_pid) - server_cpu_start) / wall_s
        server = f"   server {server_pct:5.2f}%"
    print(
        f"{label:<9} {rate_hz:>3} Hz   sampler thread {thread_pct:5.2f}% of one core"
        f"   ({us_per_wakeup:6.0f} µs CPU/wake-up, {summary.samples} samples,"
        f" {summary.errors} errors){server}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=10.0)
    args = parser.parse_args()
    duration_s: float = args.duration_s
    print(f"GPU sampler CPU cost, {duration_s:g} s per rate and source ({os.cpu_count()} CPUs)")

    for rate in RATES_HZ:
        measure("none", NoneSource(), rate, duration_s)

    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_sim_serve(Path(tmp) / "sim-serve.log")
        try:
            for rate in RATES_HZ:
                measure("sim", SimSource(url), rate, duration_s, server_pid=proc.pid)
            for rate in RATES_HZ:
                tree = ProcessTree(proc.pid)
                measure(
                    "sim+tree", SimSource(url), rate, duration_s, pids=tree, server_pid=proc.pid
                )
            for rate in RATES_HZ:
                measure(
                    "sim+scan",
                    SimSource(url),
                    rate,
                    duration_s,
                    pids=lambda: process_tree(proc.pid),
                    server_pid=proc.pid,
                )
            processes = sum(entry.isdigit() for entry in os.listdir("/proc"))
            print(f"({processes} processes on this machine for the /proc scans)")
        finally:
            stop(proc)

    try:
        NvmlSource(None).open()
    except GpuSamplingUnavailable as exc:
        print(f"nvml      not measured: {exc}")
        return
    for rate in RATES_HZ:
        measure("nvml", NvmlSource(None), rate, duration_s, pids=ProcessTree(os.getpid()))


if __name__ == "__main__":
    main()
