"""``--kv-cache-metrics`` on the simulated engine: a real `tuner sim-serve` exports vLLM's
three KV block residency histograms under vLLM's names, labels and buckets, refuses the
flag as an older vLLM does, and exports its own ground truth of why later turns missed
the prefix cache under ``tuner_sim:`` names (never ``vllm:``)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.integration.simserver import Launch, SimServer
from tuner.serving.processes import ChildRegistry
from tuner.serving.server import Backend, LaunchSpec, ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# 80 GPU blocks of 16 tokens (1280 tokens): one 700-token prompt evicts another's tail.
SMALL_GPU = (
    *("--model", "qwen2.5-7b", "--max-model-len", "1024"),
    *("--kv-cache-memory-bytes", str(80 * 917504), "--time-scale", "0.05"),
)
# vllm/v1/metrics/buckets.py KV_CACHE_RESIDENCY_BUCKETS, as prometheus_client spells them
VLLM_RESIDENCY_LE = [
    "0.001", "0.002", "0.005", "0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "1.0", "2.0",
    "5.0", "10.0", "20.0", "30.0", "60.0", "120.0", "300.0", "600.0", "1200.0", "1800.0",
    "+Inf",
]  # fmt: skip
HISTOGRAMS = (
    "vllm:kv_block_lifetime_seconds",
    "vllm:kv_block_idle_before_evict_seconds",
    "vllm:kv_block_reuse_gap_seconds",
)


def samples(text: str, name: str) -> list[tuple[str, float]]:
    """(label text, value) of every sample of one series name."""
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        metric_name, _, labels = series.partition("{")
        if metric_name == name:
            out.append((labels.rstrip("}"), float(value)))
    return out


def ask(server: SimServer, prompt: str) -> None:
    body = {"prompt": prompt, "max_tokens": 4, "ignore_eos": True}
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text


def words(stem: str, n: int) -> str:
    return " ".join(f"{stem}{i}" for i in range(n))


def test_the_residency_histograms_under_vllms_names_and_buckets(launch: Launch) -> None:
    server = launch(*SMALL_GPU, "--kv-cache-metrics", "--kv-cache-metrics-sample", "1")
    for stem in ("a", "b", "a", "b"):  # each evicts the other's tail
        ask(server, words(stem, 700))
    text = server.metrics()
    for name in HISTOGRAMS:
        assert f"# TYPE {name} histogram" in text
        buckets = samples(text, f"{name}_bucket")
        assert [labels.split('le="')[1].split('"')[0] for labels, _ in buckets] == VLLM_RESIDENCY_LE
        assert all('engine="0"' in labels and 'model_name="' in labels for labels, _ in buckets)
    (lifetime_count,) = samples(text, "vllm:kv_block_lifetime_seconds_count")
    (idle_count,) = samples(text, "vllm:kv_block_idle_before_evict_seconds_count")
    assert lifetime_count[1] > 0 and idle_count[1] == lifetime_count[1]  # one each an eviction
    (lifetime_sum,) = samples(text, "vllm:kv_block_lifetime_seconds_sum")
    (idle_sum,) = samples(text, "vllm:kv_block_idle_before_evict_seconds_sum")
    assert lifetime_sum[1] >= idle_sum[1] > 0
    assert not any(line.startswith("vllm:") and "tuner_sim" in line for line in text.splitlines())


def test_without_the_flag_no_residency_histograms(launch: Launch) -> None:
    server = launch(*SMALL_GPU)
    ask(server, words("a", 700))
    text = server.metrics()
    assert all(f"# TYPE {name} histogram" not in text for name in HISTOGRAMS)
    assert "tuner_sim:prefix_cache_miss_tokens_total" in text  # the simulator's own, always


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        (
            ("--vllm-version", "0.12", "--kv-cache-metrics"),
            2,
            "vllm: error: unrecognized arguments: --kv-cache-metrics",
        ),
        (
            ("--vllm-version", "0.12", "--no-kv-cache-metrics"),
            2,
            "vllm: error: unrecognized arguments: --no-kv-cache-metrics",
        ),
        (
            ("--vllm-version", "0.12", "--kv-cache-metrics-sample", "0.5"),
            2,
            "vllm: error: unrecognized arguments: --kv-cache-metrics-sample 0.5",
        ),
        (
            ("--kv-cache-metrics", "--kv-cache-metrics-sample", "0"),
            1,
            "kv_cache_metrics_sample\n  Input should be greater than 0",
        ),
    ],
)
def test_refused_as_vllm_refuses_it(
    launch: Launch, args: tuple[str, ...], code: int, expected: str
) -> None:
    server = launch(*SMALL_GPU, *args, healthy=False)
    assert server.wait_exit() == code
    assert expected in server.log(), server.log()


def test_a_conversation_that_lost_its_history_is_counted(launch: Launch) -> None:
    server = launch(*SMALL_GPU)
    first_turn = words("a", 500)
    ask(server, first_turn)
    ask(server, words("b", 900))  # a long request in between evicts the first turn
    ask(server, f"{first_turn} {words('c', 100)}")  # the second turn resends the first
    text = server.metrics()
    (continuing,) = samples(text, "tuner_sim:continuing_requests_total")
    (lost,) = samples(text, "tuner_sim:history_evicted_requests_total")
    assert (continuing[1], lost[1]) == (1.0, 1.0)
    lost_tokens = [
        v
        for labels, v in samples(text, "tuner_sim:prefix_cache_miss_tokens_total")
        if 'request="continuing"' in labels and 'cause="evicted_under_way"' in labels
    ]
    # the long request needed 57 of the 79 blocks: the first turn's tail (evicted first, as
    # vLLM frees a request's blocks tail first) went, its head stayed
    assert lost_tokens and 100 <= lost_tokens[0] < 500


def test_a_launch_asks_for_them_where_the_target_has_them(tmp_path: Path) -> None:
    """A tune's launch (``kv_cache_metrics``) passes --kv-cache-metrics to a release that
    has it, and leaves it out of an older one with the reason."""
    registry = ChildRegistry(tmp_path)

    def server(version: str) -> ServerProcess:
        spec = LaunchSpec(
            backend=Backend.SIM, model="qwen2.5-7b", vllm_version=version, kv_cache_metrics=True
        )
        return ServerProcess(spec, registry=registry, log_path=tmp_path / f"{version}.log")

    current = server("0.13")
    assert "--kv-cache-metrics" in current.command and current.dropped == []
    old = server("0.12")
    assert "--kv-cache-metrics" not in old.command
    assert [(d.flag, d.reason) for d in old.dropped] == [
        ("--kv-cache-metrics", "--kv-cache-metrics does not exist before vLLM 0.13")
    ]
