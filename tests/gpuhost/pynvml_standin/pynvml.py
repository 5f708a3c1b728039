"""A stand-in NVML (not a GPU): the ``pynvml`` module of nvidia-ml-py, answering from a
host description instead of a driver, for the tests and the GPU-host rehearsal.

Put this directory first on ``sys.path`` / ``PYTHONPATH`` and point ``STANDIN_NVML_HOST``
at a JSON host description (``tests/gpuhost/hosts.py`` builds them)::

    {"devices": [{"name": "NVIDIA H100 NVL", "uuid": "GPU-...", "total_bytes": int | null,
                  "used_bytes": int, "compute_capability": [9, 0], "mig_mode": 0 | 1,
                  "multiprocessor_count": int,
                  "mig_devices": [{"uuid": "MIG-...", "name": "...", "total_bytes": int,
                                   "used_bytes": int, "multiprocessor_count": int}],
                  "processes": [{"pid": int, "used_bytes": int}]}],
     "no_permission": false,
     "state_dir": "/path" | null}

``used_bytes`` is the device's memory in use (its listed processes included). A JSON file
``<pid>.json`` = ``{"uuid": ..., "used_bytes": int}`` in ``state_dir`` adds a running
process (its pid alive) and its memory to that device (a MIG device's also to its GPU), as
a server on the stand-in host reports itself. ``total_bytes`` null: NVML cannot read the
device's memory (``nvmlDeviceGetMemoryInfo`` is NOT_SUPPORTED). ``no_permission``: the MIG
device queries answer NVML_ERROR_NO_PERMISSION, as in a container without the MIG monitor
capability. The file is read again at every call, so a test may change the host while it
runs. Names are returned as ``str`` (as nvidia-ml-py does on Python 3); errors are
``NVMLError`` subclasses with ``.value``, as nvidia-ml-py raises them.
"""

from __future__ import annotations

import json
import os
import string
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

STANDIN = True  # this is the stand-in NVML, not nvidia-ml-py
HOST_ENV = "STANDIN_NVML_HOST"

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_VALUE_NOT_AVAILABLE_ulonglong = 2**64 - 1
MAX_MIG_DEVICES = 7


class NVMLLibraryMismatchError(Exception):
    pass


class NVMLError(Exception):
    """nvidia-ml-py's error: ``NVMLError(value)`` is an instance of the subclass for that
    value (``NVMLError_NoPermission`` ...), with ``.value``."""

    _valClassMapping: ClassVar[dict[int, type[NVMLError]]] = {}
    _errcode_to_string: ClassVar[dict[int, str]] = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return self._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


def _make_error_classes() -> None:
    """``NVMLError_<Name>`` for every ``NVML_ERROR_<NAME>``, as nvidia-ml-py makes them."""
    module = sys.modules[__name__]
    for const in [n for n in dir(module) if n.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(const.replace("NVML_ERROR_", ""), "_").replace(
            "_", ""
        )
        value = getattr(module, const)

        def new(cls: type[NVMLError], *args: object, _value: int = value) -> NVMLError:
            obj = Exception.__new__(cls)
            obj.value = _value
            return obj

        error_class = type(class_name, (NVMLError,), {"__new__": new})
        error_class.__module__ = __name__
        setattr(module, class_name, error_class)
        NVMLError._valClassMapping[value] = error_class


_make_error_classes()

# --- the host ---------------------------------------------------------------------------------

_init_count = 0


class _Handle:
    """A device handle: a GPU (``mig`` None) or one of its MIG devices."""

    def __init__(self, gpu: int, mig: int | None = None) -> None:
        self.gpu = gpu
        self.mig = mig

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Handle) and (self.gpu, self.mig) == (other.gpu, other.mig)

    def __hash__(self) -> int:
        return hash((self.gpu, self.mig))

    def __repr__(self) -> str:
        return f"<stand-in NVML handle gpu={self.gpu} mig={self.mig}>"


def _host() -> dict[str, Any]:
    path = os.environ.get(HOST_ENV)
    if not path or not Path(path).is_file():
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    host: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    return host


def _checked() -> dict[str, Any]:
    if _init_count <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return _host()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reported(host: dict[str, Any]) -> list[tuple[int, str, int]]:
    """(pid, uuid, used bytes) of the live processes that reported to ``state_dir``."""
    state_dir = host.get("state_dir")
    if not state_dir or not Path(state_dir).is_dir():
        return []
    found = []
    for path in Path(state_dir).glob("*.json"):
        try:
            pid = int(path.stem)
            entry = json.loads(path.read_text(encoding="utf-8"))
            found.append((pid, str(entry["uuid"]), int(entry["used_bytes"])))
        except (ValueError, KeyError, OSError, TypeError):
            continue
    return [(pid, uuid, used) for pid, uuid, used in found if _alive(pid)]


def _device(host: dict[str, Any], handle: object) -> tuple[dict[str, Any], dict[str, Any] | None]:
    if not isinstance(handle, _Handle):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    devices = host.get("devices", [])
    if not 0 <= handle.gpu < len(devices):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    gpu = devices[handle.gpu]
    if handle.mig is None:
        return gpu, None
    migs = gpu.get("mig_devices") or []
    if not 0 <= handle.mig < len(migs):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return gpu, migs[handle.mig]


def _mig_query(host: dict[str, Any]) -> None:
    if host.get("no_permission"):
        raise NVMLError(NVML_ERROR_NO_PERMISSION)


# --- the pynvml functions the tuner calls -----------------------------------------------------


def nvmlInit() -> None:
    global _init_count
    _host()  # no host description: as a machine without the NVIDIA library
    _init_count += 1


def nvmlInitWithFlags(flags: int) -> None:
    nvmlInit()


def nvmlShutdown() -> None:
    global _init_count
    if _init_count <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    _init_count -= 1


def nvmlSystemGetDriverVersion() -> str:
    _checked()
    return "stand-in"


def nvmlDeviceGetCount() -> int:
    return len(_checked().get("devices", []))


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    host = _checked()
    if not 0 <= int(index) < len(host.get("devices", [])):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Handle(int(index))


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> _Handle:
    host = _checked()
    wanted = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    for index, gpu in enumerate(host.get("devices", [])):
        if gpu.get("uuid") == wanted:
            return _Handle(index)
        for mig_index, mig in enumerate(gpu.get("mig_devices") or []):
            if mig.get("uuid") == wanted:
                _mig_query(host)
                return _Handle(index, mig_index)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetIndex(handle: _Handle) -> int:
    _device(_checked(), handle)
    return handle.gpu


def nvmlDeviceGetName(handle: _Handle) -> str:
    gpu, mig = _device(_checked(), handle)
    return str((mig or gpu).get("name", "NVIDIA stand-in GPU"))


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    gpu, mig = _device(_checked(), handle)
    return str((mig or gpu)["uuid"])


def _used(host: dict[str, Any], gpu: dict[str, Any], mig: dict[str, Any] | None) -> int:
    device = mig or gpu
    used = int(device.get("used_bytes", 0))
    uuids = {device.get("uuid")}
    if mig is None:
        uuids |= {m.get("uuid") for m in gpu.get("mig_devices") or []}
    return used + sum(b for _pid, uuid, b in _reported(host) if uuid in uuids)


def nvmlDeviceGetMemoryInfo(handle: _Handle, version: int | None = None) -> SimpleNamespace:
    host = _checked()
    gpu, mig = _device(host, handle)
    total = (mig or gpu).get("total_bytes")
    if total is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    used = min(_used(host, gpu, mig), int(total))
    return SimpleNamespace(total=int(total), used=used, free=int(total) - used, reserved=0)


def nvmlDeviceGetCudaComputeCapability(handle: _Handle) -> tuple[int, int]:
    gpu, _mig = _device(_checked(), handle)
    major, minor = gpu.get("compute_capability", [9, 0])
    return int(major), int(minor)


def nvmlDeviceGetAttributes(handle: _Handle) -> SimpleNamespace:
    gpu, mig = _device(_checked(), handle)
    device = mig or gpu
    if "multiprocessor_count" not in device:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return SimpleNamespace(
        multiprocessorCount=int(device["multiprocessor_count"]),
        memorySizeMB=int(device.get("total_bytes") or 0) >> 20,
    )


def nvmlDeviceGetMigMode(handle: _Handle) -> list[int]:
    gpu, mig = _device(_checked(), handle)
    if mig is not None or "mig_mode" not in gpu:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    mode = int(gpu["mig_mode"])
    return [mode, mode]


def nvmlDeviceIsMigDeviceHandle(handle: _Handle) -> int:
    _device(_checked(), handle)
    return int(handle.mig is not None)


def nvmlDeviceGetMaxMigDeviceCount(handle: _Handle) -> int:
    gpu, mig = _device(_checked(), handle)
    if mig is not None or "mig_mode" not in gpu:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return MAX_MIG_DEVICES


def nvmlDeviceGetMigDeviceHandleByIndex(handle: _Handle, index: int) -> _Handle:
    host = _checked()
    gpu, mig = _device(host, handle)
    if mig is not None or not int(gpu.get("mig_mode", 0)):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    _mig_query(host)
    if not 0 <= int(index) < MAX_MIG_DEVICES:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if int(index) >= len(gpu.get("mig_devices") or []):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return _Handle(handle.gpu, int(index))


def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle: _Handle) -> _Handle:
    _device(_checked(), handle)
    if handle.mig is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Handle(handle.gpu)


def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[SimpleNamespace]:
    host = _checked()
    gpu, mig = _device(host, handle)
    device = mig or gpu
    processes = [
        SimpleNamespace(pid=int(p["pid"]), usedGpuMemory=int(p["used_bytes"]))
        for p in device.get("processes", [])
    ]
    uuids = {device.get("uuid")}
    if mig is None:
        uuids |= {m.get("uuid") for m in gpu.get("mig_devices") or []}
    processes += [
        SimpleNamespace(pid=pid, usedGpuMemory=used)
        for pid, uuid, used in _reported(host)
        if uuid in uuids
    ]
    return processes


def nvmlDeviceGetUtilizationRates(handle: _Handle) -> SimpleNamespace:
    gpu, mig = _device(_checked(), handle)
    if mig is not None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # NVML reports none for MIG devices
    busy = _used(_host(), gpu, None) > 0
    return SimpleNamespace(gpu=50 if busy else 0, memory=0)


def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
    _gpu, mig = _device(_checked(), handle)
    if mig is not None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return 100_000  # mW


def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:
    _gpu, mig = _device(_checked(), handle)
    if mig is not None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return 40
