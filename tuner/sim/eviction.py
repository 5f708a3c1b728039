"""``tuner simulate --prefix-cache-eviction``: which evictions are vLLM's and which are what-ifs.

vLLM's GPU prefix cache evicts its free cached blocks least recently used first
(``vllm/v1/core/block_pool.py``'s free-block queue); nothing else is in a release (an
ARC for the GPU block pool is an open pull request). Its native KV offloading connector
evicts the CPU tier by ``lru`` or ``arc`` (``vllm/v1/kv_offload/cpu/policies``). So:

* ``lru``: the GPU prefix cache as vLLM runs it; with ``--kv-offloading-size`` its CPU
  tier is LRU too (the connector's default);
* ``arc``: the GPU prefix cache LRU, the CPU tier ARC, as vLLM runs
  ``"eviction_policy": "arc"``: needs ``--kv-offloading-size``;
* ``lfu``, ``fifo``, ``tiered``: what-ifs for the GPU prefix cache, not in vLLM (a CPU
  tier beside them evicts LRU).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import ConfigError
from tuner.sim.blocks import EvictionPolicy
from tuner.sim.build import SimOptions
from tuner.sim.cpu_tier import OffloadPolicy
from tuner.vllm.versions import VllmVersion


@dataclass(frozen=True)
class Eviction:
    """One choice of ``--prefix-cache-eviction``: the GPU's policy and the CPU tier's."""

    name: str
    gpu: EvictionPolicy
    cpu: OffloadPolicy

    @property
    def in_vllm(self) -> bool:
        return self.gpu is EvictionPolicy.LRU

    def describe(self) -> str:
        if not self.in_vllm:
            return f"{self.name}: a what-if, not in vLLM"
        if self.cpu is OffloadPolicy.ARC:
            return f"{self.name}: vLLM's, the CPU tier's eviction_policy"
        return f"{self.name}: vLLM's"

    def options(
        self,
        *,
        enable_prefix_caching: bool,
        swap_space_gib: float,
        kv_offloading_size_gib: float,
        seed: int,
    ) -> SimOptions:
        return SimOptions(
            enable_prefix_caching=enable_prefix_caching,
            swap_space_gib=swap_space_gib,
            eviction_policy=self.gpu,
            kv_offloading_size_gib=kv_offloading_size_gib,
            offload_policy=self.cpu,
            seed=seed,
        )


ARC = Eviction("arc", EvictionPolicy.LRU, OffloadPolicy.ARC)
EVICTIONS = (
    Eviction("lru", EvictionPolicy.LRU, OffloadPolicy.LRU),
    ARC,
    *(
        Eviction(p.value, p, OffloadPolicy.LRU)
        for p in EvictionPolicy
        if p is not EvictionPolicy.LRU
    ),
)


def eviction_choices(
    name: str, kv_offloading_size_gib: float, version: VllmVersion
) -> list[Eviction]:
    """The chosen eviction first, then the others ``--compare-eviction`` runs (``arc`` only
    beside a CPU tier); one ConfigError line for a name that is none or an ``arc``
    without ``--kv-offloading-size``."""
    by_name = {e.name: e for e in EVICTIONS}
    if name not in by_name:
        raise ConfigError(
            f"--prefix-cache-eviction {name!r} is not a policy; accepted: lru, arc (vLLM's), "
            "lfu, fifo, tiered (what-ifs, not in vLLM)"
        )
    offloading = kv_offloading_size_gib > 0
    if offloading and not version.has_kv_offloading:
        raise ConfigError(
            f"--kv-offloading-size: vLLM {version} has no KV offloading to CPU memory; "
            "accepted: vLLM 0.11.1 or later (--vllm-version)"
        )
    if name == ARC.name and not offloading:
        raise ConfigError(
            "--prefix-cache-eviction arc is the eviction policy of vLLM's CPU tier; accepted: "
            "arc with --kv-offloading-size GIB, or lru (the GPU prefix cache's)"
        )
    chosen = by_name[name]
    others = [e for e in EVICTIONS if e is not chosen and (offloading or e is not ARC)]
    return [chosen, *others]
