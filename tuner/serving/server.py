"""ServerProcess: launch vLLM (real or simulated) with a trial's settings, know what happened, stop it.

One code path serves both backends: ``vllm serve`` (or any launch command given
with ``--vllm-cmd``, e.g. ``python -m vllm.entrypoints.openai.api_server``) and
``tuner sim-serve``, which takes the same flags and prints the same lines. The
server runs in its own process group with its output in ``server.log``; it is
ready when ``/health`` answers 200 and ``/v1/models`` lists the model. If the
process exits first, its log says why, and the failure is classified within a
polling interval (0.1 s) of the exit.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from tuner.errors import ConfigError, GpuReadError, GpuSamplingUnavailable
from tuner.serving.gpu_sampler import GpuSource, wait_until_released
from tuner.serving.processes import ChildRegistry
from tuner.vllm.classify import classify_failure, engine_death_failure, log_excerpt
from tuner.vllm.failures import StartupFailure
from tuner.vllm.flags import FLAGS_BY_OPTION, accepted_options, command_line, serving_values
from tuner.vllm.log import StartupReport, parse_startup_log
from tuner.vllm.memory import ServingParams
from tuner.vllm.platform import CPU_KV_CACHE_ENV, DEFAULT_CPU_KV_CACHE_BYTES, is_cpu_build
from tuner.vllm.versions import VllmVersion

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.1
# vLLM's CPU build compiles the model with inductor on a few cores: minutes, not seconds.
CPU_BUILD_STARTUP_TIMEOUT_S = 600.0
API_KEY_ENV = "VLLM_API_KEY"


class Backend(StrEnum):
    """What serves a trial: the simulated engine or a real vLLM."""

    SIM = "sim"
    VLLM = "vllm"


class TrialOutcome(StrEnum):
    """What became of a launched server."""

    READY = "ready"
    STARTUP_OOM = "startup_oom"
    INVALID_CONFIG = "invalid_config"
    STARTUP_TIMEOUT = "startup_timeout"
    CRASHED = "crashed"
    ENGINE_DIED = "engine_died"

    @classmethod
    def of_failure(cls, failure: StartupFailure) -> TrialOutcome:
        return cls.STARTUP_OOM if failure.kind.is_out_of_memory else cls.INVALID_CONFIG


@dataclass(frozen=True)
class DroppedFlag:
    """A knob left out because the target vLLM does not have it."""

    flag: str
    reason: str


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one server; the same for both backends."""

    backend: Backend
    model: str
    params: ServingParams = field(default_factory=ServingParams)
    gpu: str | None = None  # sim: the virtual GPU
    vllm_version: str | None = None  # sim: the emulated release
    vllm_cmd: tuple[str, ...] = ("vllm", "serve")
    served_model_name: str | None = None
    swap_space_gib: float | None = None
    enable_prefix_caching: bool | None = None
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port
    cuda_visible_devices: str | None = None
    cache_dir: Path | None = None  # VLLM_CACHE_DIR, shared by every trial of a run
    env: tuple[tuple[str, str], ...] = ()
    startup_timeout_s: float | None = None
    sim_startup_delay_s: float = 1.0
    sim_time_scale: float = 1.0
    sim_step_costs: str | None = None  # sim-serve --step-costs: an engine the twin has not seen
    sim_gpu_count: int | None = None  # sim-serve --gpu-count: the virtual host's GPUs
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # The server may run in another working directory: a local model directory and
        # the cache directory cross the process boundary as absolute paths.
        if not Path(self.model).is_absolute() and Path(self.model).is_dir():
            object.__setattr__(self, "model", str(Path(self.model).absolute()))
        if self.cache_dir is not None and not self.cache_dir.is_absolute():
            object.__setattr__(self, "cache_dir", self.cache_dir.absolute())

    @property
    def name(self) -> str:
        return self.served_model_name or self.model


class StartupResult(BaseModel):
    """How a launch ended: the outcome, vLLM's own words and the evidence."""

    model_config = ConfigDict(frozen=True)

    outcome: TrialOutcome
    failure: StartupFailure | None = None
    report: StartupReport | None = None
    ready_s: float | None = None
    exit_code: int | None = None
    log_path: str
    log_excerpt: str = ""
    command: list[str]
    dropped_flags: list[str] = []
    base_url: str


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


# --- which flags the target vLLM accepts ----------------------------------------------------

_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


@cache
def probe_vllm_flags(vllm_cmd: tuple[str, ...]) -> frozenset[str]:
    """The flags the installed vLLM accepts, read from its own --help."""
    for help_flag in ("--help=all", "--help"):
        try:
            done = subprocess.run(
                [*vllm_cmd, help_flag], capture_output=True, text=True, timeout=180, check=False
            )
        except FileNotFoundError as exc:
            raise ConfigError(
                f"vLLM launch command {shlex.join(vllm_cmd)!r} not found: {exc.strerror}; "
                "install vLLM or pass --vllm-cmd"
            ) from exc
        except subprocess.TimeoutExpired:
            continue
        flags = frozenset(_FLAG.findall(done.stdout + done.stderr))
        if "--gpu-memory-utilization" in flags:
            return flags
    raise ConfigError(
        f"{shlex.join(vllm_cmd)} --help did not list vLLM's flags; is it a vLLM launch command?"
    )


def _flag_args(spec: LaunchSpec) -> list[tuple[str, str | None]]:
    """(flag, value) pairs for the settings that differ from vLLM's defaults."""
    values = serving_values(spec.params)
    values["swap-space"] = spec.swap_space_gib
    values["enable-prefix-caching"] = spec.enable_prefix_caching
    values["served-model-name"] = spec.served_model_name or None
    return command_line(values)


def adapt_flags(
    pairs: list[tuple[str, str | None]], accepted: frozenset[str], version_note: str
) -> tuple[list[tuple[str, str | None]], list[DroppedFlag]]:
    """Leave out the knobs the target vLLM lacks, each with the reason."""
    kept, dropped = [], []
    for flag, value in pairs:
        if flag in accepted:
            kept.append((flag, value))
            continue
        known = FLAGS_BY_OPTION.get(flag)
        reason = (known.gone if known else None) or f"{flag} is not a flag of {version_note}"
        dropped.append(DroppedFlag(flag=flag, reason=reason))
    return kept, dropped


def _size_cpu_kv_cache(
    pairs: list[tuple[str, str | None]], spec: LaunchSpec
) -> list[tuple[str, str | None]]:
    """vLLM's CPU build without a KV-cache size would reserve 92% of the node's memory and
    fail unless that much is free: pass a size unless the flag or the variable gives one."""
    env = {**os.environ, **dict(spec.env)}
    if any(flag == "--kv-cache-memory-bytes" for flag, _ in pairs) or env.get(CPU_KV_CACHE_ENV):
        return pairs
    log.warning(
        "vLLM's CPU build with neither --kv-cache-memory-bytes nor %s: passing "
        "--kv-cache-memory-bytes %d (%d GiB)",
        CPU_KV_CACHE_ENV,
        DEFAULT_CPU_KV_CACHE_BYTES,
        DEFAULT_CPU_KV_CACHE_BYTES >> 30,
    )
    return [*pairs, ("--kv-cache-memory-bytes", str(DEFAULT_CPU_KV_CACHE_BYTES))]


# --- the process ----------------------------------------------------------------------------


class ServerProcess:
    """One vLLM server: launch, wait until ready or failed, watch, stop."""

    def __init__(
        self,
        spec: LaunchSpec,
        *,
        registry: ChildRegistry,
        log_path: Path,
        adapt: bool = True,
        memory_source: GpuSource | None = None,
    ) -> None:
        """``memory_source`` (NVML on a GPU host): after stop, wait until the device's
        memory is back to what it was before the launch, so the next trial starts clean."""
        self.spec = spec
        self.memory_source = memory_source
        self.memory_released: bool | None = None
        self._baseline_used: dict[int, int] = {}
        self.registry = registry
        self.log_path = log_path
        self.port = spec.port or free_port(spec.host)
        self.base_url = f"http://{spec.host}:{self.port}"
        self.dropped: list[DroppedFlag] = []
        self.cpu_build = False  # vLLM's CPU build (found out when adapting to the target)
        self.command = self._command(adapt)
        self._proc: subprocess.Popen[bytes] | None = None
        self._started_s = 0.0

    # -- command line ---------------------------------------------------------------------

    def _command(self, adapt: bool) -> list[str]:
        spec = self.spec
        pairs = _flag_args(spec)
        if spec.backend is Backend.SIM:
            version = (
                VllmVersion.parse(spec.vllm_version) if spec.vllm_version else VllmVersion.current()
            )
            accepted = accepted_options(version)
            note = f"the emulated vLLM {version}"
            head = [sys.executable, "-m", "tuner.cli", "sim-serve", "--model", spec.model]
            if spec.gpu:
                head += ["--gpu", spec.gpu]
            if spec.vllm_version:
                head += ["--vllm-version", spec.vllm_version]
            tail = [
                "--startup-delay", str(spec.sim_startup_delay_s),
                "--time-scale", str(spec.sim_time_scale),
            ]  # fmt: skip
            if spec.sim_step_costs:
                tail += ["--step-costs", spec.sim_step_costs]
            if spec.sim_gpu_count is not None:
                tail += ["--gpu-count", str(spec.sim_gpu_count)]
        else:
            accepted = probe_vllm_flags(spec.vllm_cmd) if adapt else frozenset()
            note = f"the vLLM behind {shlex.join(spec.vllm_cmd)!r}"
            head = list(spec.vllm_cmd)
            head += [spec.model] if head[-1] == "serve" else ["--model", spec.model]
            tail = []
            self.cpu_build = adapt and is_cpu_build(spec.vllm_cmd)
            if self.cpu_build:
                pairs = _size_cpu_kv_cache(pairs, spec)
        if adapt:
            pairs, self.dropped = adapt_flags(pairs, accepted, note)
        args: list[str] = []
        for flag, value in pairs:
            args += [flag] if value is None else [flag, value]
        return [
            *head,
            *args,
            "--host",
            spec.host,
            "--port",
            str(self.port),
            *tail,
            *spec.extra_args,
        ]

    def _env(self) -> dict[str, str]:
        # The harness's own settings stay out of the server's environment: TUNER_STORAGE
        # holds the study database's password.
        env = {key: value for key, value in os.environ.items() if not key.startswith("TUNER_")}
        if self.spec.cache_dir is not None:
            self.spec.cache_dir.mkdir(parents=True, exist_ok=True)
            env["VLLM_CACHE_DIR"] = str(self.spec.cache_dir)
        if self.spec.cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.spec.cuda_visible_devices
        flag_sized = self.cpu_build and "--kv-cache-memory-bytes" in self.command
        if flag_sized and env.pop(CPU_KV_CACHE_ENV, ""):
            log.warning(
                "%s left out of the server's environment: it would override "
                "--kv-cache-memory-bytes",
                CPU_KV_CACHE_ENV,
            )
        env.update(dict(self.spec.env))
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("w", encoding="utf-8") as out:
            out.write(f"# tuner: {shlex.join(self.command)}\n")
        if self.memory_source is not None:
            baseline = self._memory_baseline(self.memory_source)
            if baseline is None:
                self.memory_source = None  # unreadable: no release to wait for
            else:
                self._baseline_used = baseline
        self._started_s = time.monotonic()
        self._proc = self.registry.spawn(
            self.command,
            role=f"{self.spec.backend.value} server",
            stdout_path=self.log_path,
            env=self._env(),
        )
        log.info(
            "started %s server (pid %d): %s", self.spec.backend.value, self._proc.pid, self.log_path
        )

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def exit_code(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def startup_timeout_s(self) -> float:
        if self.spec.startup_timeout_s is not None:
            return self.spec.startup_timeout_s
        if self.spec.backend is Backend.SIM:
            return 60.0 + self.spec.sim_startup_delay_s
        timeout_s = _vllm_timeout_s(self.spec.model, self.spec.params.tensor_parallel_size)
        return max(timeout_s, CPU_BUILD_STARTUP_TIMEOUT_S) if self.cpu_build else timeout_s

    def wait_ready(self) -> StartupResult:
        """Block until the server is ready, has failed, or the startup timeout passes."""
        if self._proc is None:
            self.start()
        deadline = self._started_s + self.startup_timeout_s()
        while True:
            code = self.exit_code()
            if code is not None:
                return self._failed(code)
            if self._ready():
                text = self.log_text()
                return self._result(
                    TrialOutcome.READY,
                    report=parse_startup_log(text),
                    ready_s=time.monotonic() - self._started_s,
                )
            if time.monotonic() > deadline:
                failure = classify_failure(self.log_text())
                self.stop()
                return self._result(TrialOutcome.STARTUP_TIMEOUT, failure=failure)
            time.sleep(POLL_INTERVAL_S)

    def engine_outcome(self) -> StartupResult | None:
        """While serving: None if healthy, else how the engine died."""
        code = self.exit_code()
        if code is None and self._get("/health", timeout_s=2.0) == 200:
            return None
        text = self.log_text()
        # RUNTIME_OOM for every CUDA/cuBLAS/NCCL/allocator OOM text, wherever it sits
        failure = engine_death_failure(text)
        outcome = (
            TrialOutcome.ENGINE_DIED
            if failure is not None or code is None
            else TrialOutcome.CRASHED
        )
        return self._result(outcome, failure=failure, exit_code=code)

    def stop(self, grace_s: float = 10.0, release_timeout_s: float = 60.0) -> None:
        """Stop the server's process group; with a memory source, return only once the
        device memory is back to what it was before the launch (or the timeout passed),
        so the next launch does not see less free memory than it asks for."""
        if self._proc is None:
            return
        self.registry.stop(self._proc.pid, grace_s=grace_s)
        source = self.memory_source
        if source is None or self.memory_released is not None:
            return
        began = time.monotonic()
        try:
            self.memory_released = wait_until_released(
                source, baseline_used_bytes=self._baseline_used, timeout_s=release_timeout_s
            )
        except GpuReadError as exc:
            log.warning("GPU memory release not checked: %s", exc)
            self.memory_released = False
        finally:
            source.close()
        waited_s = time.monotonic() - began
        if self.memory_released:
            note = f"GPU memory released {waited_s:.1f} s after the server stopped ({source.name})"
        else:
            note = f"GPU memory NOT released within {release_timeout_s:.0f} s ({source.name})"
            log.warning("%s of stopping the server (log %s)", note, self.log_path)
        with self.log_path.open("a", encoding="utf-8") as out:
            out.write(f"# tuner: {note}\n")

    @staticmethod
    def _memory_baseline(source: GpuSource) -> dict[int, int] | None:
        """Each device's used memory before the launch; None when the source cannot be read."""
        try:
            source.open()
            return {r.device_index: r.used_bytes for r in source.read(frozenset())}
        except (GpuSamplingUnavailable, GpuReadError) as exc:
            source.close()
            log.warning("GPU memory release will not be checked: %s", exc)
            return None

    # -- internals ---------------------------------------------------------------------------

    def _failed(self, code: int) -> StartupResult:
        text = self.log_text()
        failure = classify_failure(text)
        if failure is None:
            return self._result(TrialOutcome.CRASHED, exit_code=code)
        return self._result(TrialOutcome.of_failure(failure), failure=failure, exit_code=code)

    def _result(
        self,
        outcome: TrialOutcome,
        *,
        failure: StartupFailure | None = None,
        report: StartupReport | None = None,
        ready_s: float | None = None,
        exit_code: int | None = None,
    ) -> StartupResult:
        text = self.log_text()
        around = failure.message[:40] if failure else None
        return StartupResult(
            outcome=outcome,
            failure=failure,
            report=report,
            ready_s=ready_s,
            exit_code=exit_code,
            log_path=str(self.log_path),
            log_excerpt=log_excerpt(text, around=around),
            command=self.command,
            dropped_flags=[f"{d.flag}: {d.reason}" for d in self.dropped],
            base_url=self.base_url,
        )

    def _ready(self) -> bool:
        if self._get("/health") != 200:
            return False
        body = self._get_json("/v1/models")
        ids = {m.get("id") for m in body.get("data", [])} if isinstance(body, dict) else set()
        return self.spec.name in ids

    def _request(self, path: str) -> urllib.request.Request:
        request = urllib.request.Request(self.base_url + path)
        key = os.environ.get(API_KEY_ENV)
        if key:
            request.add_header("Authorization", f"Bearer {key}")
        return request

    def _get(self, path: str, timeout_s: float = 1.0) -> int | None:
        try:
            with urllib.request.urlopen(self._request(path), timeout=timeout_s) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except (urllib.error.URLError, OSError, TimeoutError):
            return None

    def _get_json(self, path: str) -> object:
        try:
            with urllib.request.urlopen(self._request(path), timeout=2.0) as response:
                return json.loads(response.read())
        except (urllib.error.URLError, OSError, TimeoutError, json.JSONDecodeError):
            return None


def _vllm_timeout_s(model: str, tp: int) -> float:
    """Startup time grows with the weights to load: 2 minutes plus 15 s per GiB per rank."""
    from tuner.errors import TunerError
    from tuner.vllm.memory import weights_bytes
    from tuner.vllm.models import resolve_model

    try:
        spec = resolve_model(model)
    except TunerError:
        return 900.0
    return 120.0 + 15.0 * weights_bytes(spec, tp) / (1 << 30)
