"""The names of ``--kv-cache-metrics``' histograms, and of the simulator's own eviction truth.

vLLM's, read in 0.32: ``vllm/v1/metrics/loggers.py`` registers the three histograms
(labels ``model_name`` and ``engine``) with the ``kv_cache_residency`` buckets of
``vllm/v1/metrics/buckets.py``; ``vllm/config/observability.py`` samples
``kv_cache_metrics_sample`` of the blocks (default 0.01). The ``tuner_sim:`` series are
the simulated engine's alone (``tuner.sim.lost_history``): vLLM exports nothing like them.
"""

from __future__ import annotations

KV_CACHE_RESIDENCY_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
    10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0,
)  # fmt: skip
DEFAULT_SAMPLE_RATE = 0.01  # ObservabilityConfig.kv_cache_metrics_sample

LIFETIME_METRIC = "vllm:kv_block_lifetime_seconds"
IDLE_BEFORE_EVICT_METRIC = "vllm:kv_block_idle_before_evict_seconds"
REUSE_GAP_METRIC = "vllm:kv_block_reuse_gap_seconds"
RESIDENCY_METRICS: tuple[tuple[str, str], ...] = (
    (
        LIFETIME_METRIC,
        "Histogram of KV cache block lifetime from allocation to eviction. Sampled "
        "metrics (controlled by --kv-cache-metrics-sample).",
    ),
    (
        IDLE_BEFORE_EVICT_METRIC,
        "Histogram of idle time before KV cache block eviction. Sampled metrics "
        "(controlled by --kv-cache-metrics-sample).",
    ),
    (
        REUSE_GAP_METRIC,
        "Histogram of time gaps between consecutive KV cache block accesses. Only the "
        "most recent accesses are recorded (ring buffer). Sampled metrics (controlled by "
        "--kv-cache-metrics-sample).",
    ),
)

# The simulated engine's own (never under vLLM's ``vllm:`` prefix).
SIM_PREFIX = "tuner_sim:"
SIM_MISS_TOKENS_METRIC = "tuner_sim:prefix_cache_miss_tokens"  # labels request, cause
SIM_CONTINUING_METRIC = "tuner_sim:continuing_requests"
SIM_HISTORY_EVICTED_METRIC = "tuner_sim:history_evicted_requests"
