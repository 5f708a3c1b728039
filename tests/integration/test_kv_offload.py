"""KV offloading to CPU memory end to end on the simulated engine: `tuner sim-serve` takes
vLLM's flags, refuses them as the emulated release would, serves a prefix the GPU evicted
from host memory and exports the offloading metrics under vLLM's names; a tune searches
``kv-offloading-size`` and the eviction policy on the twin's virtual clock."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.integration.simserver import Launch, SimServer
from tests.virtual import virtual_tune
from tuner.errors import ConfigError
from tuner.run.evaluation import Evaluation

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# 80 GPU blocks of 16 tokens (1280 tokens): one 700-token prompt evicts another's tail.
SMALL_GPU = (
    *("--model", "qwen2.5-7b", "--max-model-len", "1024"),
    *("--kv-cache-memory-bytes", str(80 * 917504), "--time-scale", "0.05"),
)


def metric(text: str, name: str, **labels: str) -> float | None:
    """The sum of one metric's samples with these labels; None when it is not exported."""
    total: float | None = None
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        metric_name, _, label_text = series.partition("{")
        if metric_name == name and all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            total = (total or 0.0) + float(value)
    return total


def ask(server: SimServer, stem: str) -> dict[str, object]:
    prompt = " ".join(f"{stem}{i}" for i in range(700))
    body = {"prompt": prompt, "max_tokens": 4, "ignore_eos": True}
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    usage: dict[str, object] = response.json()["usage"]
    return usage


def test_a_prefix_the_gpu_evicted_comes_back_from_cpu_memory(launch: Launch) -> None:
    extra = {"kv_connector_extra_config": {"eviction_policy": "arc", "store_threshold": 2}}
    server = launch(
        *SMALL_GPU, "--kv-offloading-size", "1", "--kv-transfer-config", json.dumps(extra)
    )
    for stem in ("a", "b", "a", "b"):  # 'a' is stored on its second pass (threshold 2)
        ask(server, stem)
    before = server.metrics()
    assert metric(before, "vllm:kv_offload_total_bytes_total", transfer_type="CPU_to_GPU") == 0
    usage = ask(server, "a")  # evicted from the GPU by 'b', held in host memory
    text = server.metrics()
    loaded = metric(text, "vllm:kv_offload_total_bytes_total", transfer_type="CPU_to_GPU")
    stored = metric(text, "vllm:kv_offload_total_bytes_total", transfer_type="GPU_to_CPU")
    assert loaded is not None and loaded > 0
    assert stored is not None and stored >= loaded
    assert (metric(text, "vllm:kv_offload_total_time_total", transfer_type="CPU_to_GPU") or 0) > 0
    assert metric(text, "vllm:kv_offload_size_count", transfer_type="CPU_to_GPU") == 1
    # the prompt's head was still on the GPU, its tail (which 'b' evicted) came from host
    # memory: none of it was recomputed
    from_cpu = metric(text, "vllm:external_prefix_cache_hits_total")
    gpu_before = metric(before, "vllm:prefix_cache_hits_total") or 0.0
    from_gpu = (metric(text, "vllm:prefix_cache_hits_total") or 0.0) - gpu_before
    assert from_cpu is not None and from_cpu >= 64
    queries = metric(text, "vllm:external_prefix_cache_queries_total")
    assert queries == 5 * 700  # every request's tokens, looked up in the CPU tier
    assert from_gpu + from_cpu >= 700 - 16 - 1
    assert (metric(text, "vllm:kv_offload_cpu_cache_usage_perc") or 0) > 0
    assert (metric(text, "vllm:kv_offload_stores_skipped_total") or 0) > 0
    assert usage["prompt_tokens"] == 700
    assert "kv_offloading_size" in server.log()  # vLLM's non-default args line


def test_without_offloading_no_offload_metrics(launch: Launch) -> None:
    server = launch(*SMALL_GPU)
    ask(server, "a")
    assert metric(server.metrics(), "vllm:kv_offload_total_bytes_total") is None


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        (
            ("--vllm-version", "0.11", "--kv-offloading-size", "4"),
            2,
            "vllm: error: unrecognized arguments: --kv-offloading-size 4",
        ),
        (
            ("--vllm-version", "0.13", "--kv-offloading-size", "4"),
            1,
            "ValueError: kv_offloading_backend must be specified when kv_offloading_size is "
            "set. Available backends: native, lmcache",
        ),
        (
            ("--kv-offloading-size", "0"),
            1,
            "ValueError: kv_offloading_size must be positive, got 0.0",
        ),
        (
            ("--kv-offloading-size", "4", "--kv-offloading-backend", "disk"),
            2,
            "argument --kv-offloading-backend: invalid choice: 'disk' (choose from 'native', "
            "'lmcache')",
        ),
        (
            ("--kv-offloading-size", "64", "--host-memory-gib", "32"),
            1,
            "RuntimeError: Insufficient space in /dev/shm: 65536 MiB required, 29491 MiB free.",
        ),
        (
            (
                "--kv-offloading-size",
                "4",
                "--kv-transfer-config",
                '{"kv_connector_extra_config": {"eviction_policy": "lfu"}}',
            ),
            2,
            "tuner: error: --kv-transfer-config eviction_policy 'lfu' is not one of vLLM's; "
            "accepted: lru, arc",
        ),
    ],
)
def test_offloading_flags_are_refused_as_vllm_refuses_them(
    launch: Launch, args: tuple[str, ...], code: int, expected: str
) -> None:
    server = launch(*SMALL_GPU, *args, healthy=False)
    assert server.wait_exit() == code
    assert expected in server.log(), server.log()
    assert len(server.log().strip().splitlines()) == 1


def test_a_tune_searches_the_offloading_size_and_policy(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = virtual_tune(
        run_dir, "--knobs", "max-num-seqs,kv-offloading-size,kv-offloading-policy",
        "--space", "kv-offloading-size=0,4", "--space", "max-num-seqs=16",
        "--trials", "3", "--no-edge", "--no-confirm",
    )  # fmt: skip
    assert done.summary.best_trial is not None, done.output
    space = json.loads((run_dir / "tune.json").read_text())["space"]
    evaluations = [
        Evaluation.model_validate_json(p.read_text())
        for p in (run_dir / "trials").glob("*/evaluation.json")
    ]
    sizes = {ev.params.kv_offloading_size_gib for ev in evaluations}
    assert 4.0 in sizes, (sizes, space)
    offloaded = [ev for ev in evaluations if ev.params.kv_offloading_size_gib]
    assert all(ev.flags["kv-offloading-size"] == 4.0 for ev in offloaded)
    trial_dir = Path(offloaded[0].dir)
    log = (trial_dir / "server.log").read_text()
    assert "kv_offloading_size" in log  # sim-serve took the flag at the trial's launch


def test_the_knob_is_left_out_where_the_target_vllm_lacks_it(tmp_path: Path) -> None:
    virtual_tune(
        tmp_path / "run", "--vllm-version", "0.10", "--knobs",
        "max-num-seqs,kv-offloading-size", "--trials", "1", "--no-edge", "--no-confirm",
    )  # fmt: skip
    described = json.loads((tmp_path / "run" / "tune.json").read_text())
    left = {o["knob"]: o["reason"] for o in described["left_out"]}
    assert "0.11.1" in left["kv-offloading-size"], left


def test_a_bad_policy_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        virtual_tune(
            tmp_path / "run", "--knobs", "kv-offloading-size,kv-offloading-policy",
            "--space", "kv-offloading-policy=lru,lfu",
        )  # fmt: skip
    message = str(info.value)
    assert "\n" not in message
    assert "'lfu'" in message and "accepted: lru, arc" in message
