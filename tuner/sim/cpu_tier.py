"""The simulated engine's CPU tier: vLLM's native KV offloading to pinned host memory.

What vLLM does, read in its source (vllm-project/vllm, 2026):

* ``--kv-offloading-size GiB`` with ``--kv-offloading-backend native`` (the default from
  0.14; ``vllm/config/kv_offloading.py`` before it moved into the config package) turns
  into ``--kv-transfer-config`` with ``kv_connector="OffloadingConnector"``,
  ``kv_role="kv_both"`` and the bytes per rank in ``kv_connector_extra_config``
  (``size x 2**30 / (tp x pp)``); ``lmcache`` gives ``LMCacheConnectorV1`` instead.
  The user's own ``kv_connector_extra_config`` keys stay: ``eviction_policy``
  (``"lru"``, the default, or ``"arc"``) and ``store_threshold``.
* ``vllm/v1/kv_offload/cpu/spec.py`` (``CPUOffloadingSpec``): the CPU blocks are
  ``cpu_bytes_to_use // kv_bytes_per_offloaded_block``, a block's bytes being the GPU
  page size x the KV tensors (layers) x the world size x ``block_size_factor``: all the
  layers of a block in one contiguous region since 0.12 (the layout the January 2026
  post measured), copied by DMA between pinned host memory and the GPU. CPU offloading
  runs on CUDA-alike (and, in 0.32, XPU) GPUs only ("CPU Offloading is currently only
  supported on CUDA-alike and XPU GPUs": vLLM 0.32's CPU build refuses to start with it).
* ``vllm/v1/kv_offload/cpu/manager.py`` (``CPUOffloadingManager``): ``lookup`` counts
  hits and misses; ``prepare_store`` drops blocks already stored, evicts what the new
  ones need through the policy (the offered keys themselves protected) and fails the
  whole store when the policy cannot free enough; ``touch`` is the policy's.
* ``.../offloading/scheduler.py`` (``OffloadingConnectorScheduler``): write-through.
  Each step offers the blocks a request has newly filled (``_get_reqs_to_store``), so a
  block is in host memory before the GPU prefix cache evicts it. A new request first
  touches all its block keys, then looks up the blocks after its GPU prefix hit, stops
  at the first miss, and loads the hits asynchronously (the request waits for them,
  the rest of the batch runs).
* ``store_threshold`` >= 2 (``reuse_manager.py``'s ``FilterReusedOffloadingManager``
  from 0.17, folded into ``CPUOffloadingManager`` by #41727): a bounded LRU counter of
  block keys (``max_tracker_size`` 64,000); only keys counted at least that many times
  are stored. It first counted lookups; #52227 (August 2026) counts store offers, one
  per request that fills the block, as modelled here.
* ``cpu/policies/lru.py``: one ordered map, touch moves keys to the most recent end
  (in reverse, so a prefix's first block is the most recent), eviction from the oldest.
* ``cpu/policies/arc.py``: ARC. T1 (seen once) and T2 (seen again), ghost lists B1/B2
  of evicted keys, and ``target_t1_size``. Insert goes to T1 (and out of the ghosts);
  touch promotes a ready T1 key to T2, refreshes a T2 key, and a key found in B1 raises
  the target by max(1, |B2|/|B1|), one in B2 lowers it by max(1, |B1|/|B2|); eviction
  takes from T1 while T1 is at least the target, else from T2 (falling back to T1 when
  T2 has no candidate: #55461), puts the evicted key in its ghost list and trims each
  ghost list to the capacity.
* Metrics (``.../offloading/metrics.py``, ``cpu/common.py``, ``vllm/v1/metrics``):
  ``vllm:kv_offload_total_bytes`` and ``vllm:kv_offload_total_time`` (counters) and
  ``vllm:kv_offload_size`` (a histogram of bytes, buckets 1e6 .. 200e6), labelled
  ``transfer_type`` ``GPU_to_CPU`` / ``CPU_to_GPU``; ``vllm:kv_offload_cpu_cache_usage_perc``;
  ``vllm:kv_offload_stores_skipped`` (with a store threshold); and the scheduler's
  ``vllm:external_prefix_cache_queries`` / ``_hits`` (tokens).

The transfer time of ``n`` blocks is their bytes over the GPU's host link in that
direction (``GpuSpec.pcie_bandwidth_bytes_per_s``: PCIe Gen5 x16 for H100/H200, Gen4
for L40S/L4/A100 PCIe, NVLink-C2C for GH200); the two directions are queued separately
(the link is full duplex). Written for the tuner from the behaviour above, not copied.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from enum import StrEnum

# vllm's OffloadPromMetrics buckets for vllm:kv_offload_size, in bytes
TRANSFER_SIZE_BUCKETS_BYTES = (1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6)
MAX_TRACKER_SIZE = 64_000  # vLLM's default max_tracker_size for store_threshold


class OffloadPolicy(StrEnum):
    """The native offloading connector's ``eviction_policy`` (vLLM's built-in ones)."""

    LRU = "lru"
    ARC = "arc"


class TransferType(StrEnum):
    """vLLM's ``transfer_type`` label: source medium ``_to_`` destination medium."""

    STORE = "GPU_to_CPU"
    LOAD = "CPU_to_GPU"


@dataclass(frozen=True)
class CpuTierConfig:
    """The CPU tier as vLLM sizes it from ``--kv-offloading-size``."""

    num_blocks: int
    bytes_per_block: int  # all layers and ranks of one block
    host_link_bytes_per_s: float  # one direction
    policy: OffloadPolicy = OffloadPolicy.LRU
    store_threshold: int = 0  # < 2: every block is stored

    @classmethod
    def sized(
        cls,
        size_gib: float,
        bytes_per_block: int,
        host_link_bytes_per_s: float,
        policy: OffloadPolicy = OffloadPolicy.LRU,
        store_threshold: int = 0,
    ) -> CpuTierConfig:
        return cls(
            num_blocks=int(size_gib * (1 << 30)) // max(bytes_per_block, 1),
            bytes_per_block=bytes_per_block,
            host_link_bytes_per_s=host_link_bytes_per_s,
            policy=policy,
            store_threshold=store_threshold,
        )


@dataclass
class TransferTotals:
    """One direction's transfers, as vLLM's counters and histogram keep them."""

    bytes: int = 0
    time_s: float = 0.0
    count: int = 0
    size_sum_bytes: float = 0.0
    bucket_counts: list[int] = field(default_factory=lambda: [0] * len(TRANSFER_SIZE_BUCKETS_BYTES))

    def add(self, num_bytes: int, seconds: float) -> None:
        self.bytes += num_bytes
        self.time_s += seconds
        self.count += 1
        self.size_sum_bytes += num_bytes
        for i, bound in enumerate(TRANSFER_SIZE_BUCKETS_BYTES):
            if num_bytes <= bound:
                self.bucket_counts[i] += 1
                break


class _Policy:
    """Which stored block goes first (vLLM's ``CachePolicy``): keys are block hashes."""

    def __contains__(self, key: int) -> bool:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def insert(self, key: int) -> None:
        raise NotImplementedError

    def touch(self, keys: list[int]) -> None:
        raise NotImplementedError

    def evict(self, n: int, protected: set[int]) -> list[int] | None:
        """n keys evicted in the policy's order, or None (and nothing changed)."""
        raise NotImplementedError


class _Lru(_Policy):
    def __init__(self) -> None:
        self.keys: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, key: int) -> bool:
        return key in self.keys

    def __len__(self) -> int:
        return len(self.keys)

    def insert(self, key: int) -> None:
        self.keys[key] = None

    def touch(self, keys: list[int]) -> None:
        for key in reversed(keys):
            if key in self.keys:
                self.keys.move_to_end(key)

    def evict(self, n: int, protected: set[int]) -> list[int] | None:
        out: list[int] = []
        for key in self.keys:
            if len(out) == n:
                break
            if key not in protected:
                out.append(key)
        if len(out) < n:
            return None
        for key in out:
            del self.keys[key]
        return out


class _Arc(_Policy):
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.target_t1 = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, key: int) -> bool:
        return key in self.t1 or key in self.t2

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def insert(self, key: int) -> None:
        self.t1[key] = None
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def touch(self, keys: list[int]) -> None:
        for key in reversed(keys):
            if key in self.t1:
                del self.t1[key]
                self.t2[key] = None
            elif key in self.t2:
                self.t2.move_to_end(key)
            elif key in self.b1:
                step = max(1.0, len(self.b2) / len(self.b1))
                self.target_t1 = min(self.target_t1 + step, float(self.capacity))
                self.b1.move_to_end(key)
            elif key in self.b2:
                step = max(1.0, len(self.b1) / len(self.b2))
                self.target_t1 = max(self.target_t1 - step, 0.0)
                self.b2.move_to_end(key)

    def evict(self, n: int, protected: set[int]) -> list[int] | None:
        chosen: list[tuple[int, bool]] = []  # (key, from T1)
        t1 = (k for k in self.t1 if k not in protected)
        t2 = (k for k in self.t2 if k not in protected)
        t1_size = len(self.t1)
        while len(chosen) < n:
            key: int | None = None
            from_t1 = False
            if t1_size >= int(self.target_t1):
                key = next(t1, None)
                from_t1 = key is not None
            if key is None:
                key = next(t2, None)
            if key is None:  # T2 has none left: T1's (vLLM #55461)
                key = next(t1, None)
                from_t1 = key is not None
            if key is None:
                return None
            if from_t1:
                t1_size -= 1
            chosen.append((key, from_t1))
        for key, from_t1 in chosen:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
        for ghost in (self.b1, self.b2):
            while len(ghost) > self.capacity:
                ghost.popitem(last=False)
        return [key for key, _ in chosen]


class CpuTier:
    """The CPU blocks of vLLM's native offloading connector, by block hash."""

    def __init__(self, config: CpuTierConfig) -> None:
        self.config = config
        self.policy: _Policy = (
            _Arc(config.num_blocks) if config.policy is OffloadPolicy.ARC else _Lru()
        )
        self.counts: OrderedDict[int, int] | None = (
            OrderedDict() if config.store_threshold >= 2 else None
        )
        self.lookups = 0  # blocks looked up, hits and misses
        self.hits = 0
        self.evictions = 0
        self.stores_skipped = 0  # offered blocks below the store threshold
        self.external_queries_tokens = 0
        self.external_hits_tokens = 0
        self.transfers = {direction: TransferTotals() for direction in TransferType}
        self._link_free_s = dict.fromkeys(TransferType, 0.0)

    @property
    def num_stored(self) -> int:
        return len(self.policy)

    @property
    def usage(self) -> float:
        """vllm:kv_offload_cpu_cache_usage_perc: stored blocks over the tier's."""
        return self.num_stored / self.config.num_blocks if self.config.num_blocks else 0.0

    def transfer_s(self, num_blocks: int) -> float:
        """Seconds to move ``num_blocks`` over the host link one way."""
        return num_blocks * self.config.bytes_per_block / self.config.host_link_bytes_per_s

    def touch(self, keys: list[int]) -> None:
        self.policy.touch(keys)

    def lookup(self, keys: list[int]) -> int:
        """How many of ``keys`` are stored, from the first until a miss."""
        found = 0
        for key in keys:
            self.lookups += 1
            if key not in self.policy:
                break
            self.hits += 1
            found += 1
        return found

    def load(self, num_blocks: int, now_s: float) -> float:
        """Queue a load of ``num_blocks`` to the GPU; when it is done."""
        return self._transfer(TransferType.LOAD, num_blocks, now_s)

    def offer(self, keys: list[int], now_s: float) -> int:
        """A request's newly filled blocks offered for storing (write-through); the
        number stored. Below the store threshold a block is skipped; blocks already
        stored stay; a store the policy cannot make room for is dropped whole."""
        if not keys or self.config.num_blocks == 0:
            return 0
        if self.counts is not None:
            eligible: list[int] = []
            for key in keys:
                count = self.counts.pop(key, 0) + 1
                self.counts[key] = count  # the most recent end
                if len(self.counts) > MAX_TRACKER_SIZE:
                    self.counts.popitem(last=False)
                if count >= self.config.store_threshold:
                    eligible.append(key)
            self.stores_skipped += len(keys) - len(eligible)
            keys = eligible
        new = [key for key in keys if key not in self.policy]
        if not new:
            return 0
        need = len(new) - (self.config.num_blocks - len(self.policy))
        if need > 0:
            evicted = self.policy.evict(need, set(keys))
            if evicted is None:
                return 0
            self.evictions += len(evicted)
        for key in new:
            self.policy.insert(key)
        self._transfer(TransferType.STORE, len(new), now_s)
        return len(new)

    def _transfer(self, direction: TransferType, num_blocks: int, now_s: float) -> float:
        seconds = self.transfer_s(num_blocks)
        done_s = max(self._link_free_s[direction], now_s) + seconds
        self._link_free_s[direction] = done_s
        self.transfers[direction].add(num_blocks * self.config.bytes_per_block, seconds)
        return done_s
