"""Host descriptions for the stand-in NVML (``pynvml_standin/pynvml.py``): the names,
memory, MIG mode and processes of real GPU hosts, as NVML reports them.

Each function returns the JSON the stand-in reads from ``STANDIN_NVML_HOST``. Totals are
what ``nvidia-smi`` prints for those parts (MiB): H100 NVL 95830, H100 SXM 81559, A100
80GB 81920 (a 3g.40gb MIG instance 40192, 42 of its 108 SMs).
"""

from __future__ import annotations

from typing import Any

MiB = 1 << 20
GiB = 1 << 30

H100_NVL_BYTES = 95830 * MiB
H100_SXM_BYTES = 81559 * MiB
A100_80GB_BYTES = 81920 * MiB
MIG_3G_40GB_BYTES = 40192 * MiB
OTHER_JOB_PID = 4_000_001  # no such process here: another job's, seen only through NVML
OTHER_JOB_BYTES = 40 * GiB


def _uuid(n: int) -> str:
    return f"GPU-{n:08x}-1111-2222-3333-{n:012x}"


def _gpu(
    n: int, name: str, total: int | None, cc: tuple[int, int], *, used: int = 0, sms: int = 132
) -> dict[str, Any]:
    return {
        "name": name,
        "uuid": _uuid(n),
        "total_bytes": total,
        "used_bytes": used,
        "compute_capability": list(cc),
        "mig_mode": 0,
        "multiprocessor_count": sms,
        "mig_devices": [],
        "processes": [],
    }


def _host(devices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"devices": devices, "no_permission": False, "state_dir": None, **extra}


def h100_nvl_pair() -> dict[str, Any]:
    """Two NVIDIA H100 NVL; device 0 is busy with another job's 40 GiB (run with
    ``CUDA_VISIBLE_DEVICES=1``)."""
    busy = _gpu(0xA0, "NVIDIA H100 NVL", H100_NVL_BYTES, (9, 0), used=OTHER_JOB_BYTES + 512 * MiB)
    busy["processes"] = [{"pid": OTHER_JOB_PID, "used_bytes": OTHER_JOB_BYTES}]
    free = _gpu(0xA1, "NVIDIA H100 NVL", H100_NVL_BYTES, (9, 0), used=512 * MiB)
    return _host([busy, free])


def h100_quad() -> dict[str, Any]:
    """Four NVIDIA H100 80GB HBM3 (run with two of them visible, e.g. ``2,3``); devices 0
    and 1 carry another job."""
    devices = [
        _gpu(0xB0 + i, "NVIDIA H100 80GB HBM3", H100_SXM_BYTES, (9, 0), used=512 * MiB)
        for i in range(4)
    ]
    for device in devices[:2]:
        device["used_bytes"] += OTHER_JOB_BYTES
        device["processes"] = [{"pid": OTHER_JOB_PID, "used_bytes": OTHER_JOB_BYTES}]
    return _host(devices)


def mig_slice(*, no_permission: bool = False) -> dict[str, Any]:
    """An NVIDIA A100-SXM4-80GB in MIG mode with one 3g.40gb instance (42 of 108 SMs);
    ``no_permission``: NVML refuses the MIG device queries."""
    gpu = _gpu(0xC0, "NVIDIA A100-SXM4-80GB", A100_80GB_BYTES, (8, 0), sms=108)
    gpu["mig_mode"] = 1
    gpu["mig_devices"] = [
        {
            "uuid": "MIG-5c9ab5d0-aaaa-5bbb-8ccc-0123456789ab",
            "name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
            "total_bytes": MIG_3G_40GB_BYTES,
            "used_bytes": 13 * MiB,
            "multiprocessor_count": 42,
        }
    ]
    return _host([gpu], no_permission=no_permission)


def unknown_part() -> dict[str, Any]:
    """A part no preset describes: an NVIDIA RTX PRO 6000 Blackwell Server Edition."""
    name = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    return _host([_gpu(0xD0, name, 97887 * MiB, (12, 0), used=512 * MiB, sms=188)])


def unknown_part_without_memory() -> dict[str, Any]:
    """The same unknown part where NVML reads no memory (NOT_SUPPORTED)."""
    name = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    return _host([_gpu(0xD1, name, None, (12, 0), sms=188)])


def single(name: str, total_bytes: int, cc: tuple[int, int]) -> dict[str, Any]:
    """One GPU of NVML's ``name``, memory and compute capability."""
    return _host([_gpu(0xE0, name, total_bytes, cc, used=512 * MiB)])
