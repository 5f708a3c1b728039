"""ServerProcess against `tuner sim-serve`: outcomes, vLLM's messages, nothing left behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tuner.serving.processes import ChildRegistry, group_alive
from tuner.serving.server import Backend, LaunchSpec, ServerProcess, TrialOutcome
from tuner.vllm.boot import BootState
from tuner.vllm.failures import StartupFailureKind
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams, plan
from tuner.vllm.models import resolve_model
from tuner.vllm.versions import VllmVersion

pytestmark = pytest.mark.integration


def launch(
    tmp_path: Path, *, adapt: bool = True, **kw: object
) -> tuple[ServerProcess, ChildRegistry]:
    registry = ChildRegistry(tmp_path)
    spec = LaunchSpec(backend=Backend.SIM, sim_startup_delay_s=0.1, **kw)  # type: ignore[arg-type]
    return ServerProcess(
        spec, registry=registry, log_path=tmp_path / "server.log", adapt=adapt
    ), registry


def test_fitting_config_is_ready_and_its_report_matches_the_memory_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first start compiles (its own empty compile cache: a cold boot, whatever the
    user's ~/.cache/vllm holds), and its KV cache is what the memory model predicts for a
    cold boot."""
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    params = ServingParams(max_model_len=4096, max_num_seqs=128)
    server, _registry = launch(
        tmp_path, model="qwen2.5-7b", gpu="H100-80GB", params=params,
        cache_dir=tmp_path / "vllm-cache",
    )  # fmt: skip
    try:
        result = server.wait_ready()
        assert result.outcome is TrialOutcome.READY, result.log_excerpt
        expected = plan(
            resolve_model("qwen2.5-7b"), get_gpu("H100-80GB"), params, VllmVersion.current(),
            boot=BootState.COLD,
        )  # fmt: skip
        assert result.report is not None
        assert result.report.boot_state is BootState.COLD
        assert result.report.kv_cache_tokens == expected.kv_cache_tokens
        assert result.report.max_concurrency == expected.max_concurrency
        assert result.ready_s is not None and result.ready_s < 30
        assert server.engine_outcome() is None
    finally:
        server.stop()
    assert server.pid is not None and not group_alive(server.pid)
    assert json.loads((tmp_path / "children.json").read_text()) == []


@pytest.mark.parametrize(
    ("params", "kind"),
    [
        (ServingParams(gpu_memory_utilization=0.3), StartupFailureKind.MAX_MODEL_LEN_DOES_NOT_FIT),
        (ServingParams(gpu_memory_utilization=0.2), StartupFailureKind.NO_MEMORY_FOR_CACHE_BLOCKS),
        (ServingParams(gpu_memory_utilization=1.0), StartupFailureKind.CUDA_OOM_WARMUP),
    ],
)
def test_past_the_edge_is_the_right_startup_oom_within_a_second(
    tmp_path: Path, params: ServingParams, kind: StartupFailureKind
) -> None:
    server, _ = launch(tmp_path, model="llama-3.1-8b", gpu="H100-80GB", params=params)
    server.start()
    assert server._proc is not None
    server._proc.wait(timeout=30)
    exited = time.monotonic()
    result = server.wait_ready()
    assert time.monotonic() - exited < 1.0
    assert result.outcome is TrialOutcome.STARTUP_OOM
    assert result.failure is not None and result.failure.kind is kind
    assert result.failure.message in server.log_text()
    assert result.exit_code not in (None, 0)


def test_a_rejected_flag_is_an_invalid_configuration_not_an_oom(tmp_path: Path) -> None:
    server, _ = launch(tmp_path, adapt=False, model="qwen2.5-7b", swap_space_gib=4.0)
    result = server.wait_ready()
    assert result.outcome is TrialOutcome.INVALID_CONFIG
    assert result.failure is not None and result.failure.kind is StartupFailureKind.FLAG_REJECTED
    assert "unrecognized arguments: --swap-space" in result.failure.message


def test_flags_the_target_version_lacks_are_left_out_with_the_reason(tmp_path: Path) -> None:
    server, _ = launch(
        tmp_path, model="qwen2.5-7b", swap_space_gib=4.0, params=ServingParams(max_model_len=4096)
    )
    assert "--swap-space" not in server.command
    assert [d.flag for d in server.dropped] == ["--swap-space"]
    assert "0.18" in server.dropped[0].reason
    old, _ = launch(tmp_path, model="qwen2.5-7b", swap_space_gib=4.0, vllm_version="0.17")
    assert "--swap-space" in old.command and old.dropped == []


def test_invalid_block_size_for_the_release(tmp_path: Path) -> None:
    server, _ = launch(
        tmp_path, adapt=False, model="qwen2.5-7b", vllm_version="0.11",
        params=ServingParams(block_size=48, max_model_len=4096),
    )  # fmt: skip
    result = server.wait_ready()
    assert result.outcome is TrialOutcome.INVALID_CONFIG
    assert result.failure is not None and "invalid choice: 48" in result.failure.message


def test_engine_death_under_load_is_seen(tmp_path: Path) -> None:
    # 0.998 leaves ~160 MiB beyond the budget; a logprobs row of Qwen's 152k vocabulary
    # takes 1.2 MB, so ~140 requests sampled together run the device out of memory.
    params = ServingParams(max_model_len=4096, gpu_memory_utilization=0.998)
    server, _ = launch(tmp_path, model="qwen2.5-7b", params=params)
    try:
        assert server.wait_ready().outcome is TrialOutcome.READY

        def ask(i: int) -> None:
            body = json.dumps(
                {"model": "qwen2.5-7b", "prompt": f"hello {i}", "max_tokens": 200, "logprobs": 1}
            ).encode()
            request = urllib.request.Request(
                server.base_url + "/v1/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            )
            with contextlib.suppress(OSError):
                urllib.request.urlopen(request, timeout=30).read()

        with ThreadPoolExecutor(max_workers=256) as pool:
            list(pool.map(ask, range(512)))
        died = server.engine_outcome()
        assert died is not None
        assert died.outcome is TrialOutcome.ENGINE_DIED
        assert died.failure is not None and died.failure.kind is StartupFailureKind.RUNTIME_OOM
    finally:
        server.stop()


# --- nothing outlives the harness -------------------------------------------------------


def _harness(run_dir: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "tuner.cli", "serve", "--model", "qwen2.5-7b", "--max-model-len", "4096",
        "--sim-startup-delay", "0.1", "--run-dir", str(run_dir), "--hold",
    ]  # fmt: skip
    return subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def _server_group(run_dir: Path, timeout_s: float = 30.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        log = run_dir / "server.log"
        children = run_dir / "children.json"
        holding = (run_dir / "gpu.csv").exists()  # the harness is past startup, sampling
        if (
            holding
            and log.exists()
            and "Application startup complete" in log.read_text()
            and children.exists()
        ):
            records = json.loads(children.read_text())
            if records:
                return int(records[0]["pgid"])
        time.sleep(0.1)
    raise AssertionError("the server did not come up")


def _gone(pgid: int, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_no_server_survives_the_harness(tmp_path: Path, sig: signal.Signals) -> None:
    harness = _harness(tmp_path)
    try:
        pgid = _server_group(tmp_path)
        assert group_alive(pgid)
        time.sleep(0.5)  # a few GPU samples at 10 Hz
        os.kill(harness.pid, sig)
        harness.wait(timeout=30)
        assert _gone(pgid), f"server group {pgid} survived {sig.name} of the harness"
        if sig is not signal.SIGKILL:
            # A clean stop also closes the GPU timeline sampled while holding.
            rows = (tmp_path / "gpu.csv").read_text().splitlines()
            assert rows[0].startswith("t_s,device_index") and len(rows) > 2
    finally:
        if harness.poll() is None:
            harness.kill()


def test_nvml_without_a_driver_is_one_line_before_any_launch(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "tuner.cli", "serve", "--model", "qwen2.5-7b", "--hold",
           "--gpu-source", "nvml", "--run-dir", str(tmp_path)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if done.returncode == 0:
        pytest.skip("NVML is available on this machine")
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "NVML" in done.stderr
    assert not (tmp_path / "server.log").exists()


def test_the_next_run_stops_leftovers_and_says_so(tmp_path: Path) -> None:
    registry = ChildRegistry(tmp_path)
    # A leftover: a process recorded by an earlier run that is still alive.
    leftover = registry.spawn(["sleep", "60"], role="sim server", stdout_path=tmp_path / "x.log")
    os.kill(os.getpid(), 0)
    fresh = ChildRegistry(tmp_path)
    notes = fresh.stop_leftovers()
    leftover.wait(timeout=10)
    assert len(notes) == 1 and "left running by an earlier run" in notes[0]
    assert not group_alive(leftover.pid)


class FakeNvml:
    """A stand-in for NVML (no GPU here): device memory rises at launch, falls slowly after stop."""

    name = "fake-nvml"

    def __init__(self) -> None:
        self.reads = 0
        self.used = 1 << 30
        self.release_after_reads: int | None = None

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def read(self, pids: frozenset[int]) -> list[object]:
        from tuner.serving.gpu_sampler import DeviceReading

        self.reads += 1
        if self.release_after_reads is not None and self.reads >= self.release_after_reads:
            self.used = 1 << 30
        total = 80 << 30
        return [DeviceReading(0, total, self.used, total - self.used, 0.0, 0.0, None, 0)]


def test_stop_waits_until_the_device_memory_is_released(tmp_path: Path) -> None:
    fake = FakeNvml()
    registry = ChildRegistry(tmp_path)
    spec = LaunchSpec(backend=Backend.SIM, model="qwen2.5-7b", params=ServingParams(max_model_len=4096),
                      sim_startup_delay_s=0.1)  # fmt: skip
    server = ServerProcess(
        spec, registry=registry, log_path=tmp_path / "server.log", memory_source=fake
    )  # type: ignore[arg-type]
    assert server.wait_ready().outcome is TrialOutcome.READY
    fake.used = 70 << 30  # the server holds its budget
    fake.release_after_reads = fake.reads + 4  # ...and releases it a moment after stopping
    server.stop()
    assert server.memory_released is True
    assert fake.reads >= fake.release_after_reads


def test_an_api_key_stays_in_the_environment_and_the_study_password_out_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-test-7f3a9c0e-never-in-logs"
    monkeypatch.setenv("VLLM_API_KEY", secret)
    storage = "postgresql://tuner:pw-5d1e-not-for-servers@db.example:5432/tuner"
    monkeypatch.setenv("TUNER_STORAGE", storage)
    server, _ = launch(tmp_path, model="qwen2.5-7b", params=ServingParams(max_model_len=4096))
    try:
        result = server.wait_ready()
        assert result.outcome is TrialOutcome.READY
        assert server.pid is not None
        environ = Path(f"/proc/{server.pid}/environ").read_bytes().split(b"\0")
        assert f"VLLM_API_KEY={secret}".encode() in environ  # the server needs its key
        assert not any(entry.startswith(b"TUNER_STORAGE=") for entry in environ)
    finally:
        server.stop()
    assert secret not in " ".join(server.command)
    assert secret not in server.log_text()
    assert secret not in result.model_dump_json()
    assert secret not in (tmp_path / "children.json").read_text()


# --- the startup timeout: no progress in the log, not a size formula --------------------

# A stand-in for `vllm serve` where only its timing matters: it prints its startup as told
# by FAKE_STARTUP, then answers /health as the file FAKE_CONTROL/health says (ok, slow: 3 s
# late, hang: never, or a status code) and lists the model on /v1/models.
FAKE_SERVER = r"""
import http.server, json, os, pathlib, sys, time

args = sys.argv[1:]
port, model = int(args[args.index("--port") + 1]), args[args.index("--model") + 1]
health = pathlib.Path(os.environ["FAKE_CONTROL"]) / "health"
kind, _, seconds = os.environ.get("FAKE_STARTUP", "").partition(":")
print("INFO starting", flush=True)
if kind == "progress":
    end, step = time.monotonic() + float(seconds), 0
    while time.monotonic() < end:
        print(f"INFO loading, step {step}", flush=True)
        step += 1
        time.sleep(0.25)
elif kind == "silent":
    print("Loading safetensors checkpoint shards:   0% Completed | 0/4", flush=True)
    time.sleep(3600)
elif kind == "chatty":
    while True:
        print("INFO still compiling", flush=True)
        time.sleep(0.1)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/v1/models":
            body = json.dumps({"data": [{"id": model}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        mode = health.read_text().strip() if health.exists() else "ok"
        if mode == "slow":
            time.sleep(3)
        elif mode == "hang":
            time.sleep(3600)
        self.send_response(int(mode) if mode.isdigit() else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
server.daemon_threads = True
print("INFO Application startup complete.", flush=True)
server.serve_forever()
"""


def launch_fake(tmp_path: Path, startup: str, **kw: object) -> ServerProcess:
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_SERVER, encoding="utf-8")
    spec = LaunchSpec(
        backend=Backend.VLLM, model="fake-model", vllm_cmd=(sys.executable, str(script)),
        env=(("FAKE_CONTROL", str(tmp_path)), ("FAKE_STARTUP", startup)), **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    return ServerProcess(
        spec, registry=ChildRegistry(tmp_path), log_path=tmp_path / "server.log", adapt=False
    )


def test_a_startup_that_keeps_printing_outlasts_the_silence_window(tmp_path: Path) -> None:
    # 4 s of startup with a line every 0.25 s, against a 1-s silence window: a cold start
    # that downloads and compiles for longer than any size formula allowed still starts.
    server = launch_fake(tmp_path, "progress:4", startup_silence_s=1.0, startup_floor_s=1.0)
    try:
        result = server.wait_ready()
        assert result.outcome is TrialOutcome.READY, result.log_excerpt
        assert result.ready_s is not None and result.ready_s > 3.5
    finally:
        server.stop()


def test_a_silent_startup_times_out_on_no_progress_and_says_after_what(tmp_path: Path) -> None:
    server = launch_fake(tmp_path, "silent", startup_silence_s=1.0, startup_floor_s=1.5)
    began = time.monotonic()
    result = server.wait_ready()
    took_s = time.monotonic() - began
    assert result.outcome is TrialOutcome.STARTUP_TIMEOUT
    assert 1.5 < took_s < 10
    assert result.note is not None and result.note.startswith("no output for ")
    assert "after 'Loading safetensors checkpoint shards:   0% Completed | 0/4'" in result.note
    assert f"# tuner: startup timed out: {result.note}" in server.log_text()
    assert server.pid is not None and not group_alive(server.pid)


def test_a_startup_past_the_cap_times_out_however_much_it_prints(tmp_path: Path) -> None:
    server = launch_fake(
        tmp_path, "chatty", startup_silence_s=1.0, startup_floor_s=0.5, startup_timeout_s=2.0
    )
    result = server.wait_ready()
    assert result.outcome is TrialOutcome.STARTUP_TIMEOUT
    assert result.note is not None and "(the startup cap)" in result.note
    assert "'INFO still compiling'" in result.note


# --- a dead engine: exited, an error status, or no answer for a while -----------------------


def test_a_slow_health_is_not_a_dead_engine_but_a_503_is(tmp_path: Path) -> None:
    server = launch_fake(tmp_path, "progress:0")
    try:
        assert server.wait_ready().outcome is TrialOutcome.READY
        (tmp_path / "health").write_text("slow")  # a loaded server answers 3 s late
        began = time.monotonic()
        assert server.engine_outcome() is None
        assert time.monotonic() - began >= 3
        (tmp_path / "health").write_text("503")  # vLLM's answer once its engine is dead
        died = server.engine_outcome()
        assert died is not None and died.outcome is TrialOutcome.ENGINE_DIED
        assert died.note == "/health answered 503"
    finally:
        server.stop()


def test_a_health_that_never_answers_is_a_dead_engine_after_the_window(tmp_path: Path) -> None:
    server = launch_fake(tmp_path, "progress:0", health_silence_s=2.0)
    try:
        assert server.wait_ready().outcome is TrialOutcome.READY
        (tmp_path / "health").write_text("hang")
        began = time.monotonic()
        died = server.engine_outcome()
        assert 2 <= time.monotonic() - began < 6
        assert died is not None and died.outcome is TrialOutcome.ENGINE_DIED
        assert died.exit_code is None  # the process lives; its engine does not answer
        assert died.note == "/health did not answer for 2 s while the process lived"
    finally:
        server.stop()


# --- vLLM's cache: VLLM_CACHE_ROOT, where the compile cache lives --------------------------


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().partition("=")[::2] for item in raw if item)


def _compiled(cache: Path) -> set[str]:
    return {p.name for p in (cache / "torch_compile_cache").iterdir()}


def test_the_server_gets_vllm_cache_root_and_a_warm_compile_cache_starts_faster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    cache = tmp_path / "cache"

    def start(name: str, params: ServingParams) -> tuple[ServerProcess, float]:
        server, _ = launch(
            tmp_path / name, model="qwen2.5-7b", params=params, cache_dir=cache,
            sim_compile_delay_s=2.0,
        )  # fmt: skip
        server.start()
        assert server.pid is not None
        env = _environ(server.pid)
        assert env["VLLM_CACHE_ROOT"] == str(cache) and "VLLM_CACHE_DIR" not in env
        try:
            result = server.wait_ready()
            assert result.outcome is TrialOutcome.READY, result.log_excerpt
            assert result.ready_s is not None
            return server, result.ready_s
        finally:
            server.stop()

    base = ServingParams(max_model_len=4096, block_size=16)
    cold, cold_s = start("cold", base)
    assert "Compiling a graph" in cold.log_text() and len(_compiled(cache)) == 1
    # gpu_memory_utilization is not in vLLM's compile hash: the same entry, loaded warm.
    warm, warm_s = start("warm", base.model_copy(update={"gpu_memory_utilization": 0.8}))
    assert "Directly load the compiled graph(s)" in warm.log_text()
    assert cold_s - warm_s > 1.0 and len(_compiled(cache)) == 1
    # The block size and the KV dtype are: each new pair compiles again.
    start("block32", base.model_copy(update={"block_size": 32}))
    start("fp8", base.model_copy(update={"kv_cache_dtype": "fp8"}))
    assert len(_compiled(cache)) == 3


def test_the_harness_vllm_cache_root_is_the_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tuning Job's mounted cache (VLLM_CACHE_ROOT in its pod) is where its servers compile.
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "mounted"))
    server, _ = launch(tmp_path, model="qwen2.5-7b", cache_dir=tmp_path / "run" / "vllm-cache")
    assert server.cache_root() == tmp_path / "mounted"
    monkeypatch.delenv("VLLM_CACHE_ROOT")
    assert server.cache_root() == tmp_path / "run" / "vllm-cache"
