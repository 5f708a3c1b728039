"""What each new compile key costs a tune: the first launch of a block size and KV dtype.

vLLM keys its torch.compile cache (``$VLLM_CACHE_ROOT/torch_compile_cache/<hash>/``) on
``VllmConfig.compute_hash()``. Of the knobs the tuner turns, the KV-cache dtype is in it in
every release, the block size since the hashing became opt-out (vllm-project/vllm PR
#26468, November 2025) and the tensor-parallel size through ``ParallelConfig``;
``gpu_memory_utilization``, ``kv_cache_memory_bytes``, prefix caching, ``max_num_seqs``
and ``max_num_batched_tokens`` are not (``CacheConfig``'s ignored factors; the scheduler's
hash has none). So the first launch of each (block size, KV dtype) pair compiles the
model again, and a tune that searches both pays that per pair.

``CompileLaunches`` follows one tune's launches: a trial whose pair was not launched
before in this run gets a note for its line, with its launch seconds against those of
the warm launches so far, and whether vLLM's cache gained an entry (the evidence that it
compiled) or already had one (compiled by an earlier run sharing the cache).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from tuner.vllm.space import TrialParams

COMPILE_CACHE_DIR = "torch_compile_cache"


@dataclass(frozen=True)
class CompileKey:
    """The searched knobs of a launch that enter vLLM's compile hash."""

    block_size: int | None
    kv_cache_dtype: str
    tensor_parallel_size: int | None

    @classmethod
    def of(cls, params: TrialParams) -> CompileKey:
        return cls(params.block_size, params.kv_cache_dtype, params.tensor_parallel_size)

    def text(self) -> str:
        block = "default" if self.block_size is None else str(self.block_size)
        out = f"block size {block}, KV {self.kv_cache_dtype}"
        return out + (f", TP {self.tensor_parallel_size}" if self.tensor_parallel_size else "")


@dataclass
class CompileLaunches:
    """One tune's launches by compile key; ``cache_root`` is the servers' VLLM_CACHE_ROOT
    (None: not known, the note then says nothing of the cache)."""

    cache_root: Path | None
    seen: set[CompileKey] = field(default_factory=set)
    warm_launch_s: list[float] = field(default_factory=list)

    def entries(self) -> frozenset[str]:
        """The compile cache's entries (one directory per hash) now."""
        if self.cache_root is None:
            return frozenset()
        try:
            return frozenset(p.name for p in (self.cache_root / COMPILE_CACHE_DIR).iterdir())
        except OSError:
            return frozenset()

    def launched(
        self, params: TrialParams, launch_s: float | None, *, before: frozenset[str]
    ) -> str | None:
        """Record one trial's launch (``launch_s``: seconds until it was ready, None where it
        did not start or was screened); a note for its line where its key is new."""
        key = CompileKey.of(params)
        added = self.entries() - before
        if key in self.seen:
            if launch_s is not None and not added:
                self.warm_launch_s.append(launch_s)
            return None
        if launch_s is None and not added:
            return None  # never launched, or failed before it compiled
        self.seen.add(key)
        if added:
            how = "compiled (a new entry in vLLM's compile cache)"
        elif self.cache_root is not None and before:
            how = "found compiled in vLLM's compile cache"
        else:
            how = "compiled"
        if launch_s is None:
            cost = "it did not start"
        elif self.warm_launch_s:
            warm_s = statistics.median(self.warm_launch_s)
            n = len(self.warm_launch_s)
            cost = (
                f"launch {launch_s:.0f} s vs {warm_s:.0f} s warm "
                f"(median of {n}; {launch_s - warm_s:+.0f} s)"
            )
        else:
            cost = f"launch {launch_s:.0f} s (no warm launch yet to compare)"
        return f"first launch of {key.text()} in this run: {how}; {cost}"
