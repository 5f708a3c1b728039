"""``vllm:cache_config_info``: the KV cache the engine sized, on the simulator's /metrics.

vLLM exposes its ``CacheConfig`` once the engine is initialized as an info gauge set to 1
whose labels are the config's fields as strings (``vllm/v1/metrics/loggers.py``
``PrometheusStatLogger.log_metrics_info("cache_config", ...)``; ``vllm/config/cache.py``
``CacheConfig.metrics_info``: ``{key: str(value) for key, value in self.__dict__.items()}``)
plus ``engine``, and no ``model_name``. Among them ``num_gpu_blocks``, set after the memory
profile, and in recent releases ``kv_cache_size_tokens`` and ``kv_cache_max_concurrency``:
the figures a cold boot (``tuner.vllm.boot``) shows smaller than a warm one. The simulator
exposes the fields its plan knows.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from tuner.vllm.memory import MemoryPlan

CACHE_CONFIG_INFO = "vllm:cache_config_info"


def cache_config_labels(
    plan: MemoryPlan, *, enable_prefix_caching: bool, kv_cache_memory_bytes: int | None
) -> dict[str, str]:
    """The labels vLLM's CacheConfig gives the gauge, as strings (``None`` as ``"None"``)."""
    return {
        "block_size": str(plan.block_size),
        "gpu_memory_utilization": str(plan.gpu_memory_utilization),
        "cache_dtype": plan.kv_cache_dtype,
        "enable_prefix_caching": str(enable_prefix_caching),
        "num_gpu_blocks": str(plan.num_gpu_blocks),
        "num_cpu_blocks": "None",
        "kv_cache_size_tokens": str(plan.kv_cache_tokens),
        "kv_cache_max_concurrency": str(plan.max_concurrency),
        "kv_cache_memory_bytes": str(kv_cache_memory_bytes),
        "engine": "0",
    }


class CacheConfigInfo(Collector):
    """The info gauge of one server's cache config (constant once it is up)."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels

    def collect(self) -> Iterable[Metric]:
        gauge = GaugeMetricFamily(
            CACHE_CONFIG_INFO,
            "Information of the LLMEngine CacheConfig",
            labels=list(self.labels),
        )
        gauge.add_metric(list(self.labels.values()), 1.0)
        yield gauge


def register_cache_config_info(registry: CollectorRegistry, labels: dict[str, str]) -> None:
    registry.register(CacheConfigInfo(labels))
