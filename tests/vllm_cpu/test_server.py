"""ServerProcess with vLLM's CPU build: startup report, flag probing, load counted, nothing left.

One real server serves the whole module (starting one takes a minute on two cores).
Its last test stops it and checks that nothing of it is left.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.vllm_cpu.conftest import (
    BLOCK_SIZE,
    MAX_MODEL_LEN,
    PYTHON,
    STARTUP_TIMEOUT_S,
    TINY_MODEL,
    VLLM_CMD,
    TinyModel,
    max_tokens_of,
    write_workload,
)
from tuner.serving.gpu_sampler import process_tree
from tuner.serving.processes import ChildRegistry, group_alive
from tuner.serving.prometheus_scrape import scrape
from tuner.serving.server import Backend, LaunchSpec, ServerProcess, StartupResult, TrialOutcome
from tuner.serving.vllm_install import is_cpu_build
from tuner.vllm.memory import ServingParams

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.integration, pytest.mark.timeout(900)]

KV_CACHE_BYTES = 8_000_000  # a few hundred blocks of the tiny model: small, and not whole GiB
MAX_NUM_SEQS = 8
SHM = Path("/dev/shm")


@dataclass
class Live:
    server: ServerProcess
    startup: StartupResult
    run_dir: Path
    tree: frozenset[int]  # the server's processes while it served
    shm_created: frozenset[str]  # shared-memory segments that appeared while it started


def _shm() -> frozenset[str]:
    return frozenset(os.listdir(SHM)) if SHM.is_dir() else frozenset()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    run_dir = tmp_path_factory.mktemp("vllm-cpu-server")
    registry = ChildRegistry(run_dir)
    spec = LaunchSpec(
        backend=Backend.VLLM,
        model=str(TINY_MODEL),
        vllm_cmd=VLLM_CMD,
        params=ServingParams(
            block_size=BLOCK_SIZE,
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=MAX_NUM_SEQS,
            kv_cache_memory_bytes=KV_CACHE_BYTES,
            enforce_eager=True,
        ),
        swap_space_gib=4.0,  # a knob this vLLM lacks: must be left out, not fail the launch
        cache_dir=run_dir / "vllm-cache",
        startup_timeout_s=STARTUP_TIMEOUT_S,
    )
    shm_before = _shm()
    server = ServerProcess(spec, registry=registry, log_path=run_dir / "server.log")
    try:
        startup = server.wait_ready()
        tree = process_tree(server.pid) if server.pid is not None else frozenset()
        yield Live(server, startup, run_dir, tree, _shm() - shm_before)
    finally:
        server.stop()
        registry.stop_all()


def _ready(live: Live) -> Live:
    assert live.startup.outcome is TrialOutcome.READY, live.startup.log_excerpt
    return live


def _metrics_text(base_url: str) -> str:
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as response:
        return str(response.read().decode())


def _installed_version() -> str:
    code = "import importlib.metadata as m; print(m.version('vllm-cpu'))"
    return subprocess.run([str(PYTHON), "-c", code], capture_output=True, text=True).stdout.strip()


def test_the_startup_report_reads_the_cpu_kv_cache(live: Live, tiny_model: TinyModel) -> None:
    report = _ready(live).startup.report
    assert report is not None and live.server.cpu_build
    blocks = tiny_model.kv_blocks(KV_CACHE_BYTES)
    tokens = blocks * BLOCK_SIZE
    assert report.kv_cache_device == "cpu"
    assert report.kv_cache_tokens == tokens
    assert report.available_kv_bytes == KV_CACHE_BYTES
    assert report.max_concurrency == pytest.approx(tokens / MAX_MODEL_LEN, abs=0.005)
    assert report.max_concurrency_tokens == MAX_MODEL_LEN == report.max_model_len
    assert report.block_size == BLOCK_SIZE and report.enforce_eager is True
    assert report.vllm_version == _installed_version()
    # vLLM's own count of blocks, from /metrics, is the one the report implies.
    metrics = _metrics_text(live.server.base_url)
    info = re.search(r"^vllm:cache_config_info\{([^}]*)\}", metrics, re.MULTILINE)
    assert info is not None
    assert re.search(rf'\bnum_gpu_blocks="{blocks}"', info[1]), info[1]
    assert live.startup.ready_s is not None and live.startup.ready_s < STARTUP_TIMEOUT_S
    assert live.server.engine_outcome() is None


def test_flags_the_installed_vllm_lacks_are_probed_and_left_out(live: Live) -> None:
    _ready(live)
    from tuner.serving.server import probe_vllm_flags

    accepted = probe_vllm_flags(VLLM_CMD)
    knobs = {"--block-size", "--max-num-seqs", "--max-model-len", "--kv-cache-memory-bytes",
             "--gpu-memory-utilization", "--enforce-eager", "--no-enable-chunked-prefill"}  # fmt: skip
    assert knobs <= accepted
    assert "--swap-space" not in accepted
    assert [d.flag for d in live.server.dropped] == ["--swap-space"]
    assert "--swap-space" not in live.server.command
    flags = {arg for arg in live.server.command if arg.startswith("--")}
    assert flags <= accepted, flags - accepted
    # vLLM received exactly the knobs that were kept.
    args = re.search(r"non-default args: (\{.*\})", live.server.log_text())
    assert args is not None and "swap_space" not in args[1]
    assert f"'kv_cache_memory_bytes': {KV_CACHE_BYTES}" in args[1]


def test_the_search_space_adapts_to_the_probed_flags(live: Live) -> None:
    _ready(live)
    from tuner.serving.server import probe_vllm_flags
    from tuner.vllm.gpus import get_gpu
    from tuner.vllm.models import resolve_model
    from tuner.vllm.space import Knob, build_space
    from tuner.vllm.versions import VllmVersion

    accepted = probe_vllm_flags(VLLM_CMD)
    model, gpu = resolve_model(str(TINY_MODEL)), get_gpu("H100-80GB")
    installed = VllmVersion.parse(".".join(_installed_version().split(".")[:2]))
    space = build_space(model=model, gpu=gpu, version=installed, accepted_flags=accepted)
    assert space.ranges and all(r.knob.flag in accepted for r in space.ranges)
    # A release table that still has --swap-space meets the installed vLLM, which does not:
    # the probe takes the knob out, and says so.
    old = build_space(
        model=model, gpu=gpu, version=VllmVersion.parse("0.17"), accepted_flags=accepted
    )
    left = {item.knob: item.reason for item in old.left_out}
    assert Knob.SWAP_SPACE in left and "--swap-space" in left[Knob.SWAP_SPACE]
    assert Knob.SWAP_SPACE not in {r.knob for r in old.ranges}
    unprobed = build_space(
        model=model, gpu=gpu, version=VllmVersion.parse("0.17"), accepted_flags=None
    )
    assert Knob.SWAP_SPACE in {r.knob for r in unprobed.ranges}


def test_bench_counts_the_tokens_the_server_counted(live: Live, tmp_path: Path) -> None:
    base_url = _ready(live).server.base_url
    workload = write_workload(tmp_path / "tiny.yaml", rate_per_s=4, duration_s=5, warmup_requests=0)
    before = scrape(base_url)
    out = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "bench", "--url", base_url, "--workload",
         str(workload), "--model-dir", str(TINY_MODEL), "--out", str(tmp_path / "bench"),
         "--json"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    after = scrape(base_url)
    assert out.returncode == 0, out.stderr[-3000:]
    load = json.loads(out.stdout)["load"]
    assert load["num_requests"] >= 10 and load["num_errors"] == 0
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    prompted = after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"]
    assert load["output_tokens"] == generated > 0
    assert load["prompt_tokens"] == prompted > 0
    # ignore_eos: every request got exactly the tokens it asked for.
    assert load["output_tokens"] == max_tokens_of(tmp_path / "bench" / "schedule.jsonl")
    assert 0 < load["ttft_ms"]["p50"] <= load["ttft_ms"]["p99"]
    assert json.loads((tmp_path / "bench" / "children.json").read_text()) == []


def test_stopping_leaves_nothing(live: Live) -> None:
    server = _ready(live).server
    assert server.pid is not None and len(live.tree) >= 2  # API server, engine core, worker
    server.stop()
    assert not group_alive(server.pid)
    left = [pid for pid in live.tree if Path(f"/proc/{pid}").exists()]
    assert left == [], f"processes of the server still running: {left}"
    assert json.loads((live.run_dir / "children.json").read_text()) == []
    assert not (live.shm_created & _shm()), "shared memory the server created is left behind"


def test_the_launch_command_is_recognised_as_the_cpu_build() -> None:
    assert is_cpu_build(VLLM_CMD)
    assert not is_cpu_build((sys.executable, "-m", "tuner.cli"))
