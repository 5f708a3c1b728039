"""ServerProcess: launch vLLM (real or simulated) with a trial's settings, know what happened, stop it.

One code path serves both backends: ``vllm serve`` (or any launch command given
with ``--vllm-cmd``, e.g. ``python -m vllm.entrypoints.openai.api_server``) and
``tuner sim-serve``, which takes the same flags and prints the same lines. The
server runs in its own process group with its output in ``server.log``; it is
ready when ``/health`` answers 200 and ``/v1/models`` lists the model. If the
process exits first, its log says why, and the failure is classified within a
polling interval (0.1 s) of the exit.

A startup is given up on when its log stops growing (no byte written to
``server.log`` for ``STARTUP_SILENCE_S``, once ``STARTUP_FLOOR_S`` have passed) or
at the overall cap, never on a size formula: a cold start downloads the weights
and compiles before it prints again. A serving engine is dead when its process
exited, ``/health`` answers an error status (vLLM answers 503 once its engine
died) or nothing answers for ``HEALTH_SILENCE_S`` while the process lives; a
slow ``/health`` under load is not death.
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
from tuner.serving.nvml_host import VISIBLE_DEVICES_ENV, server_devices
from tuner.serving.processes import ChildRegistry
from tuner.serving.vllm_install import is_cpu_build
from tuner.vllm.classify import classify_failure, engine_death_failure, log_excerpt
from tuner.vllm.failures import StartupFailure
from tuner.vllm.flags import FLAGS_BY_OPTION, accepted_options, command_line, serving_values
from tuner.vllm.log import StartupReport, parse_startup_log
from tuner.vllm.memory import ServingParams
from tuner.vllm.platform import CPU_KV_CACHE_ENV, DEFAULT_CPU_KV_CACHE_BYTES
from tuner.vllm.versions import VllmVersion

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.1
# vLLM's startup: the hub download, weight loading and the first torch.compile print
# little for minutes (engine init alone takes 100-250 s for small models in real v1 logs),
# so a startup is judged by whether its log still grows, not by how long it has taken.
STARTUP_SILENCE_S = 600.0  # no byte written to server.log for this long: stuck
STARTUP_FLOOR_S = 900.0  # never given up on for silence sooner than this after launch
STARTUP_CAP_S = 3600.0  # given up on at this age however much it prints
SIM_STARTUP_MARGIN_S = 60.0  # the simulated engine: its own pauses plus this
# While serving: how long /health may stay unanswered while the process lives, and how
# long one /health request may take (a loaded server answers late, not never).
HEALTH_SILENCE_S = 30.0
HEALTH_REQUEST_TIMEOUT_S = 10.0
CACHE_ROOT_ENV = "VLLM_CACHE_ROOT"  # vllm/envs.py; the compile cache is its torch_compile_cache/
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
class StartupLimits:
    """When a startup is given up on: no output for ``silence_s`` once ``floor_s`` have
    passed since launch, or ``cap_s`` after launch whatever it prints."""

    silence_s: float
    floor_s: float
    cap_s: float


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
    # --kv-offloading-size, its backend and --kv-transfer-config (TrialParams.offloading_flags)
    offloading_flags: tuple[tuple[str, object], ...] = ()
    # --kv-cache-metrics: the KV block residency histograms each level reads (a tune's
    # launches; left out, with the reason, where the target vLLM predates them; vLLM's
    # own 1% block sample).
    kv_cache_metrics: bool = False
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port
    cuda_visible_devices: str | None = None
    cache_dir: Path | None = None  # VLLM_CACHE_ROOT, shared by every trial of a run
    env: tuple[tuple[str, str], ...] = ()
    startup_timeout_s: float | None = None  # the overall cap (default STARTUP_CAP_S)
    startup_silence_s: float | None = None  # no log output for this long: timed out
    startup_floor_s: float | None = None  # ... but never sooner than this after launch
    health_silence_s: float = HEALTH_SILENCE_S
    sim_startup_delay_s: float = 1.0
    sim_compile_delay_s: float | None = None  # sim-serve --compile-delay (a cold compile)
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

    def server_devices(self) -> str:
        """The CUDA_VISIBLE_DEVICES entries this server's ranks use (the first of those it
        is shown, one per tensor-parallel rank): the GPUs to sample and to wait on."""
        shown = self.cuda_visible_devices
        if shown is None:
            shown = os.environ.get(VISIBLE_DEVICES_ENV)
        return server_devices(shown, self.params.tensor_parallel_size)


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
    # What the harness saw, where vLLM's log does not say it: which startup timeout
    # fired, why a serving engine counts as dead.
    note: str | None = None


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
    values.update(spec.offloading_flags)
    values["kv-cache-metrics"] = spec.kv_cache_metrics
    return command_line(values)


def adapt_flags(
    pairs: list[tuple[str, str | None]], accepted: frozenset[str], version_note: str
) -> tuple[list[tuple[str, str | None]], list[DroppedFlag]]:
    """Leave out the knobs the target vLLM lacks, each with the reason (the offloading
    connector's --kv-transfer-config with the --kv-offloading-size it configures)."""
    kept, dropped = [], []
    no_offloading = "--kv-offloading-size" not in accepted
    for flag, value in pairs:
        if flag == "--kv-transfer-config" and no_offloading and flag in accepted:
            reason = "the eviction policy of --kv-offloading-size, left out with it"
            dropped.append(DroppedFlag(flag=flag, reason=reason))
            continue
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
            if spec.sim_compile_delay_s is not None:
                tail += ["--compile-delay", str(spec.sim_compile_delay_s)]
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

    def cache_root(self) -> Path | None:
        """The server's VLLM_CACHE_ROOT (``server_cache_root``)."""
        return server_cache_root(self.spec.cache_dir, dict(self.spec.env))

    def _env(self) -> dict[str, str]:
        # The harness's own settings stay out of the server's environment: TUNER_STORAGE
        # holds the study database's password.
        env = {key: value for key, value in os.environ.items() if not key.startswith("TUNER_")}
        cache_root = self.cache_root()
        if cache_root is not None:
            cache_root.mkdir(parents=True, exist_ok=True)
            env[CACHE_ROOT_ENV] = str(cache_root)
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

    @property
    def baseline_used_bytes(self) -> dict[int, int]:
        """Each device's used memory before the launch, by index (empty: not read)."""
        return dict(self._baseline_used)

    def exit_code(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def startup_limits(self) -> StartupLimits:
        """When a startup is given up on: silence in its log, and the overall cap."""
        spec = self.spec
        if spec.backend is Backend.SIM:
            # The simulated engine is silent through its own pauses: loading, a cold compile.
            compile_s = (
                spec.sim_startup_delay_s
                if spec.sim_compile_delay_s is None
                else spec.sim_compile_delay_s
            )
            quiet_s = SIM_STARTUP_MARGIN_S + spec.sim_startup_delay_s + compile_s
            silence_s, floor_s = quiet_s, quiet_s
        else:
            silence_s, floor_s = STARTUP_SILENCE_S, STARTUP_FLOOR_S
        cap_s = STARTUP_CAP_S if spec.startup_timeout_s is None else spec.startup_timeout_s
        silence_s = silence_s if spec.startup_silence_s is None else spec.startup_silence_s
        floor_s = floor_s if spec.startup_floor_s is None else spec.startup_floor_s
        return StartupLimits(silence_s=silence_s, floor_s=min(floor_s, cap_s), cap_s=cap_s)

    def wait_ready(self) -> StartupResult:
        """Block until the server is ready, has failed, or its startup stalled (no output
        for the silence window, after the floor) or passed the overall cap."""
        if self._proc is None:
            self.start()
        limits = self.startup_limits()
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
            note = self._stalled(limits)
            if note is not None:
                failure = classify_failure(self.log_text())
                self.stop()
                self._note_in_log(f"startup timed out: {note}")
                return self._result(TrialOutcome.STARTUP_TIMEOUT, failure=failure, note=note)
            time.sleep(POLL_INTERVAL_S)

    def _stalled(self, limits: StartupLimits) -> str | None:
        """Why the startup is given up on now, or None while it may still come up."""
        age_s = time.monotonic() - self._started_s
        if age_s > limits.cap_s:
            return (
                f"not ready {limits.cap_s:.0f} s after launch (the startup cap), last line "
                f"{_last_line(self.log_text())!r}"
            )
        if age_s <= limits.floor_s:
            return None
        try:
            silent_s = time.time() - self.log_path.stat().st_mtime
        except OSError:
            silent_s = age_s
        if silent_s <= limits.silence_s:
            return None
        return f"no output for {silent_s:.0f} s after {_last_line(self.log_text())!r}"

    def engine_outcome(self) -> StartupResult | None:
        """While serving: None if healthy, else how the engine died.

        Dead is a process that exited, a ``/health`` that answers an error status (vLLM
        answers 503 once its engine is dead), or no answer at all for
        ``spec.health_silence_s`` while the process lives; a slow answer is retried."""
        window_s = self.spec.health_silence_s
        began = time.monotonic()
        note: str | None = None
        while (code := self.exit_code()) is None:
            left_s = window_s - (time.monotonic() - began)
            timeout_s = max(POLL_INTERVAL_S, min(HEALTH_REQUEST_TIMEOUT_S, left_s))
            status = self._get("/health", timeout_s=timeout_s)
            if status == 200:
                return None
            if status is not None:
                note = f"/health answered {status}"
                break
            if time.monotonic() - began >= window_s:
                note = f"/health did not answer for {window_s:.0f} s while the process lived"
                break
            time.sleep(POLL_INTERVAL_S)
        code = self.exit_code()
        text = self.log_text()
        # RUNTIME_OOM for every CUDA/cuBLAS/NCCL/allocator OOM text, wherever it sits
        failure = engine_death_failure(text)
        outcome = (
            TrialOutcome.ENGINE_DIED
            if failure is not None or code is None
            else TrialOutcome.CRASHED
        )
        if code is not None:
            note = f"the server exited with code {code}"
        return self._result(outcome, failure=failure, exit_code=code, note=note)

    def _note_in_log(self, note: str) -> None:
        try:
            with self.log_path.open("a", encoding="utf-8") as out:
                out.write(f"# tuner: {note}\n")
        except OSError:
            log.warning("%s (not written to %s)", note, self.log_path)

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
        note: str | None = None,
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
            note=note,
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


def server_cache_root(cache_dir: Path | None, env: dict[str, str] | None = None) -> Path | None:
    """A server's VLLM_CACHE_ROOT: the one its launch environment or the harness's own
    sets (a tuning Job's mounted cache, a user's shared cache), else ``cache_dir`` (a
    run's ``vllm-cache/``); None: vLLM's default (~/.cache/vllm)."""
    given = (env or {}).get(CACHE_ROOT_ENV) or os.environ.get(CACHE_ROOT_ENV)
    if given:
        return Path(given).expanduser().absolute()
    return cache_dir


def _last_line(text: str, limit: int = 160) -> str:
    """The log's last line as a terminal shows it (a progress bar's latest redraw)."""
    for line in reversed(text.splitlines()):
        shown = line.rsplit("\r", 1)[-1].strip()
        if shown:
            return shown if len(shown) <= limit else shown[: limit - 3] + "..."
    return ""
