"""`tuner simulate` as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

AZURE = (
    Path(__file__).resolve().parents[3] / "shared" / "traces" / "azure-llm-inference-2023-code.csv"
)


def tuner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, timeout=120
    )


BASE = ["simulate", "--model", "llama-3.1-8b", "--gpu", "H100-80GB", "--max-model-len", "8192"]


def test_poisson_workload_reports_load_test_metrics() -> None:
    out = tuner(
        *BASE,
        "--rate",
        "5",
        "--duration",
        "20",
        "--prompt-tokens",
        "500",
        "--output-tokens",
        "50",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["num_finished"] == data["num_requests"] > 60
    assert data["num_failed"] == 0
    assert abs(data["request_throughput"] - 5) < 1.5
    assert data["output_token_throughput"] == data["request_throughput"] * 50
    assert 0 < data["ttft_ms"]["p50"] <= data["ttft_ms"]["p99"]
    assert 0 < data["itl_ms"]["p50"] < 50
    assert data["goodput"] <= data["request_throughput"]


def test_overload_preempts_and_breaks_the_slo() -> None:
    out = tuner(
        *BASE,
        "--kv-cache-memory-bytes",
        str(2 * 1024**3),
        "--rate",
        "40",
        "--duration",
        "10",
        "--prompt-tokens",
        "2000",
        "--output-tokens",
        "400",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["num_preemptions"] > 0
    assert data["peak_kv_cache_usage"] > 0.9
    assert data["goodput"] < data["request_throughput"]


def test_shared_prefixes_hit_the_cache_and_eviction_policies_compare() -> None:
    out = tuner(
        *BASE,
        "--rate",
        "10",
        "--duration",
        "10",
        "--prompt-tokens",
        "1500",
        "--output-tokens",
        "20",
        "--shared-prefix-tokens",
        "1024",
        "--shared-fraction",
        "0.8",
        "--compare-eviction",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert set(data) == {"lru", "lfu", "fifo", "tiered"}
    assert data["lru"]["prefix_cache_hit_rate"] > 0.4
    no_cache = tuner(
        *BASE,
        "--rate",
        "10",
        "--duration",
        "10",
        "--prompt-tokens",
        "1500",
        "--output-tokens",
        "20",
        "--shared-prefix-tokens",
        "1024",
        "--shared-fraction",
        "0.8",
        "--no-enable-prefix-caching",
        "--json",
    )
    assert json.loads(no_cache.stdout)["prefix_cache_hit_rate"] == 0.0
    assert json.loads(no_cache.stdout)["ttft_ms"]["p50"] > data["lru"]["ttft_ms"]["p50"]


def test_replays_the_azure_trace() -> None:
    out = tuner(*BASE, "--trace", str(AZURE), "--max-requests", "300", "--rate", "4", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["num_requests"] == 300
    assert data["num_finished"] + data["num_failed"] == 300


def test_settings_that_do_not_start_are_one_line() -> None:
    out = tuner("simulate", "--model", "llama-3.1-8b", "--gpu", "L4-24GB", "--rate", "1")
    assert out.returncode == 2
    assert "vLLM would not start with these settings" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_bad_trace_row_is_one_line(tmp_path: Path) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,-5,10\n")
    out = tuner(*BASE, "--trace", str(trace))
    assert out.returncode == 2
    assert "bad.csv:2: ContextTokens -5 is negative" in out.stderr


def test_missing_workload_is_one_line() -> None:
    out = tuner(*BASE)
    assert out.returncode == 2 and "give --trace FILE, --workload NAME, or --rate R" in out.stderr
