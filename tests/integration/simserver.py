"""One way for integration tests to run `tuner sim-serve`: free port, own process group, log file."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tuner.serving.live_server import LiveServer
from tuner.serving.load import LOCAL_LOAD, LoadGenerators
from tuner.serving.processes import ChildRegistry
from tuner.serving.server import Backend, LaunchSpec, free_port
from tuner.vllm.memory import ServingParams

STARTUP_TIMEOUT_S = 20.0


@dataclass
class SimServer:
    proc: subprocess.Popen[bytes]
    log_path: Path
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def wait_healthy(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"sim-serve exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        pytest.fail(f"sim-serve not healthy after {timeout_s} s:\n{self.tail()}")

    def wait_exit(self, timeout_s: float = STARTUP_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"sim-serve still running after {timeout_s} s:\n{self.tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=5.0).text

    def counter(self, name: str) -> float:
        match = re.search(
            rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", self.metrics(), re.MULTILINE
        )
        assert match, f"{name} not in /metrics"
        return float(match.group(1))


# ``launch(*args, healthy=True)``: a sim-serve subprocess, stopped after the test (the
# ``launch`` fixture of tests/integration/conftest.py).
Launch = Callable[..., SimServer]


def spawn_sim(args: tuple[str, ...], log_path: Path) -> SimServer:
    """sim-serve with args on a free port (startup delay 0.1 s unless args say otherwise)."""
    port = free_port()
    command = [sys.executable, "-m", "tuner.cli", "sim-serve", "--port", str(port)]
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [*command, "--startup-delay", "0.1", *args],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return SimServer(proc, log_path, port)


def start_sim(args: tuple[str, ...], log_path: Path) -> SimServer:
    """spawn_sim, then wait until /health answers (stopping it if it never does)."""
    server = spawn_sim(args, log_path)
    try:
        server.wait_healthy()
    except BaseException:
        server.stop()
        raise
    return server


@contextmanager
def live_sim(
    base: Path, params: ServingParams, *, gpu: str = "L4", generators: LoadGenerators = LOCAL_LOAD
) -> Iterator[LiveServer]:
    """A READY ``LiveServer`` on the simulated engine (llama-3.1-8b) under ``base``, as the
    rate search holds one: its children in their own registry, stopped on exit; its load
    sent by ``generators``."""
    launch = LaunchSpec(
        backend=Backend.SIM, model="llama-3.1-8b", gpu=gpu, params=params,
        cache_dir=base / "cache", sim_startup_delay_s=0.1,
    )  # fmt: skip
    registry = ChildRegistry(base)
    with (
        registry.guard(),
        LiveServer(
            launch, trial_dir=base / "trial", registry=registry, generators=generators
        ) as server,
    ):
        assert server.ready, server.startup
        yield server
