"""The simulated engine's KV-cache blocks: a pool with hash-chained prefix caching.

As in vLLM V1 (``vllm/v1/core/block_pool.py``): a full block's hash chains the
parent block's hash with the block's token ids, so two requests sharing a prefix
share its blocks. Freed blocks that hold a cached prefix stay reusable until the
pool needs them; which cached block is evicted first is the eviction policy's
choice (vLLM: least recently used). Block 0 is vLLM's null block: never handed out,
and left out of the usage vLLM reports.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from enum import StrEnum

from tuner.sim.lost_history import LostHistory
from tuner.sim.residency import ResidencyRecorder


class EvictionPolicy(StrEnum):
    """Which free cached block to reuse first. Only LRU is vLLM's; the rest are what-ifs."""

    LRU = "lru"
    LFU = "lfu"
    FIFO = "fifo"
    TIERED = "tiered"


class _Block:
    __slots__ = ("block_id", "depth", "first_cached_s", "hash", "hits", "last_used_s", "ref_count")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.hits = 0
        self.last_used_s = 0.0
        self.first_cached_s = 0.0
        self.depth = 0  # position of the block in its prompt (0: the first block)


class BlockPool:
    """Fixed pool of KV blocks; every method is O(1) or O(log n) per block."""

    def __init__(self, num_blocks: int, policy: EvictionPolicy = EvictionPolicy.LRU) -> None:
        self.num_blocks = num_blocks
        self.policy = policy
        # Block 0 is the null block (vLLM's placeholder for skipped blocks): never allocated.
        # The others are made when first handed out: a pool has up to 10^5 or more, and
        # making them all took a tenth of a short simulation that used a few thousand.
        self._blocks = [_Block(0)] if num_blocks > 0 else []
        self._fresh = min(num_blocks, 1)  # blocks _fresh .. num_blocks - 1: never handed out
        # Freed blocks without a cached prefix, the most recently freed last. With the
        # fresh ones below them (in ascending order from the top), this is the stack of
        # plain free blocks that the pool hands out from the top.
        self._free_plain: list[int] = []
        # Free blocks that still hold a cached prefix, in eviction order (LRU / FIFO).
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        # LFU / tiered: a heap of (priority..., counter, block_id) with lazy deletion.
        self._heap: list[tuple[float, float, int, int]] = []
        self._counter = itertools.count()
        self._by_hash: dict[int, int] = {}
        self.cache_queries_tokens = 0
        self.cache_hits_tokens = 0
        # --kv-cache-metrics: sampled block lifecycles (None: off).
        self.residency: ResidencyRecorder | None = None
        # The simulator's own record of evicted hashes (None: prefix caching off).
        self.history: LostHistory | None = None

    # -- accounting -------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self._free_plain) + self.num_blocks - self._fresh + len(self._free_cached)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, as vLLM's kv_cache_usage_perc (cached free blocks count free)."""
        usable = self.num_blocks - 1  # the null block is never free nor in use
        return 1.0 - self.num_free / usable if usable > 0 else 0.0

    # -- prefix cache -----------------------------------------------------------------------

    def lookup(self, block_hashes: list[int], now_s: float) -> list[int]:
        """Longest run of cached blocks for these hashes; the blocks are taken (ref +1)."""
        found: list[int] = []
        for h in block_hashes:
            block_id = self._by_hash.get(h)
            if block_id is None:
                break
            found.append(block_id)
        for block_id in found:
            block = self._blocks[block_id]
            if block.ref_count == 0:
                self._free_cached.pop(block_id, None)
            block.ref_count += 1
            block.hits += 1
            block.last_used_s = now_s
        if self.residency is not None and found:
            self.residency.accessed(found, now_s)
        return found

    def cache_block(self, block_id: int, block_hash: int, depth: int, now_s: float) -> None:
        """Register a block that just became full under its chained hash."""
        if block_hash in self._by_hash:
            return
        block = self._blocks[block_id]
        block.hash = block_hash
        block.depth = depth
        block.first_cached_s = now_s
        block.last_used_s = now_s
        self._by_hash[block_hash] = block_id
        if self.history is not None:
            self.history.cached(block_hash)

    def cache_blocks(
        self, block_ids: list[int], block_hashes: list[int], start: int, end: int, now_s: float
    ) -> None:
        """``cache_block`` for positions ``start .. end - 1`` of a request's blocks, in order
        (a prefill caches a prompt's worth at once)."""
        by_hash = self._by_hash
        blocks = self._blocks
        history = self.history
        for depth in range(start, end):
            block_hash = block_hashes[depth]
            if block_hash in by_hash:
                continue
            if history is not None:
                history.cached(block_hash)
            block_id = block_ids[depth]
            block = blocks[block_id]
            block.hash = block_hash
            block.depth = depth
            block.first_cached_s = now_s
            block.last_used_s = now_s
            by_hash[block_hash] = block_id

    # -- allocation -------------------------------------------------------------------------

    def allocate(self, n: int, now_s: float) -> list[int] | None:
        """n fresh blocks, evicting cached free blocks if needed; None if there are not enough.

        Plain free blocks go first (the most recently freed first), then cached ones in
        the policy's eviction order."""
        plain = self._free_plain
        fresh = self.num_blocks - self._fresh
        if n > len(plain) + fresh + len(self._free_cached):
            return None
        from_plain = min(n, len(plain))
        out = plain[len(plain) - from_plain :]
        out.reverse()  # as popped one by one from the end
        del plain[len(plain) - from_plain :]
        from_fresh = min(n - from_plain, fresh)
        if from_fresh:
            out += self._take_fresh(from_fresh)
        if from_plain + from_fresh < n:
            out += self._evict_many(n - from_plain - from_fresh)
        blocks = self._blocks
        for block_id in out:
            block = blocks[block_id]
            block.ref_count = 1
            block.hits = 0
            block.last_used_s = now_s
        if self.residency is not None:
            self.residency.allocated(out, now_s)
        return out

    def allocate_one(self, now_s: float) -> int | None:
        """``allocate(1, now_s)``'s block (a decode's next block), or None."""
        if self._free_plain:
            block_id = self._free_plain.pop()
        elif self._fresh < self.num_blocks:
            block_id = self._take_fresh(1)[0]
        elif self._free_cached:
            block_id = self._evict()
        else:
            return None
        block = self._blocks[block_id]
        block.ref_count = 1
        block.hits = 0
        block.last_used_s = now_s
        if self.residency is not None:
            self.residency.allocated([block_id], now_s)
        return block_id

    def _take_fresh(self, n: int) -> list[int]:
        """The next n blocks never handed out, made now (ascending, as they lie in the stack)."""
        first = self._fresh
        self._fresh = first + n
        self._blocks += [_Block(block_id) for block_id in range(first, first + n)]
        return list(range(first, first + n))

    def free(self, block_ids: list[int], now_s: float) -> None:
        """Release a request's blocks; the tail is released first, so it is evicted first."""
        blocks = self._blocks
        plain = self._free_plain
        cached = self._free_cached
        lru = self.policy is EvictionPolicy.LRU
        for block_id in reversed(block_ids):
            block = blocks[block_id]
            block.ref_count -= 1
            if block.ref_count > 0:
                continue
            block.last_used_s = now_s
            if block.hash is None:
                plain.append(block_id)
            else:
                cached[block_id] = None
                if not lru:
                    heapq.heappush(
                        self._heap, (*self._priority(block), next(self._counter), block_id)
                    )

    def _priority(self, block: _Block) -> tuple[float, float]:
        if self.policy is EvictionPolicy.FIFO:
            return block.first_cached_s, 0.0
        if self.policy is EvictionPolicy.LFU:
            return float(block.hits), block.last_used_s
        # Tiered: one-off blocks first (FIFO), then short hot prefixes (LRU), and long
        # prefixes that were reused (LFU) last.
        if block.hits == 0:
            return 0.0, block.first_cached_s
        if block.depth < 4:
            return 1.0, block.last_used_s
        return 2.0 + block.hits, block.last_used_s

    def _evict_many(self, n: int) -> list[int]:
        """n cached free blocks, evicted in order (their hashes forgotten)."""
        if self.policy is not EvictionPolicy.LRU:
            return [self._evict() for _ in range(n)]
        popitem = self._free_cached.popitem
        blocks = self._blocks
        by_hash = self._by_hash
        history = self.history
        out: list[int] = []
        for _ in range(n):
            block_id = popitem(last=False)[0]
            block = blocks[block_id]
            if block.hash is not None and by_hash.get(block.hash) == block_id:
                del by_hash[block.hash]
                if history is not None:
                    history.evicted(block.hash)
            block.hash = None
            out.append(block_id)
        return out

    def _evict(self) -> int:
        if self.policy is not EvictionPolicy.LRU:
            while self._heap:
                first, second, _, block_id = heapq.heappop(self._heap)
                block = self._blocks[block_id]
                # Entries go stale when a block is reused and freed again: skip those.
                current = block_id in self._free_cached and self._priority(block) == (first, second)
                if current:
                    del self._free_cached[block_id]
                    break
            else:  # every entry was stale: fall back to LRU order
                block_id, _ = self._free_cached.popitem(last=False)
        else:
            block_id, _ = self._free_cached.popitem(last=False)
        block = self._blocks[block_id]
        if block.hash is not None and self._by_hash.get(block.hash) == block_id:
            del self._by_hash[block.hash]
            if self.history is not None:
                self.history.evicted(block.hash)
        block.hash = None
        return block_id
