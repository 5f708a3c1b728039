"""The rendered warm-up script against a real `tuner sim-serve`, run by the system Python.

What the server received (``/sim/requests``: each request's prompt tokens as the server
counted them and its tokens) is compared with the plan: the prompts within a few tokens
(they are built by the word from the server's /tokenize counts), the answers exact.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.integration.simserver import SimServer, start_sim
from tuner.serving.server import free_port
from tuner.warmup import QUANTILES, WarmupPlan, warmup_plan, warmup_script
from workloads.lengths import sample_lengths
from workloads.spec import parse_workload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# The system Python without site-packages: the script must need nothing but the stdlib.
PYTHON = shutil.which("python3") or sys.executable
MODEL = "warm-model"
API_KEY = "warm-key"
SERVER = (
    "--model", "llama-3.1-8b", "--gpu", "H100-80GB", "--served-model-name", MODEL,
    "--enable-prefix-caching",
)  # fmt: skip

COMPLETIONS = """
name: code-review
api: completions
arrival: {kind: poisson, rate_per_s: 4}
prompt_tokens: {kind: lognormal, median: 300, sigma: 0.6, low: 16, high: 1500}
output_tokens: {kind: uniform, low: 8, high: 48}
shared_prefix: {system_prompt_tokens: 200, fraction: 0.5, distinct_prompts: 2}
seed: 11
"""

CHAT = """
name: assistant
api: chat
arrival: {kind: poisson, rate_per_s: 2}
prompt_tokens: {kind: lognormal, median: 120, sigma: 0.5, low: 8, high: 600}
output_tokens: {kind: lognormal, median: 30, sigma: 0.4, low: 4, high: 80}
shared_prefix: {system_prompt_tokens: 100, fraction: 0.8}
sessions: {turns: {kind: uniform, low: 1, high: 3}, think_time_s: 2, max_context_tokens: 3000}
seed: 12
"""

FILL = """
name: fill
api: completions
arrival: {kind: poisson, rate_per_s: 20}
prompt_tokens: {kind: uniform, low: 300, high: 500}
output_tokens: {kind: fixed, value: 150}
seed: 5
"""


def script_for(plan: WarmupPlan, tmp_path: Path) -> Path:
    path = tmp_path / "warmup.py"
    path.write_text(warmup_script(plan))
    return path


def run_script(
    script: Path, *args: str, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python3 -I -S warmup.py ARGS`` with VLLM_API_KEY set, as in the serving container."""
    env = {**os.environ, "VLLM_API_KEY": API_KEY}
    return subprocess.run(
        [PYTHON, "-I", "-S", str(script), *args],
        capture_output=True, text=True, timeout=timeout_s, env=env, check=False,
    )  # fmt: skip


def received(server: SimServer, before: set[str] | None = None) -> dict[int, dict[str, Any]]:
    """The warm-up's requests the server finished (not in ``before``), by their number."""
    truth = httpx.get(f"{server.url}/sim/requests", timeout=10).json()["requests"]
    return {
        int(t["request_id"].rsplit("-", 1)[1]): t
        for t in truth
        if t["request_id"].startswith("warmup-") and t["request_id"] not in (before or set())
    }


def ids(server: SimServer) -> set[str]:
    truth = httpx.get(f"{server.url}/sim/requests", timeout=10).json()["requests"]
    return {t["request_id"] for t in truth}


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stdout.strip().splitlines()
    return lines[-1] if lines else ""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    """One sim-serve with an API key, as vLLM behind a Secret (the script sends the key)."""
    log_path = tmp_path_factory.mktemp("warmup") / "sim-serve.log"
    sim = start_sim((*SERVER, "--max-model-len", "8192", "--api-key", API_KEY), log_path)
    try:
        yield sim
    finally:
        sim.stop()


@pytest.mark.parametrize("workload", [COMPLETIONS, CHAT], ids=["completions", "multi-turn-chat"])
def test_warmup_lengths_follow_the_workload(
    server: SimServer, tmp_path: Path, workload: str
) -> None:
    spec = parse_workload(workload, label="warm.yaml")
    plan = warmup_plan(spec, MODEL, max_requests=20, concurrency=4)
    hits_before = server.counter("vllm:prefix_cache_hits_total")
    before = ids(server)
    result = run_script(script_for(plan, tmp_path), "--url", server.url, "--timeout-s", "100")
    assert result.returncode == 0, result.stdout + result.stderr
    assert all(line.startswith("warm-up: ") for line in result.stdout.splitlines())
    assert last_line(result).startswith("warm-up: done: 20 requests answered")
    assert "stopped: max_requests 20 sent" in last_line(result)

    got = received(server, before)
    assert sorted(got) == list(range(20))  # stopped at max_requests, every one answered
    for number, truth in got.items():
        wanted = plan.requests[number % len(plan.requests)]
        assert len(truth["token_times_s"]) == wanted.output_tokens  # ignore_eos: all of them
        assert abs(truth["prompt_tokens"] - wanted.prompt_tokens) <= 2, (number, wanted)
    # The shared prefixes went out as identical text: the server's prefix cache hit on them.
    assert server.counter("vllm:prefix_cache_hits_total") > hits_before
    # And so the server saw the workload's own distribution at its quantiles.
    first_pass = [got[i] for i in range(len(QUANTILES))]
    outputs = sorted(len(t["token_times_s"]) for t in first_pass)
    spec_outputs = np.quantile(
        sample_lengths(spec.output_tokens, 100_000, np.random.default_rng(0)), QUANTILES
    )
    assert outputs == pytest.approx(spec_outputs, rel=0.2, abs=3)
    if spec.sessions is None:  # one request per arrival: the prompts are the spec's own
        own = sorted(
            t["prompt_tokens"] - (200 if plan.requests[i].prefix is not None else 0)
            for i, t in enumerate(first_pass)
        )
        spec_prompts = np.quantile(
            sample_lengths(spec.prompt_tokens, 100_000, np.random.default_rng(0)), QUANTILES
        )
        assert own == pytest.approx(spec_prompts, rel=0.2, abs=3)


def test_a_kv_cache_fill_target_stops_it_before_max_requests(tmp_path: Path) -> None:
    # About 4,800 tokens of KV cache (600 MiB at 128 KiB a token): eight requests of
    # 300-500 prompt tokens fill half of it at once.
    args = (*SERVER, "--max-model-len", "2048", "--kv-cache-memory-bytes", str(600 * 2**20))
    sim = start_sim((*args, "--api-key", API_KEY), tmp_path / "sim-serve.log")
    try:
        spec = parse_workload(FILL, label="fill.yaml")
        plan = warmup_plan(spec, MODEL, max_requests=200, kv_cache_fill=0.5, concurrency=8)
        result = run_script(script_for(plan, tmp_path), "--url", sim.url, "--timeout-s", "100")
        assert result.returncode == 0, result.stdout + result.stderr
        line = last_line(result)
        assert "stopped: KV cache" in line and "target 50% reached" in line, line
        got = received(sim)
        assert 0 < len(got) <= 24  # the first wave or two of eight, far from 200
        assert line.startswith(f"warm-up: done: {len(got)} requests answered")
    finally:
        sim.stop()


def test_probe_mode_fails_before_the_server_is_up_and_passes_once_warm(
    server: SimServer, tmp_path: Path
) -> None:
    plan = warmup_plan(parse_workload(COMPLETIONS, label="warm.yaml"), MODEL, max_requests=4)
    script = script_for(plan, tmp_path)
    marker = tmp_path / "state" / "warmed-up"
    nobody = f"http://127.0.0.1:{free_port()}"  # a server not up yet: nothing listens
    started = time.monotonic()
    down = run_script(script, "--url", nobody, "--probe", str(marker))
    assert down.returncode == 1 and time.monotonic() - started < 10
    assert "/health does not answer yet" in down.stdout and not marker.exists()

    before = ids(server)
    warm = run_script(script, "--url", server.url, "--probe", str(marker))
    assert warm.returncode == 0, warm.stdout + warm.stderr
    assert marker.exists() and len(received(server, before)) == 4

    before = ids(server)
    again = run_script(script, "--url", server.url, "--probe", str(marker))
    assert again.returncode == 0 and again.stdout == ""
    assert received(server, before) == {}  # warm already: nothing sent


def test_server_errors_end_it_in_one_line(server: SimServer, tmp_path: Path) -> None:
    plan = warmup_plan(parse_workload(COMPLETIONS, label="warm.yaml"), "no-such-model")
    result = run_script(script_for(plan, tmp_path), "--url", server.url)
    assert result.returncode == 1
    assert result.stderr == ""
    line = last_line(result)
    assert line.startswith("warm-up: failed: request ")
    assert "HTTP 404: The model `no-such-model` does not exist." in line
