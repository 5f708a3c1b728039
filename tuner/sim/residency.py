"""The simulated engine's ``--kv-cache-metrics``: KV block residency, sampled as vLLM samples it.

Read in vLLM 0.32 (``vllm/v1/core/kv_cache_metrics.py``, ``vllm/v1/core/block_pool.py``,
``vllm/v1/metrics/loggers.py``, ``vllm/v1/metrics/buckets.py``):

* a block is sampled when the pool hands it out (``on_block_allocated``), each with
  probability ``--kv-cache-metrics-sample`` (default 0.01);
* a prefix-cache hit on it (``BlockPool.touch``) is an access: it sets the last access
  and joins a ring of the last 4 accesses;
* when the pool hands the block out again (``_maybe_evict_cached_block``, called on
  every block taken from the free queue while prefix caching is on) its sample ends in
  an eviction event: lifetime since its allocation, idle time since its last access
  (the allocation when it was never hit), and the gaps between its recorded accesses;
* the events are drained at each stats interval into three histograms,
  ``vllm:kv_block_lifetime_seconds``, ``vllm:kv_block_idle_before_evict_seconds`` and
  ``vllm:kv_block_reuse_gap_seconds``, with the ``kv_cache_residency`` buckets.

Times here are the engine's (virtual GPU) seconds; the server scales them to its wall
clock when it observes them.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from dataclasses import dataclass

from tuner.vllm.kv_cache_metrics import DEFAULT_SAMPLE_RATE

__all__ = ["DEFAULT_SAMPLE_RATE", "EvictionEvent", "ResidencyRecorder"]
ACCESS_HISTORY = 4  # BlockMetricsState.access_history: deque(maxlen=4)


@dataclass(frozen=True)
class EvictionEvent:
    """One sampled block handed out again: vLLM's ``KVCacheEvictionEvent``, engine seconds."""

    lifetime_s: float
    idle_s: float
    reuse_gaps_s: tuple[float, ...]
    at_s: float = 0.0  # when the block was handed out again


class _Sample:
    __slots__ = ("accesses", "born_s", "last_access_s")

    def __init__(self, now_s: float) -> None:
        self.born_s = now_s
        self.last_access_s = now_s
        self.accesses: deque[float] = deque(maxlen=ACCESS_HISTORY)


class ResidencyRecorder:
    """Sampled block lifecycles of one block pool, drained as eviction events."""

    def __init__(self, sample_rate: float, *, prefix_caching: bool, seed: int = 0) -> None:
        if not 0.0 < sample_rate <= 1.0:
            raise ValueError(f"sample_rate must be in (0, 1.0], got {sample_rate}")
        self.sample_rate = sample_rate
        # vLLM ends a sample only in _maybe_evict_cached_block, which runs with prefix
        # caching on: without it, no eviction events are ever recorded.
        self.prefix_caching = prefix_caching
        self._rng = random.Random(seed ^ 0x5EED)
        self._samples: dict[int, _Sample] = {}
        self._events: list[EvictionEvent] = []

    def allocated(self, block_ids: list[int], now_s: float) -> None:
        """Blocks handed out by the pool: a sampled one's previous life ends (an eviction)."""
        samples = self._samples
        rate = self.sample_rate
        draw = self._rng.random
        for block_id in block_ids:
            if self.prefix_caching and (ended := samples.pop(block_id, None)) is not None:
                gaps = tuple(b - a for a, b in itertools.pairwise(ended.accesses))
                self._events.append(
                    EvictionEvent(
                        lifetime_s=now_s - ended.born_s,
                        idle_s=now_s - ended.last_access_s,
                        reuse_gaps_s=gaps,
                        at_s=now_s,
                    )
                )
            if draw() < rate:
                samples[block_id] = _Sample(now_s)

    def accessed(self, block_ids: list[int], now_s: float) -> None:
        """Prefix-cache hits on these blocks (vLLM's ``touch``)."""
        samples = self._samples
        for block_id in block_ids:
            sample = samples.get(block_id)
            if sample is not None:
                sample.last_access_s = now_s
                sample.accesses.append(now_s)

    def drain(self) -> list[EvictionEvent]:
        events, self._events = self._events, []
        return events
