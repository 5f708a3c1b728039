"""Host memory a vLLM server pins: the KV offloading buffer, the swap space, offloaded weights.

``--kv-offloading-size`` is allocated up front as pinned (page-locked) host memory, the
whole size summed over the tensor-parallel ranks (``vllm/v1/kv_offload/cpu/spec.py``:
``cpu_bytes_to_use``). Earlier releases allocate the CPU blocks as pinned tensors
(``worker/cpu_gpu.py``); recent ones map one region from ``/dev/shm``
(``cpu/shared_offload_region.py``: ``/dev/shm/vllm_offload_<engine id>.mmap``, checked
against the free space first: "Insufficient space in /dev/shm: ... Increase /dev/shm
(e.g. --shm-size or --ipc=host).") and register it with CUDA, so in a container the
shared-memory mount must hold the whole size. ``--swap-space`` (before 0.18) and ``--cpu-offload-gb`` hold host
memory the same way. Pinned memory cannot be swapped out: a buffer larger than what the
host can give fails the server's start (the allocation raises, or the kernel's OOM
killer ends the process), so the tuner refuses such a size before anything starts.

The GPU's own memory model is ``tuner.vllm.memory``; this is its host side.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tuner.errors import ConfigError

GiB = 1 << 30
# Of the host's RAM, what one server may pin: the rest for the OS, the server's own
# process (tokenizer, scheduler, the weights' staging while loading) and its page cache.
PINNABLE_SHARE = 0.9
# The simulated host's RAM for each of its GPUs: a DGX H100 / H200 node has 2 TiB for 8
# GPUs (NVIDIA DGX H100 user guide, system specifications).
HOST_MEMORY_GIB_PER_GPU = 256.0


@dataclass(frozen=True)
class HostMemoryPlan:
    """What a server pins on its host against what the host has."""

    kv_offloading_bytes: int
    swap_space_bytes: int
    cpu_offload_bytes: int
    host_bytes: int

    @property
    def pinned_bytes(self) -> int:
        return self.kv_offloading_bytes + self.swap_space_bytes + self.cpu_offload_bytes

    @property
    def pinnable_bytes(self) -> int:
        return int(self.host_bytes * PINNABLE_SHARE)

    @property
    def fits(self) -> bool:
        return self.pinned_bytes <= self.pinnable_bytes

    def max_kv_offloading_gib(self) -> float:
        """The largest --kv-offloading-size this host can pin beside the rest."""
        rest = self.swap_space_bytes + self.cpu_offload_bytes
        return max(self.pinnable_bytes - rest, 0) / GiB

    def refusal(self) -> str | None:
        """One line when the host cannot pin it all; None when it can."""
        if self.fits:
            return None
        return (
            f"--kv-offloading-size {self.kv_offloading_bytes / GiB:g} GiB needs "
            f"{self.pinned_bytes / GiB:.1f} GiB of pinned host memory in all (with swap space "
            f"and CPU-offloaded weights), more than the {self.pinnable_bytes / GiB:.1f} GiB "
            f"a server may pin of this host's {self.host_bytes / GiB:.1f} GiB; accepted: at "
            f"most {self.max_kv_offloading_gib():.0f} GiB"
        )


def host_plan(
    *,
    kv_offloading_size_gib: float,
    host_bytes: int,
    swap_space_gib: float = 0.0,
    cpu_offload_gb: float = 0.0,
) -> HostMemoryPlan:
    return HostMemoryPlan(
        kv_offloading_bytes=int(kv_offloading_size_gib * GiB),
        swap_space_bytes=int(swap_space_gib * GiB),
        cpu_offload_bytes=int(cpu_offload_gb * 1e9),  # vLLM's --cpu-offload-gb is in GB
        host_bytes=host_bytes,
    )


def check_pinnable(plan: HostMemoryPlan) -> None:
    """ConfigError, one line, when the host cannot pin the plan's memory."""
    refusal = plan.refusal()
    if refusal is not None:
        raise ConfigError(refusal)


def simulated_host_bytes(gpu_count: int) -> int:
    """The simulated host's RAM: ``HOST_MEMORY_GIB_PER_GPU`` for each of its GPUs."""
    return int(HOST_MEMORY_GIB_PER_GPU * gpu_count * GiB)


def this_host_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """This machine's RAM (MemTotal), None where it cannot be read."""
    try:
        for line in meminfo.read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
