"""Which GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` mapped to NVML devices.

NVML lists every GPU of the host whatever ``CUDA_VISIBLE_DEVICES`` says; CUDA (and so
vLLM) sees only those it names. Everything the tuner reads from NVML about "its" GPUs
(the profile it plans with, how many a server may take, the memory the sampler and the
release wait watch) goes through ``visible_gpus`` so it is about those GPUs only, never
another job's device 0.

``CUDA_VISIBLE_DEVICES`` as CUDA reads it:

* unset: every GPU; empty: none;
* a comma-separated list of entries, each an index (NVML's order, which is CUDA's under
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and, on a host of one GPU model, under CUDA's default
  order too), a ``GPU-<uuid>`` or a ``MIG-<uuid>``; a UUID may be shortened to any prefix
  that names one device only;
* the first entry that names no device (out of range, unknown or ambiguous UUID, a
  device already listed, anything else) ends the list: the devices before it stay visible.

A GPU in MIG mode runs CUDA work only in its MIG devices: its index or ``GPU-`` UUID stands
for its first MIG device, and CUDA shows one process a single MIG device (NVIDIA's MIG user
guide), so a list that reaches a MIG device keeps that one device alone. The legacy
``MIG-GPU-<uuid>/<gi>/<ci>`` form (drivers before R470) is not read. Where NVML refuses the
MIG queries (no permission: a container without the MIG monitor capability) the tuner
cannot tell which slice it has nor its memory, and says so in one line (ConfigError).

The NVML module is imported when called (``pynvml``, nvidia-ml-py), never at import time.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import ModuleType

from tuner.errors import ConfigError
from tuner.vllm.gpus import MigShare, ResolvedGpu, gpu_from_nvml

log = logging.getLogger(__name__)

VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"
MIG_PERMISSION_FIX = (
    "give NVML the MIG monitor capability (run as root, or in a container set "
    "NVIDIA_MIG_MONITOR_DEVICES=all), or --backend sim"
)


def pynvml_module() -> ModuleType:
    """The NVML binding (``import pynvml``), looked up at each call so a test's stand-in
    put first on ``sys.path`` is the one used."""
    return importlib.import_module("pynvml")


@dataclass(frozen=True)
class VisibleGpu:
    """One device this process may use, as NVML reads it.

    ``handle`` is NVML's handle of the device (a MIG device's for a slice), valid while the
    NVML session that read it lasts. ``nvml_index`` is the physical GPU's index (a slice's
    parent); ``cuda_index`` the device's index inside the process. Memory and compute
    capability are None where NVML could not read them.
    """

    cuda_index: int
    nvml_index: int
    uuid: str
    name: str
    total_bytes: int | None
    compute_capability: tuple[int, int] | None
    handle: object = field(compare=False, repr=False)
    parent_name: str = ""
    mig: MigShare | None = None

    @property
    def is_mig(self) -> bool:
        return self.mig is not None

    def profile(self) -> ResolvedGpu:
        """The GPU profile to plan with (``tuner.vllm.gpus.gpu_from_nvml``)."""
        return gpu_from_nvml(
            self.parent_name or self.name,
            total_bytes=self.total_bytes if self.mig is None else self.mig.parent_total_bytes,
            compute_capability=self.compute_capability,
            mig=self.mig,
        )


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _is(nvml: ModuleType, exc: BaseException, *names: str) -> bool:
    return any(isinstance(exc, getattr(nvml, name, ())) for name in names)


@dataclass
class _Gpu:
    """A physical GPU and, where it is in MIG mode, its MIG devices (read when needed)."""

    index: int
    handle: object
    uuid: str
    name: str
    _mig: list[tuple[str, object]] | None = None  # (uuid, handle) of its MIG devices

    def mig_devices(self, nvml: ModuleType) -> list[tuple[str, object]]:
        if self._mig is None:
            self._mig = _read_mig_devices(nvml, self)
        return self._mig


def _refuse(gpu: _Gpu, exc: BaseException) -> ConfigError:
    return ConfigError(
        f"NVML refused the MIG queries on GPU {gpu.index} {gpu.name!r} ({exc}): the tuner "
        f"cannot tell which MIG slice this process gets nor its memory; accepted: "
        f"{MIG_PERMISSION_FIX}"
    )


def _read_mig_devices(nvml: ModuleType, gpu: _Gpu) -> list[tuple[str, object]]:
    """The MIG devices of ``gpu``; [] where it is not in MIG mode (or cannot be)."""
    try:
        current = int(nvml.nvmlDeviceGetMigMode(gpu.handle)[0])
    except nvml.NVMLError as exc:
        if _is(nvml, exc, "NVMLError_NoPermission"):
            raise _refuse(gpu, exc) from exc
        return []  # not supported (before Ampere), no such function: no MIG
    if current != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return []
    devices: list[tuple[str, object]] = []
    try:
        slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(gpu.handle))
        for slot in range(slots):
            try:
                handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, slot)
            except nvml.NVMLError as exc:
                if _is(nvml, exc, "NVMLError_NotFound", "NVMLError_InvalidArgument"):
                    continue  # an empty slot
                raise
            devices.append((_text(nvml.nvmlDeviceGetUUID(handle)), handle))
    except nvml.NVMLError as exc:
        if _is(nvml, exc, "NVMLError_NoPermission"):
            raise _refuse(gpu, exc) from exc
        raise
    return devices


def _by_prefix(wanted: str, candidates: list[str]) -> int | None:
    """The index of the one candidate ``wanted`` is a prefix of (CUDA's rule), else None."""
    hits = [i for i, uuid in enumerate(candidates) if uuid.lower().startswith(wanted.lower())]
    return hits[0] if len(hits) == 1 else None


def _entry(
    nvml: ModuleType, text: str, gpus: list[_Gpu]
) -> tuple[_Gpu, tuple[str, object] | None] | None:
    """The device one CUDA_VISIBLE_DEVICES entry names (a GPU, or a GPU and one of its MIG
    devices), or None: the entry names none."""
    gpu: _Gpu | None = None
    if re.fullmatch(r"\d+", text):
        index = int(text)
        gpu = gpus[index] if index < len(gpus) else None
    elif text.upper().startswith("GPU-") and len(text) > 4:
        hit = _by_prefix(text, [g.uuid for g in gpus])
        gpu = None if hit is None else gpus[hit]
    elif text.upper().startswith("MIG-") and len(text) > 4 and "/" not in text:
        pairs = [(g, mig) for g in gpus for mig in g.mig_devices(nvml)]
        hit = _by_prefix(text, [mig[0] for _g, mig in pairs])
        return None if hit is None else pairs[hit]
    if gpu is None:
        return None
    migs = gpu.mig_devices(nvml)
    if migs:
        return gpu, migs[0]
    try:
        mig_mode = int(nvml.nvmlDeviceGetMigMode(gpu.handle)[0])
    except nvml.NVMLError:
        mig_mode = 0
    if mig_mode == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return None  # MIG mode with no instance: CUDA finds no device there
    return gpu, None


def _memory_total(nvml: ModuleType, handle: object) -> int | None:
    try:
        total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    except nvml.NVMLError as exc:
        log.debug("NVML reads no memory: %s", exc)
        return None
    return total if total > 0 else None


def _multiprocessors(nvml: ModuleType, handle: object) -> int | None:
    try:
        count = int(nvml.nvmlDeviceGetAttributes(handle).multiprocessorCount)
    except (nvml.NVMLError, AttributeError):
        return None
    return count if count > 0 else None


def _compute_capability(nvml: ModuleType, handle: object) -> tuple[int, int] | None:
    try:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    except nvml.NVMLError:
        return None
    return int(major), int(minor)


def _mig_profile(name: str) -> str:
    match = re.search(r"\b(\d+g\.\d+gb(?:\+\w+)?)\b", name, flags=re.IGNORECASE)
    return match.group(1) if match else ""


def read_visible(
    nvml: ModuleType, visible: str | None = None, *, environ: Mapping[str, str] | None = None
) -> tuple[VisibleGpu, ...]:
    """The devices a process with ``CUDA_VISIBLE_DEVICES=visible`` may use (default: this
    process's environment), read through ``nvml``, which the caller has initialised and
    keeps initialised while it uses the handles. ConfigError where NVML refuses the MIG
    queries a device needs."""
    if visible is None:
        visible = (os.environ if environ is None else environ).get(VISIBLE_DEVICES_ENV)
    count = int(nvml.nvmlDeviceGetCount())
    gpus: list[_Gpu] = []
    for index in range(count):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        gpus.append(
            _Gpu(
                index=index,
                handle=handle,
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                name=_text(nvml.nvmlDeviceGetName(handle)),
            )
        )
    if visible is None:
        entries = [str(g.index) for g in gpus]
    else:
        entries = [e.strip() for e in visible.split(",")] if visible.strip() else []
    named: list[tuple[_Gpu, tuple[str, object] | None]] = []
    seen: set[str] = set()
    for text in entries:
        found = _entry(nvml, text, gpus)
        if found is None:
            if visible is None:
                continue  # unset: a GPU in MIG mode with no instance is simply not a device
            log.debug("%s: %r names no device; the list ends there", VISIBLE_DEVICES_ENV, text)
            break
        key = found[1][0] if found[1] is not None else found[0].uuid
        if key in seen:
            break
        seen.add(key)
        named.append(found)
    if any(mig is not None for _gpu, mig in named):
        named = named[:1]  # CUDA shows one process one MIG device
    result: list[VisibleGpu] = []
    for cuda_index, (gpu, mig) in enumerate(named):
        capability = _compute_capability(nvml, gpu.handle)
        parent_total = _memory_total(nvml, gpu.handle)
        if mig is None:
            result.append(
                VisibleGpu(
                    cuda_index=cuda_index, nvml_index=gpu.index, uuid=gpu.uuid, name=gpu.name,
                    total_bytes=parent_total, compute_capability=capability, handle=gpu.handle,
                    parent_name=gpu.name,
                )
            )  # fmt: skip
            continue
        mig_uuid, mig_handle = mig
        mig_name = _text(nvml.nvmlDeviceGetName(mig_handle))
        mig_total = _memory_total(nvml, mig_handle)
        share = None
        if mig_total is not None and parent_total is not None:
            share = MigShare(
                profile=_mig_profile(mig_name),
                total_bytes=mig_total,
                parent_total_bytes=parent_total,
                multiprocessors=_multiprocessors(nvml, mig_handle),
                parent_multiprocessors=_multiprocessors(nvml, gpu.handle),
            )
        if share is None:
            raise ConfigError(
                f"NVML reads no memory for MIG device {mig_uuid} ({mig_name!r}) of GPU "
                f"{gpu.index}: the tuner cannot plan or sample the slice; accepted: "
                f"{MIG_PERMISSION_FIX}"
            )
        result.append(
            VisibleGpu(
                cuda_index=cuda_index, nvml_index=gpu.index, uuid=mig_uuid, name=mig_name,
                total_bytes=mig_total, compute_capability=capability, handle=mig_handle,
                parent_name=gpu.name, mig=share,
            )
        )  # fmt: skip
    return tuple(result)


@contextlib.contextmanager
def nvml_session(nvml: ModuleType | None = None) -> Iterator[ModuleType | None]:
    """NVML initialised for the block (its module), or None where there is no NVML here
    (no library, no driver)."""
    module = nvml
    try:
        if module is None:
            module = pynvml_module()
        module.nvmlInit()
    except Exception as exc:  # no library, no driver: no GPU here
        log.debug("no NVML here: %s", exc)
        yield None
        return
    try:
        yield module
    finally:
        try:
            module.nvmlShutdown()
        except Exception:
            log.debug("nvmlShutdown failed", exc_info=True)


def server_devices(visible: str | None, gpus: int) -> str:
    """The CUDA_VISIBLE_DEVICES entries a server of ``gpus`` GPUs uses: vLLM takes the first
    ``gpus`` devices it is shown (its ranks are cuda:0 .. cuda:gpus-1), so the others a
    host makes visible are not the server's. ``visible`` None: the process shows every
    GPU, and the server uses 0 .. gpus-1."""
    if visible is None:
        return ",".join(str(index) for index in range(gpus))
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    return ",".join(entries[:gpus])


def visible_gpus(visible: str | None = None) -> tuple[VisibleGpu, ...]:
    """The GPUs this process may use (``CUDA_VISIBLE_DEVICES``, or ``visible``); () without
    NVML or a driver. The handles are stale once this returns: use ``read_visible`` inside
    an NVML session to read the devices. ConfigError where NVML refuses the MIG queries."""
    with nvml_session() as nvml:
        if nvml is None:
            return ()
        try:
            return read_visible(nvml, visible)
        except nvml.NVMLError as exc:
            log.debug("NVML could not list the devices: %s", exc)
            return ()
