"""vLLM's startup plan, as the simulated engine keeps it: ``VLLM_ENABLE_STARTUP_PLAN=1``.

vLLM's ``vllm/v1/worker/startup_plan.py`` (read 2026-12-04): with
``VLLM_ENABLE_STARTUP_PLAN=1`` each worker persists the KV-cache memory its memory
profile sized, under ``$VLLM_CACHE_ROOT/startup_plan/startup_plan_<fingerprint>.json``
(``schema``, ``fingerprint``, ``kv_cache_memory_bytes``, ``free_memory_baseline``), and a
later boot whose fingerprint matches and whose device has at least that much free memory
applies it as ``kv_cache_memory_bytes`` and skips the profile; an explicit
``--kv-cache-memory-bytes`` is never overridden. The fingerprint hashes
``VllmConfig.compute_hash()`` (vLLM's version and the graph-shaping configs: the compile
key, ``tuner.sim.compile_cache``; ``CacheConfig.compute_hash`` leaves out
``gpu_memory_utilization``), the device's name, total memory and capability, torch and
CUDA, the rank and the world size.

So a plan recorded on a *cold* boot (``tuner.vllm.boot``: torch.compile's memory charged
in the profile) keeps its smaller KV cache on every later boot, warm ones included, until
the fingerprint changes. The simulator's fingerprint is the compile key's factors, the
max-model-len and the virtual GPU; its hash is its own.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tuner.sim.compile_cache import cache_root, compile_factors
from tuner.vllm.gpus import GpuSpec
from tuner.vllm.memory import ServingParams
from tuner.vllm.versions import VllmVersion

ENABLE_ENV = "VLLM_ENABLE_STARTUP_PLAN"
PLAN_DIR = "startup_plan"
PLAN_SCHEMA_VERSION = 1


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(ENABLE_ENV, "0").strip().lower() in ("1", "true")


@dataclass(frozen=True)
class StartupPlan:
    """One server's startup plan file (rank 0)."""

    path: Path
    fingerprint: str

    @classmethod
    def of(
        cls,
        model: str,
        params: ServingParams,
        version: VllmVersion,
        gpu: GpuSpec,
        max_model_len: int,
        environ: Mapping[str, str] | None = None,
    ) -> StartupPlan | None:
        """The plan file these settings would use; None when the startup plan is off."""
        if not enabled(environ):
            return None
        factors = {
            "schema": PLAN_SCHEMA_VERSION,
            **compile_factors(model, params, version),
            "max_model_len": max_model_len,
            "device_name": gpu.name,
            "device_total_memory": gpu.cuda_total_bytes,
            "rank": 0,
            "world_size": params.tensor_parallel_size,
        }
        digest = hashlib.sha256(json.dumps(factors, sort_keys=True).encode()).hexdigest()[:16]
        path = cache_root(environ) / PLAN_DIR / f"startup_plan_{digest}.json"
        return cls(path=path, fingerprint=digest)

    def load(self, free_bytes: int) -> tuple[int, int] | None:
        """(kv_cache_memory_bytes, its free-memory baseline) to apply; None where there is
        no plan, it is unreadable, or the device has less free memory than it recorded."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("fingerprint") != self.fingerprint:
            return None
        kv, baseline = data.get("kv_cache_memory_bytes"), data.get("free_memory_baseline")
        if not isinstance(kv, int) or not isinstance(baseline, int) or kv <= 0:
            return None
        if free_bytes < baseline:
            return None
        return kv, baseline

    def save(self, kv_cache_memory_bytes: int, free_bytes: int) -> None:
        """Persist a profiled boot's KV-cache memory (atomically, as vLLM does)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "schema": PLAN_SCHEMA_VERSION,
            "fingerprint": self.fingerprint,
            "kv_cache_memory_bytes": int(kv_cache_memory_bytes),
            "free_memory_baseline": int(free_bytes),
        }
        tmp = self.path.with_name(f"{self.path.name}.tmp.{os.getpid()}")
        tmp.write_text(json.dumps(payload), encoding="utf-8")
        tmp.replace(self.path)
