"""`tuner trial` and `tuner bench` end to end against the simulated engine."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.integration.simserver import start_sim
from tuner.serving.processes import group_alive

pytestmark = pytest.mark.integration


def tuner(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def test_a_trial_measures_what_the_server_counted(tmp_path: Path) -> None:
    out = tuner(
        "trial", "--model", "qwen2.5-7b", "--max-model-len", "16384", "--workload", "chat",
        "--rate", "4", "--duration", "8", "--sim-startup-delay", "0.1", "--out", str(tmp_path), "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(out.stdout)
    assert data["outcome"] == "ready"
    load, server = data["load"], data["server"]
    assert load["num_requests"] > 20 and load["num_errors"] == 0
    # Warm-up finished before the window: client and server count the same tokens.
    assert load["output_tokens"] == server["generation_tokens"] > 0
    assert load["prompt_tokens"] == server["prompt_tokens"]
    for name in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        assert set(load[name]) >= {"p50", "p90", "p99"}
    assert 0 < load["ttft_ms"]["p50"] <= load["ttft_ms"]["p99"]
    assert (
        data["gpu"]["source"] == "sim"
        and data["gpu"]["peak_used_bytes"] <= data["gpu"]["total_bytes"]
    )
    assert server["prefix_cache_hit_rate"] is not None and server["prefix_cache_hit_rate"] > 0
    for name in ("server.log", "gpu.csv", "result.json", "load/requests.jsonl", "load/schedule.jsonl",
                 "warmup/requests.jsonl"):  # fmt: skip
        assert (tmp_path / name).exists(), name
    assert json.loads((tmp_path / "children.json").read_text()) == []


def test_a_trial_that_cannot_start_is_an_outcome(tmp_path: Path) -> None:
    out = tuner(
        "trial", "--model", "llama-3.1-8b", "--gpu-memory-utilization", "0.3", "--workload", "chat",
        "--sim-startup-delay", "0.1", "--out", str(tmp_path), "--json",
    )  # fmt: skip
    assert out.returncode == 1
    data = json.loads(out.stdout)
    assert data["outcome"] == "startup_oom"
    assert data["startup"]["failure"]["kind"] == "max_model_len_does_not_fit"
    assert data["load"] is None


def test_a_workload_longer_than_the_context_is_refused_before_launch(tmp_path: Path) -> None:
    out = tuner("trial", "--model", "qwen2.5-7b", "--max-model-len", "2048", "--workload", "rag",
                "--out", str(tmp_path))  # fmt: skip
    assert out.returncode == 2
    assert "max_model_len is 2048" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "server.log").exists()


def test_bad_workload_name_is_one_line(tmp_path: Path) -> None:
    out = tuner("trial", "--model", "qwen2.5-7b", "--workload", "chatt", "--out", str(tmp_path))
    assert out.returncode == 2
    assert (
        "chatt" in out.stderr and "chat" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    )


def test_bench_against_a_running_server(tmp_path: Path) -> None:
    server = start_sim(("--model", "qwen2.5-7b", "--max-model-len", "16384"), tmp_path / "sim.log")
    port = server.port
    try:
        out = tuner("bench", "--url", f"http://127.0.0.1:{port}", "--workload", "mixed-long-short",
                    "--rate", "10", "--duration", "8", "--out", str(tmp_path / "bench"), "--json")  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        data = json.loads(out.stdout)
        load = data["load"]
        assert load["num_requests"] > 15 and load["num_errors"] == 0
        assert abs(load["achieved_rate"] - load["offered_rate"]) / load["offered_rate"] < 0.2
        buckets = {b["label"] for b in load["prompt_buckets"] if b["count"]}
        assert len(buckets) >= 2  # long and short requests are reported apart
        # The simulator's ground truth names the same requests (X-Request-Id).
        truth = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/sim/requests").read())
        server_ids = {t["request_id"] for t in truth["requests"]}
        client_ids = {
            json.loads(line)["request_id"]
            for line in Path(data["records"]).read_text().splitlines()
        }
        assert client_ids <= server_ids
        stall = urllib.request.Request(
            f"http://127.0.0.1:{port}/sim/stall", data=b'{"seconds": 0.5}', method="POST"
        )
        assert json.loads(urllib.request.urlopen(stall).read()) == {"stalled_s": 0.5}
    finally:
        server.stop()
    assert not group_alive(server.proc.pid)
