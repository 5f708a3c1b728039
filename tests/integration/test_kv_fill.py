"""Warm-up by KV-cache fill: requests of the workload's own lengths until the cache is that full."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.serving.live_server import run_trial
from tuner.serving.processes import ChildRegistry
from tuner.serving.server import Backend, LaunchSpec
from tuner.vllm.memory import ServingParams
from workloads.spec import parse_workload

pytestmark = pytest.mark.integration

WORKLOAD = """
name: fill
api: completions
stream: true
arrival: {kind: poisson, rate_per_s: 20}
prompt_tokens: {kind: uniform, low: 200, high: 400}
output_tokens: {kind: fixed, value: 100}
warmup: {kv_cache_fill: 0.3, max_s: 30}
duration_s: 1
seed: 5
"""


def test_warm_up_fills_the_kv_cache_before_the_window(tmp_path: Path) -> None:
    spec = parse_workload(WORKLOAD, label="fill.yaml")
    # A KV cache of a few thousand tokens fills to 30% within a few seconds. The window after
    # it is short and its answers are short: it only has to measure something (each of its
    # requests is answered behind the fill's own on this small cache).
    launch = LaunchSpec(
        backend=Backend.SIM, model="llama-3.1-8b", gpu="L4",
        params=ServingParams(max_model_len=1024, kv_cache_memory_bytes=600 * 2**20),
        cache_dir=tmp_path / "cache",
    )  # fmt: skip
    registry = ChildRegistry(tmp_path)
    with registry.guard():
        result = run_trial(launch, spec, trial_dir=tmp_path / "trial", registry=registry)
    assert result.kv_fill is not None
    fill = result.kv_fill
    assert fill.target == pytest.approx(0.3)
    assert fill.reached is not None and fill.reached >= 0.3
    assert fill.seconds < 30  # stopped on reaching the target, not at the time limit
    assert fill.requests_sent > 0
    assert (tmp_path / "trial" / "kv-fill" / "requests.jsonl").exists()
    assert result.load is not None and result.load.num_requests > 0
