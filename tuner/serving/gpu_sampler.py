"""GPU memory, utilization and power sampled in a background thread during a trial.

    GpuSource (Protocol)        where readings come from; one DeviceReading per device per read
    ├── NvmlSource              the real driver through NVML (nvidia-ml-py, import name pynvml)
    ├── SimSource               ``GET /sim/gpu`` of ``tuner sim-serve``: what NVML would report
    └── NoneSource              nothing; the summary says memory was not sampled

    GpuSampler(source)  --thread, every interval_s-->  GpuSample (memory; CSV timeline on disk)
                        --stop()-->                    GpuSummary (peaks, p99, headroom, errors)

The timeline CSV (one row per device per sample) is the trial's evidence: the report
rebuilds the summary from it with ``read_timeline`` and ``summarize``.

Memory is what NVML's ``nvmlDeviceGetMemoryInfo`` reports (``used = total - free``,
the driver's reservation included), so ``headroom_bytes`` is the memory the device
still had free at its fullest. NVML sees every GPU of the host; ``NvmlSource`` reads
only those the server may use, ``CUDA_VISIBLE_DEVICES`` mapped to NVML's devices by
``tuner.serving.nvml_host`` (indices, ``GPU-``/``MIG-`` UUIDs; a MIG slice is read as its
MIG device), so another job's GPU never enters the peaks, the headroom or the release
wait. Device indices in the timeline are NVML's (PCI bus order; a MIG slice's is its
parent's), which is CUDA's order only with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``. Per-process memory matches
NVML's process ids against the watched process tree; inside a container without the
host's PID namespace NVML reports host pids, nothing matches and it stays 0.
"""

from __future__ import annotations

import contextlib
import csv
import http.client
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import ModuleType, TracebackType
from typing import IO, TYPE_CHECKING, Protocol, Self
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, ValidationError

from tuner.errors import ConfigError, GpuReadError, GpuSamplingUnavailable, GpuTimelineError
from tuner.serving.nvml_host import VISIBLE_DEVICES_ENV, pynvml_module, read_visible

if TYPE_CHECKING:
    import _csv

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.1  # 10 Hz
FLUSH_INTERVAL_S = 1.0  # how often the timeline CSV is flushed to disk
JOIN_TIMEOUT_S = 5.0  # stop() waits this long for a read stuck in the driver
SIM_TIMEOUT_S = 1.0
NOT_SAMPLED_NOTE = "memory was not sampled (GPU source 'none')"

TIMELINE_COLUMNS = (
    "t_s",
    "device_index",
    "total_bytes",
    "used_bytes",
    "free_bytes",
    "utilization_percent",
    "power_watts",
    "temperature_c",
    "process_used_bytes",
)


AUTO_SOURCE = "auto"  # --gpu-source auto: the kind follows the backend (GpuSourceKind.requested)


class GpuSourceKind(StrEnum):
    """Where device memory is read from: NVML, the simulator's /sim/gpu, or nowhere."""

    NVML = "nvml"
    SIM = "sim"
    NONE = "none"

    @classmethod
    def requested(cls, wanted: str, *, simulated: bool) -> GpuSourceKind:
        """The kind ``--gpu-source wanted`` names for a launch: ``auto`` is the simulator's
        for the simulated engine, NVML for vLLM. ValueError for a name that is no kind."""
        if wanted == AUTO_SOURCE:
            return cls.SIM if simulated else cls.NVML
        return cls(wanted)


def check_gpu_source(wanted: str) -> str:
    """``--gpu-source wanted`` as given when it names a source, else ConfigError (one line)."""
    sources = (AUTO_SOURCE, *GpuSourceKind)
    if wanted not in sources:
        raise ConfigError(
            f"--gpu-source {wanted!r} is not a source; accepted: {', '.join(sources)}"
        )
    return wanted


@dataclass(frozen=True, slots=True)
class DeviceReading:
    """One device at one instant, as a source reads it (the sampler adds the time).

    ``utilization_percent`` and ``power_watts`` are NaN where the device does not
    report them (MIG instances, some boards); ``temperature_c`` is None then.
    ``process_used_bytes`` sums the watched processes; 0 when unknown.
    """

    device_index: int
    total_bytes: int
    used_bytes: int
    free_bytes: int
    utilization_percent: float
    power_watts: float
    temperature_c: float | None
    process_used_bytes: int


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One device at one instant of a trial; ``t_s`` is monotonic seconds since the start."""

    t_s: float
    device_index: int
    total_bytes: int
    used_bytes: int
    free_bytes: int
    utilization_percent: float
    power_watts: float
    temperature_c: float | None
    process_used_bytes: int

    @classmethod
    def at(cls, t_s: float, reading: DeviceReading) -> GpuSample:
        return cls(
            t_s=t_s,
            device_index=reading.device_index,
            total_bytes=reading.total_bytes,
            used_bytes=reading.used_bytes,
            free_bytes=reading.free_bytes,
            utilization_percent=reading.utilization_percent,
            power_watts=reading.power_watts,
            temperature_c=reading.temperature_c,
            process_used_bytes=reading.process_used_bytes,
        )


class GpuSource(Protocol):
    """Where the sampler's readings come from. ``read`` may raise; ``open`` raises
    GpuSamplingUnavailable when the source cannot work here."""

    name: str

    def open(self) -> None: ...

    def read(self, pids: frozenset[int]) -> list[DeviceReading]: ...

    def close(self) -> None: ...


# --- sources ---------------------------------------------------------------------------------


class NoneSource:
    """No sampling at all: for machines where neither NVML nor the simulator applies."""

    name = "none"

    def open(self) -> None:
        pass

    def read(self, pids: frozenset[int]) -> list[DeviceReading]:
        return []

    def close(self) -> None:
        pass


def _unsupported(nvml: ModuleType, exc: BaseException) -> bool:
    return isinstance(exc, nvml.NVMLError_NotSupported)


class NvmlSource:
    """The devices through NVML: those the server may use (``visible``, default this
    process's ``CUDA_VISIBLE_DEVICES``, as ``tuner.serving.nvml_host`` maps it), or the
    NVML indices ``device_indices`` where they are given."""

    name = "nvml"

    def __init__(
        self, device_indices: Sequence[int] | None = None, *, visible: str | None = None
    ) -> None:
        self.device_indices = None if device_indices is None else list(device_indices)
        self.visible = visible
        self._handles: list[tuple[int, object]] = []
        self._nvml: ModuleType | None = None

    def open(self) -> None:
        try:
            nvml = pynvml_module()
        except ImportError as exc:
            raise GpuSamplingUnavailable(
                f"GPU sampling through NVML is unavailable: no NVML binding ({exc}); "
                "use --gpu-source sim or none"
            ) from exc
        try:
            nvml.nvmlInit()
        except nvml.NVMLError_LibraryNotFound as exc:
            raise GpuSamplingUnavailable(
                f"GPU sampling through NVML is unavailable: no NVIDIA driver found ({exc}); "
                "use --gpu-source sim or none"
            ) from exc
        except (nvml.NVMLError, nvml.NVMLLibraryMismatchError) as exc:
            raise GpuSamplingUnavailable(
                f"GPU sampling through NVML is unavailable: nvmlInit failed ({exc}); "
                "use --gpu-source sim or none"
            ) from exc
        self._nvml = nvml
        try:
            self._handles = self._devices(nvml)
        except nvml.NVMLError as exc:
            self.close()
            raise GpuSamplingUnavailable(
                f"GPU sampling through NVML is unavailable: listing devices failed ({exc}); "
                "use --gpu-source sim or none"
            ) from exc
        except (ConfigError, GpuSamplingUnavailable):
            self.close()
            raise

    def _devices(self, nvml: ModuleType) -> list[tuple[int, object]]:
        if self.device_indices is None:
            gpus = read_visible(nvml, self.visible)
            if not gpus:
                visible = self.visible
                if visible is None:
                    visible = os.environ.get(VISIBLE_DEVICES_ENV)
                said = "unset" if visible is None else repr(visible)
                raise GpuSamplingUnavailable(
                    f"GPU sampling through NVML is unavailable: no GPU NVML sees is visible "
                    f"to the server ({VISIBLE_DEVICES_ENV} {said}); use --gpu-source none"
                )
            return [(gpu.nvml_index, gpu.handle) for gpu in gpus]
        count = int(nvml.nvmlDeviceGetCount())
        bad = [i for i in self.device_indices if not 0 <= i < count]
        if bad:
            raise ConfigError(
                f"GPU device index {bad[0]} does not exist: NVML sees {count} device(s), "
                f"indices 0 to {count - 1}"
            )
        return [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in self.device_indices]

    def read(self, pids: frozenset[int]) -> list[DeviceReading]:
        nvml = self._nvml
        if nvml is None:
            raise GpuReadError("NVML read failed: the source is not open")
        try:
            return [self._read_device(nvml, index, handle, pids) for index, handle in self._handles]
        except (nvml.NVMLError, nvml.NVMLLibraryMismatchError) as exc:
            raise GpuReadError(f"NVML read failed: {exc}") from exc

    @staticmethod
    def _read_device(
        nvml: ModuleType, index: int, handle: object, pids: frozenset[int]
    ) -> DeviceReading:
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            utilization = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except nvml.NVMLError as exc:
            if not _unsupported(nvml, exc):
                raise
            utilization = math.nan
        try:
            power = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0  # mW
        except nvml.NVMLError as exc:
            if not _unsupported(nvml, exc):
                raise
            power = math.nan
        try:
            temperature: float | None = float(
                nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            )
        except nvml.NVMLError as exc:
            if not _unsupported(nvml, exc):
                raise
            temperature = None
        process_used = 0
        if pids:
            try:
                processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except nvml.NVMLError as exc:
                if not _unsupported(nvml, exc):
                    raise
                processes = []
            process_used = sum(int(p.usedGpuMemory or 0) for p in processes if int(p.pid) in pids)
        return DeviceReading(
            device_index=index,
            total_bytes=int(memory.total),
            used_bytes=int(memory.used),
            free_bytes=int(memory.free),
            utilization_percent=utilization,
            power_watts=power,
            temperature_c=temperature,
            process_used_bytes=process_used,
        )

    def close(self) -> None:
        self._handles = []
        nvml, self._nvml = self._nvml, None
        if nvml is not None:
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError as exc:
                log.debug("nvmlShutdown failed: %s", exc)


class _SimGpuReport(BaseModel):
    """The fields of ``GET /sim/gpu`` the sampler uses (the server sends more)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    total_bytes: int
    used_bytes: int
    free_bytes: int
    utilization_percent: float
    power_watts: float
    process_pid: int
    process_used_bytes: int
    clock_lag_s: float = 0.0


class SimSource:
    """The virtual device of ``tuner sim-serve``, read from its ``/sim/gpu`` endpoint.

    One kept-alive HTTP connection (stdlib only, no proxy), reopened after a failure.
    The server's process memory counts only when its pid is among the watched pids,
    as NVML would report it.
    """

    name = "sim"

    def __init__(self, base_url: str, *, timeout_s: float = SIM_TIMEOUT_S) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"sim-serve URL {base_url!r} is not an http(s)://host:port address")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._path = parts.path.rstrip("/") + "/sim/gpu"
        self._conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout_s)
        return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)

    def open(self) -> None:
        self._conn = self._connect()

    def _get(self) -> tuple[int, bytes]:
        reused = self._conn is not None
        for _attempt in range(2):
            if self._conn is None:
                self._conn = self._connect()
            try:
                self._conn.request("GET", self._path, headers={"accept": "application/json"})
                response = self._conn.getresponse()
                return response.status, response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if not reused:
                    raise
                reused = False  # the server closed an idle kept-alive connection: retry once
            except BaseException:
                self.close()
                raise
        raise AssertionError("unreachable")

    def read(self, pids: frozenset[int]) -> list[DeviceReading]:
        url = f"{self.base_url}/sim/gpu"
        try:
            status, body = self._get()
        except (OSError, http.client.HTTPException) as exc:
            raise GpuReadError(f"GET {url} failed: {exc or type(exc).__name__}") from exc
        if status != 200:
            raise GpuReadError(f"GET {url} answered HTTP {status}")
        try:
            report = _SimGpuReport.model_validate_json(body)
        except ValidationError as exc:
            raise GpuReadError(
                f"GET {url} answered an unexpected body: {exc.errors()[0]['msg']}"
            ) from exc
        return [
            DeviceReading(
                device_index=0,
                total_bytes=report.total_bytes,
                used_bytes=report.used_bytes,
                free_bytes=report.free_bytes,
                utilization_percent=report.utilization_percent,
                power_watts=report.power_watts,
                temperature_c=None,
                process_used_bytes=report.process_used_bytes if report.process_pid in pids else 0,
            )
        ]

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def make_source(
    kind: str,
    *,
    base_url: str | None = None,
    device_indices: Sequence[int] | None = None,
    visible: str | None = None,
) -> GpuSource:
    """The source named on the command line (``--gpu-source nvml|sim|none``); NVML reads
    the GPUs the server may use (``visible``: its CUDA_VISIBLE_DEVICES where it is given
    one, else this process's)."""
    accepted = ", ".join(k.value for k in GpuSourceKind)
    try:
        source_kind = GpuSourceKind(kind.strip().lower())
    except ValueError:
        raise ConfigError(f"unknown GPU source {kind!r}; accepted: {accepted}") from None
    match source_kind:
        case GpuSourceKind.NVML:
            return NvmlSource(device_indices, visible=visible)
        case GpuSourceKind.SIM:
            if not base_url:
                raise ConfigError("GPU source 'sim' needs the sim-serve URL (http://host:port)")
            return SimSource(base_url)
        case GpuSourceKind.NONE:
            return NoneSource()


def release_watch(kind: str, *, visible: str | None = None) -> GpuSource | None:
    """What a launch watches to know the previous server's device memory is free again.

    NVML on a GPU host (vLLM's workers can hold memory for a moment after their process
    group is gone); nothing for the simulated engine, whose virtual device belongs to its
    own process and is gone when it exits, or where no GPU is sampled. Every launch path
    (trial, edge probe, confirmation, serve) takes its memory source from here. It watches
    the server's GPUs only (``visible``, else this process's CUDA_VISIBLE_DEVICES): another
    job's memory on a GPU the server does not use is never waited for.
    """
    if GpuSourceKind(kind) is not GpuSourceKind.NVML:
        return None
    return NvmlSource(visible=visible)


# --- process tree ----------------------------------------------------------------------------


def _read_stat(pid_text: str) -> bytes | None:
    """``/proc/<pid>/stat``, or None when the process is gone (raw os calls: a scan is hot)."""
    try:
        fd = os.open(f"/proc/{pid_text}/stat", os.O_RDONLY)
    except OSError:  # exited between listdir and open (ENOENT, ESRCH)
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def _parent_pids() -> dict[int, int]:
    """pid -> parent pid of every process /proc lists; vanished processes are skipped."""
    parents: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return parents
    for entry in entries:
        if not entry.isdigit():
            continue
        text = _read_stat(entry)
        if not text:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = text[text.rfind(b")") + 2 :].split()
        if len(fields) >= 2:
            parents[int(entry)] = int(fields[1])
    return parents


def process_tree(pid: int) -> frozenset[int]:
    """``pid`` and all its descendants, read from /proc (Linux).

    Empty when ``pid`` is not running; just ``{pid}`` where /proc is unavailable.
    Processes that exit during the scan are left out, not errors. One call reads
    every process's stat file (about 12 µs each); ``ProcessTree`` caches it.
    """
    if not os.path.isdir("/proc/self"):
        return frozenset({pid})
    parents = _parent_pids()
    if pid not in parents:
        return frozenset()
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    tree = {pid}
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in tree:
                tree.add(child)
                stack.append(child)
    return frozenset(tree)


class ProcessTree:
    """``process_tree(pid)`` rescanned at most every ``refresh_s``: the sampler's ``pids``.

    A server's workers start once, at launch; a new one is seen within ``refresh_s``.
    """

    def __init__(self, pid: int, *, refresh_s: float = 1.0) -> None:
        self.pid = pid
        self.refresh_s = refresh_s
        self._tree: frozenset[int] = frozenset()
        self._scanned_s = -math.inf

    def __call__(self) -> frozenset[int]:
        now = time.monotonic()
        if now - self._scanned_s >= self.refresh_s:
            self._tree = process_tree(self.pid)
            self._scanned_s = now
        return self._tree


# --- summary ---------------------------------------------------------------------------------


class GpuSummary(BaseModel):
    """What a trial's GPU timeline comes to.

    Figures are per device; with several devices (tensor parallel) each is the worst
    device's: the largest peaks and the smallest headroom. ``samples`` counts sampling
    instants, not rows. NaN utilization or power (not reported) is left out.
    """

    model_config = ConfigDict(frozen=True)

    source: str
    samples: int
    devices: int = 0
    total_bytes: int | None = None
    peak_used_bytes: int | None = None
    peak_process_used_bytes: int | None = None
    p99_used_bytes: int | None = None
    headroom_bytes: int | None = None  # total - peak used, on the device with the least
    peak_utilization_percent: float | None = None
    mean_power_watts: float | None = None
    errors: int = 0
    first_error: str | None = None
    note: str | None = None


def _percentile(sorted_values: Sequence[int], fraction: float) -> int:
    """Nearest-rank percentile of a sorted, non-empty sequence."""
    rank = max(math.ceil(fraction * len(sorted_values)), 1)
    return sorted_values[rank - 1]


def summarize(
    samples: Iterable[GpuSample],
    *,
    source: str,
    errors: int = 0,
    first_error: str | None = None,
) -> GpuSummary:
    """The summary of a timeline (in memory, or read back with ``read_timeline``)."""
    by_device: dict[int, list[GpuSample]] = {}
    instants: set[float] = set()
    for sample in samples:
        by_device.setdefault(sample.device_index, []).append(sample)
        instants.add(sample.t_s)
    if not by_device:
        note = NOT_SAMPLED_NOTE if source == GpuSourceKind.NONE else "no GPU samples were taken"
        return GpuSummary(
            source=source, samples=0, errors=errors, first_error=first_error, note=note
        )
    peak_used: list[int] = []
    p99_used: list[int] = []
    headroom: list[tuple[int, int]] = []  # (headroom, total) per device
    for device_samples in by_device.values():
        used = sorted(s.used_bytes for s in device_samples)
        total = max(s.total_bytes for s in device_samples)
        peak_used.append(used[-1])
        p99_used.append(_percentile(used, 0.99))
        headroom.append((total - used[-1], total))
    everything = [s for device_samples in by_device.values() for s in device_samples]
    utilization = [
        s.utilization_percent for s in everything if math.isfinite(s.utilization_percent)
    ]
    power = [s.power_watts for s in everything if math.isfinite(s.power_watts)]
    least_headroom, total_of_tightest = min(headroom)
    return GpuSummary(
        source=source,
        samples=len(instants),
        devices=len(by_device),
        total_bytes=total_of_tightest,
        peak_used_bytes=max(peak_used),
        peak_process_used_bytes=max(s.process_used_bytes for s in everything),
        p99_used_bytes=max(p99_used),
        headroom_bytes=least_headroom,
        peak_utilization_percent=max(utilization) if utilization else None,
        mean_power_watts=round(sum(power) / len(power), 3) if power else None,
        errors=errors,
        first_error=first_error,
    )


# --- timeline CSV ----------------------------------------------------------------------------


def _row(sample: GpuSample) -> list[str]:
    return [
        repr(sample.t_s),
        str(sample.device_index),
        str(sample.total_bytes),
        str(sample.used_bytes),
        str(sample.free_bytes),
        repr(sample.utilization_percent),
        repr(sample.power_watts),
        "" if sample.temperature_c is None else repr(sample.temperature_c),
        str(sample.process_used_bytes),
    ]


def read_timeline(path: Path) -> list[GpuSample]:
    """The samples of a timeline CSV the sampler wrote, in file order."""
    try:
        with path.open(newline="") as file:
            reader = csv.reader(file)
            header = next(reader, None)
            if header is None or tuple(header) != TIMELINE_COLUMNS:
                raise GpuTimelineError(
                    f"{path}: not a GPU timeline (header {header!r}; expected "
                    f"{','.join(TIMELINE_COLUMNS)})"
                )
            samples: list[GpuSample] = []
            for row in reader:
                if not row:
                    continue
                try:
                    t, index, total, used, free, util, power, temp, process = row
                    samples.append(
                        GpuSample(
                            t_s=float(t),
                            device_index=int(index),
                            total_bytes=int(total),
                            used_bytes=int(used),
                            free_bytes=int(free),
                            utilization_percent=float(util),
                            power_watts=float(power),
                            temperature_c=float(temp) if temp else None,
                            process_used_bytes=int(process),
                        )
                    )
                except ValueError as exc:
                    raise GpuTimelineError(
                        f"{path}:{reader.line_num}: malformed GPU sample {row!r} ({exc})"
                    ) from exc
            return samples
    except OSError as exc:
        raise GpuTimelineError(f"cannot read GPU timeline {path}: {exc.strerror}") from exc


# --- the sampler -----------------------------------------------------------------------------


class GpuSampler:
    """Samples a GpuSource every ``interval_s`` on a daemon thread until ``stop()``.

    ``start()`` opens the source (raising GpuSamplingUnavailable in the caller) and
    the timeline CSV; a failed read in the thread is counted and the first message
    kept, sampling goes on. ``pids`` is called before each read: the process tree
    whose memory ``process_used_bytes`` sums (``ProcessTree(server.pid)``).
    """

    def __init__(
        self,
        source: GpuSource,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        timeline_path: Path | None = None,
        pids: Callable[[], frozenset[int]] = lambda: frozenset(),
    ) -> None:
        if not interval_s > 0:
            raise ConfigError(f"GPU sampling interval {interval_s} s must be above 0")
        self.source = source
        self.interval_s = interval_s
        self.timeline_path = timeline_path
        self._pids = pids
        self._samples: list[GpuSample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._file: IO[str] | None = None
        self._writer: _csv.Writer | None = None
        self._start_s = 0.0
        self.started_unix_s: float | None = None  # wall clock at t_s = 0, to align with requests
        self._errors = 0
        self._first_error: str | None = None
        self._summary: GpuSummary | None = None
        self.thread_cpu_s = 0.0  # CPU time the sampling thread used, known after stop()

    # -- public -------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("a GpuSampler starts once")
        self.source.open()
        if self.timeline_path is not None:
            try:
                self._file = self.timeline_path.open("w", newline="")
            except OSError as exc:
                self.source.close()
                raise GpuTimelineError(
                    f"cannot write GPU timeline {self.timeline_path}: {exc.strerror}"
                ) from exc
            self._writer = csv.writer(self._file)
            self._writer.writerow(TIMELINE_COLUMNS)
        self._start_s = time.monotonic()
        self.started_unix_s = time.time()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._thread.start()
        log.debug("GPU sampler started: source %s every %s s", self.source.name, self.interval_s)

    def stop(self) -> GpuSummary:
        """Stops the thread (promptly: it waits on an Event) and returns the summary."""
        if self._summary is not None:
            return self._summary
        self._stop.set()
        if self._thread is not None:
            self._thread.join(JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                log.warning(
                    "GPU sampler thread still in a %s read after %s s; leaving it behind",
                    self.source.name,
                    JOIN_TIMEOUT_S,
                )
        else:
            self.source.close()
        self._summary = summarize(
            self.samples,
            source=self.source.name,
            errors=self._errors,
            first_error=self._first_error,
        )
        return self._summary

    @property
    def samples(self) -> list[GpuSample]:
        """A copy of the samples so far (safe while the thread runs)."""
        with self._lock:
            return list(self._samples)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        cpu_start_s = time.thread_time()
        next_s = self._start_s
        last_flush_s = self._start_s
        try:
            while True:
                self._tick()
                now = time.monotonic()
                if now - last_flush_s >= FLUSH_INTERVAL_S:
                    self._flush()
                    last_flush_s = now
                next_s += self.interval_s
                if next_s < now:  # a slow read: skip the missed ticks, keep the phase
                    next_s += math.ceil((now - next_s) / self.interval_s) * self.interval_s
                if self._stop.wait(next_s - now):
                    break
        finally:
            self._flush()
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
            self.source.close()
            self.thread_cpu_s = time.thread_time() - cpu_start_s

    def _tick(self) -> None:
        t_s = time.monotonic() - self._start_s
        try:
            readings = self.source.read(self._pids())
        except Exception as exc:  # a failed read must not end the trial's sampling
            self._record_error(str(exc) or type(exc).__name__)
            return
        samples = [GpuSample.at(t_s, reading) for reading in readings]
        with self._lock:
            self._samples.extend(samples)
        if self._writer is not None:
            try:
                self._writer.writerows(_row(s) for s in samples)
            except OSError as exc:
                self._drop_timeline(exc)

    def _flush(self) -> None:
        if self._file is not None:
            try:
                self._file.flush()
            except OSError as exc:
                self._drop_timeline(exc)

    def _drop_timeline(self, exc: OSError) -> None:
        """The disk failed the timeline (full, gone): sampling goes on in memory only."""
        self._record_error(f"cannot write GPU timeline {self.timeline_path}: {exc.strerror}")
        self._writer = None
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def _record_error(self, message: str) -> None:
        self._errors += 1
        if self._first_error is None:
            self._first_error = message
            log.warning("GPU sampling (%s): %s", self.source.name, message)
        else:
            log.debug("GPU sampling (%s): %s", self.source.name, message)


def wait_until_released(
    source: GpuSource,
    *,
    baseline_used_bytes: dict[int, int],
    slack_bytes: int = 512 * 1024 * 1024,
    timeout_s: float = 60.0,
    interval_s: float = 0.25,
) -> bool:
    """Block until every device's used memory is back near its baseline (before the launch).

    vLLM's workers can hold device memory for a moment after their process group is
    gone; the next trial must not start until it is released, or its startup sees
    less free memory than it should.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        readings = source.read(frozenset())
        if all(
            r.used_bytes <= baseline_used_bytes.get(r.device_index, r.used_bytes) + slack_bytes
            for r in readings
        ):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
