"""vLLM's CPU build started with KV offloading (issue 35): it refuses, in its own words.

``--kv-offloading-size 1`` (the native backend by default) and the same with
``--kv-offloading-backend native`` on the tiny model: vLLM 0.32's CPU build parses both,
loads the model, then the offloading connector's ``CPUOffloadingSpec.get_worker``
(vllm/v1/kv_offload/cpu/spec.py) raises and the engine exits without serving. The
tuner's own launch path leaves the knobs out on the CPU build with those words
(``tuner.search.context.CPU_BUILD_REFUSAL``), which this pins against the real build.
"""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from tests.vllm_cpu.conftest import BLOCK_SIZE, MAX_MODEL_LEN, TINY_MODEL, VLLM_CMD
from tuner.search.context import CPU_BUILD_REFUSAL
from tuner.vllm.platform import CPU_KV_CACHE_ENV

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.integration, pytest.mark.timeout(900)]

EXIT_TIMEOUT_S = 600
CASES = {
    "size": ("--kv-offloading-size", "1"),
    "size-native": ("--kv-offloading-size", "1", "--kv-offloading-backend", "native"),
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def exits() -> dict[str, subprocess.CompletedProcess[str]]:
    """Both started at once (each startup is mostly one core's work), then awaited."""
    env = {**os.environ, CPU_KV_CACHE_ENV: "1"}
    base = (
        *VLLM_CMD, "--model", str(TINY_MODEL), "--block-size", str(BLOCK_SIZE),
        "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager",
    )  # fmt: skip
    procs = {
        name: subprocess.Popen(
            [*base, "--port", str(_free_port()), *flags],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, flags in CASES.items()
    }
    done = {}
    try:
        for name, proc in procs.items():
            out, _ = proc.communicate(timeout=EXIT_TIMEOUT_S)
            done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, None)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return done


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_cpu_build_refuses_kv_offloading(
    exits: dict[str, subprocess.CompletedProcess[str]], case: str
) -> None:
    done = exits[case]
    tail = done.stdout[-3000:]
    assert done.returncode != 0, tail
    assert "'kv_offloading_size': 1.0" in done.stdout, tail  # the flag was parsed, not refused
    assert CPU_BUILD_REFUSAL in done.stdout, tail
    assert "Application startup complete" not in done.stdout, tail
