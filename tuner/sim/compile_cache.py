"""The simulated engine's torch.compile cache: where vLLM keeps it, how vLLM keys it.

vLLM compiles the model with torch.compile on its first start and keeps the result
under ``$VLLM_CACHE_ROOT/torch_compile_cache/<hash>/rank_<r>_0/`` (vllm/envs.py:
``VLLM_CACHE_ROOT``, by default ``$XDG_CACHE_HOME/vllm`` or ``~/.cache/vllm``;
vllm/compilation/backends.py: "Using cache directory: ... for vLLM's torch.compile").
A later start whose hash is there loads the compiled graphs instead ("Directly load the
compiled graph(s) ... from the cache") and starts faster.

The hash is ``VllmConfig.compute_hash()``: vLLM's version and the hashes of the configs
that shape the compiled graph. Of the knobs the tuner turns, the KV-cache dtype is in
``CacheConfig.compute_hash`` in every release; the block size is since the hashing
became opt-out (vllm-project/vllm PR #26468, merged November 2025), which leaves out
``gpu_memory_utilization``, ``kv_cache_memory_bytes`` and prefix caching; the
tensor-parallel size is in ``ParallelConfig``'s; ``SchedulerConfig.compute_hash`` has no
factors (``max_num_seqs``, ``max_num_batched_tokens``). ``--enforce-eager`` compiles
nothing; ``VLLM_DISABLE_COMPILE_CACHE=1`` compiles every time and keeps nothing.
The simulator's key is these factors; its hash is its own (vLLM's also covers the
model's full config, the environment and its own source).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tuner.vllm.memory import ServingParams
from tuner.vllm.versions import VllmVersion

CACHE_ROOT_ENV = "VLLM_CACHE_ROOT"
DISABLE_ENV = "VLLM_DISABLE_COMPILE_CACHE"
COMPILE_CACHE_DIR = "torch_compile_cache"
DEFAULT_BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE
BLOCK_SIZE_IN_HASH = (0, 12)  # PR #26468 (November 2025): every CacheConfig field not left out
FACTORS_FILE = "cache_key_factors.json"
DONE_FILE = "vllm_compile_cache.py"  # written once a rank's graphs are compiled


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """vLLM's cache root as vllm/envs.py resolves it."""
    env = os.environ if environ is None else environ
    given = env.get(CACHE_ROOT_ENV)
    if given:
        return Path(given).expanduser()
    xdg = env.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "vllm"


def compile_factors(model: str, params: ServingParams, version: VllmVersion) -> dict[str, object]:
    """The tuner's knobs that enter vLLM's compile hash for this release."""
    factors: dict[str, object] = {
        "vllm_version": f"{version.major}.{version.minor}",
        "model": model,
        "cache_dtype": params.kv_cache_dtype,
        "tensor_parallel_size": params.tensor_parallel_size,
    }
    if version.at_least(BLOCK_SIZE_IN_HASH):
        factors["block_size"] = params.block_size or DEFAULT_BLOCK_SIZE
    return factors


@dataclass(frozen=True)
class CompileCache:
    """One server's entry in the compile cache: its directory and whether it is warm."""

    directory: Path  # <root>/torch_compile_cache/<hash>
    factors: dict[str, object]
    ranks: int
    enabled: bool = True

    @classmethod
    def of(
        cls,
        model: str,
        params: ServingParams,
        version: VllmVersion,
        environ: Mapping[str, str] | None = None,
    ) -> CompileCache:
        env = os.environ if environ is None else environ
        factors = compile_factors(model, params, version)
        digest = hashlib.sha256(json.dumps(factors, sort_keys=True).encode()).hexdigest()[:10]
        return cls(
            directory=cache_root(env) / COMPILE_CACHE_DIR / digest,
            factors=factors,
            ranks=params.tensor_parallel_size,
            enabled=env.get(DISABLE_ENV, "0").strip() not in ("1", "true", "True"),
        )

    def rank_dir(self, rank: int, *, backbone: bool) -> Path:
        rank_dir = self.directory / f"rank_{rank}_0"
        return rank_dir / "backbone" if backbone else rank_dir

    def warm(self, *, backbone: bool) -> bool:
        """Every rank's graphs compiled by an earlier start."""
        if not self.enabled:
            return False
        return all(
            (self.rank_dir(r, backbone=backbone) / DONE_FILE).is_file() for r in range(self.ranks)
        )

    def store(self, *, backbone: bool) -> None:
        """Keep what a cold start compiled (nothing when the cache is disabled)."""
        if not self.enabled:
            return
        for rank in range(self.ranks):
            where = self.rank_dir(rank, backbone=backbone)
            where.mkdir(parents=True, exist_ok=True)
            (where / DONE_FILE).write_text(
                "# compiled graphs of the simulated engine (tuner sim-serve)\n", encoding="utf-8"
            )
        (self.directory / FACTORS_FILE).write_text(
            json.dumps(self.factors, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
