"""The simulator's ``/metrics``: vLLM's Prometheus names, labels and buckets.

Exposed with ``prometheus_client``, as vLLM's V1 metric loggers expose theirs
(``vllm/v1/metrics/loggers.py``): counters carry ``_total`` and ``_created`` samples,
histograms ``_bucket``/``_count``/``_sum``/``_created``, every series is labelled
``model_name`` and ``engine="0"``. Each server has its own registry. Latencies are in
the server's own (wall-clock) seconds and are observed when a request finishes; the
engine's gauges and counters are read from its snapshot when ``/metrics`` is asked.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from tuner.sim.cpu_tier import TRANSFER_SIZE_BUCKETS_BYTES, CpuTier, TransferType
from tuner.sim.engine import FinishReason
from tuner.sim.lost_history import LostHistory, MissCause, MissedBy
from tuner.sim.residency import EvictionEvent
from tuner.vllm.kv_cache_metrics import (
    KV_CACHE_RESIDENCY_BUCKETS_S,
    RESIDENCY_METRICS,
    SIM_CONTINUING_METRIC,
    SIM_HISTORY_EVICTED_METRIC,
    SIM_MISS_TOKENS_METRIC,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


@dataclass(frozen=True)
class FinishedRequest:
    """What the server saw of one request, in wall-clock seconds."""

    arrival_s: float
    token_times_s: Sequence[float]
    finish_s: float
    finish_reason: FinishReason


@dataclass(frozen=True)
class TransferSnapshot:
    """One direction of the host link: vLLM's kv_offload counters and size histogram."""

    bytes: int
    time_s: float
    count: int
    size_sum_bytes: float
    bucket_counts: tuple[int, ...]


@dataclass(frozen=True)
class OffloadSnapshot:
    """The CPU tier's metrics (``--kv-offloading-size``) at one moment."""

    cpu_cache_usage: float
    store_threshold_on: bool
    stores_skipped: int
    external_queries_tokens: int
    external_hits_tokens: int
    transfers: tuple[tuple[TransferType, TransferSnapshot], ...]

    @classmethod
    def of(cls, tier: CpuTier) -> OffloadSnapshot:
        return cls(
            cpu_cache_usage=tier.usage,
            store_threshold_on=tier.config.store_threshold >= 2,
            stores_skipped=tier.stores_skipped,
            external_queries_tokens=tier.external_queries_tokens,
            external_hits_tokens=tier.external_hits_tokens,
            transfers=tuple(
                (
                    direction,
                    TransferSnapshot(
                        bytes=t.bytes,
                        time_s=t.time_s,
                        count=t.count,
                        size_sum_bytes=t.size_sum_bytes,
                        bucket_counts=tuple(t.bucket_counts),
                    ),
                )
                for direction, t in tier.transfers.items()
            ),
        )


@dataclass(frozen=True)
class LostHistorySnapshot:
    """The simulator's own ground truth of prefix misses (``tuner.sim.lost_history``)."""

    miss_tokens: tuple[tuple[MissedBy, MissCause, int], ...]
    continuing_requests: int
    history_evicted_requests: int

    @classmethod
    def of(cls, history: LostHistory) -> LostHistorySnapshot:
        return cls(
            miss_tokens=tuple((by, cause, n) for (by, cause), n in history.miss_tokens.items()),
            continuing_requests=history.continuing_requests,
            history_evicted_requests=history.history_evicted_requests,
        )


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine's gauges and counters at one moment."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_preemptions: int
    prompt_tokens: int
    generation_tokens: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    offload: OffloadSnapshot | None = None  # with --kv-offloading-size
    lost_history: LostHistorySnapshot | None = None  # with prefix caching


_HISTOGRAMS = (
    (
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        TTFT_BUCKETS_S,
    ),
    (
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        TOKEN_LATENCY_BUCKETS_S,
    ),
    (
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
        TOKEN_LATENCY_BUCKETS_S,
    ),
    (
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        REQUEST_LATENCY_BUCKETS_S,
    ),
)


_GAUGES = (
    ("vllm:num_requests_running", "Number of requests in model execution batches.", "num_running"),
    ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "num_waiting"),
    ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "kv_cache_usage"),
)
_COUNTERS = (
    ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", "num_preemptions"),
    ("vllm:prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens"),
    ("vllm:generation_tokens", "Number of generation tokens processed.", "generation_tokens"),
    (
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        "prefix_cache_queries",
    ),
    (
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        "prefix_cache_hits",
    ),
)
_LABELS = ("model_name", "engine")


class _EngineCollector(Collector):
    """The engine's gauges and cumulative counters, read from its snapshot at scrape time."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        snapshot = self.metrics.snapshot
        if snapshot is None:
            return
        labels = [self.metrics.model_name, "0"]
        for name, help_text, attr in _GAUGES:
            gauge = GaugeMetricFamily(name, help_text, labels=_LABELS)
            gauge.add_metric(labels, float(getattr(snapshot, attr)))
            yield gauge
        for name, help_text, attr in _COUNTERS:
            counter = CounterMetricFamily(name, help_text, labels=_LABELS)
            counter.add_metric(
                labels, float(getattr(snapshot, attr)), created=self.metrics.created_s
            )
            yield counter
        if snapshot.offload is not None:
            yield from _offload_metrics(snapshot.offload, labels, self.metrics.created_s)
        if snapshot.lost_history is not None:
            yield from _lost_history_metrics(snapshot.lost_history, labels, self.metrics.created_s)


def _lost_history_metrics(
    lost: LostHistorySnapshot, labels: list[str], created_s: float
) -> Iterable[Metric]:
    """The simulator's ground truth of prefix misses, under its own ``tuner_sim:`` names."""
    misses = CounterMetricFamily(
        SIM_MISS_TOKENS_METRIC,
        "Simulator only (not a vLLM metric): missed full prompt blocks, in tokens, by the "
        "requests that missed (continuing: a later turn of a conversation; other) and by "
        "cause: evicted_under_way (an earlier turn of the same conversation, evicted before "
        "this turn), evicted (cached once, not this conversation's history), new (never "
        "cached).",
        labels=[*_LABELS, "request", "cause"],
    )
    for by, cause, tokens in lost.miss_tokens:
        misses.add_metric([*labels, by.value, cause.value], float(tokens), created=created_s)
    yield misses
    continuing = CounterMetricFamily(
        SIM_CONTINUING_METRIC,
        "Simulator only (not a vLLM metric): admitted requests that continue an earlier turn.",
        labels=_LABELS,
    )
    continuing.add_metric(labels, float(lost.continuing_requests), created=created_s)
    yield continuing
    lost_turns = CounterMetricFamily(
        SIM_HISTORY_EVICTED_METRIC,
        "Simulator only (not a vLLM metric): continuing requests whose earlier turns' "
        "blocks were evicted while the conversation was under way.",
        labels=_LABELS,
    )
    lost_turns.add_metric(labels, float(lost.history_evicted_requests), created=created_s)
    yield lost_turns


def _offload_metrics(
    offload: OffloadSnapshot, labels: list[str], created_s: float
) -> Iterable[Metric]:
    """The offloading connector's metrics under vLLM's names (``tuner.sim.cpu_tier``)."""
    counter = CounterMetricFamily(
        "vllm:external_prefix_cache_queries",
        "External prefix cache queries from KV connector cross-instance cache sharing, in "
        "terms of number of queried tokens.",
        labels=_LABELS,
    )
    counter.add_metric(labels, float(offload.external_queries_tokens), created=created_s)
    yield counter
    counter = CounterMetricFamily(
        "vllm:external_prefix_cache_hits",
        "External prefix cache hits from KV connector cross-instance cache sharing, in "
        "terms of number of cached tokens.",
        labels=_LABELS,
    )
    counter.add_metric(labels, float(offload.external_hits_tokens), created=created_s)
    yield counter
    kinds = [*_LABELS, "transfer_type"]
    total_bytes = CounterMetricFamily(
        "vllm:kv_offload_total_bytes", "Number of bytes offloaded by KV connector", labels=kinds
    )
    total_time = CounterMetricFamily(
        "vllm:kv_offload_total_time",
        "Total time measured by all KV offloading operations",
        labels=kinds,
    )
    sizes = HistogramMetricFamily(
        "vllm:kv_offload_size", "Histogram of KV offload transfer size, in bytes.", labels=kinds
    )
    for direction, t in offload.transfers:
        key = [*labels, direction.value]
        total_bytes.add_metric(key, float(t.bytes), created=created_s)
        total_time.add_metric(key, t.time_s, created=created_s)
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip(TRANSFER_SIZE_BUCKETS_BYTES, t.bucket_counts, strict=True):
            cumulative += count
            buckets.append((repr(float(bound)), float(cumulative)))
        buckets.append(("+Inf", float(t.count)))
        sizes.add_metric(key, buckets, t.size_sum_bytes)
    yield total_bytes
    yield total_time
    yield sizes
    gauge = GaugeMetricFamily(
        "vllm:kv_offload_cpu_cache_usage_perc",
        "CPU KV cache usage of the offloading connector. 1 means 100 percent usage.",
        labels=_LABELS,
    )
    gauge.add_metric(labels, offload.cpu_cache_usage)
    yield gauge
    if offload.store_threshold_on:
        counter = CounterMetricFamily(
            "vllm:kv_offload_stores_skipped",
            "Number of KV offload stores skipped because the reuse threshold was not reached.",
            labels=_LABELS,
        )
        counter.add_metric(labels, float(offload.stores_skipped), created=created_s)
        yield counter


class ServerMetrics:
    """Request-level metrics the server records; engine counters are read at render time."""

    def __init__(self, model_name: str, *, created_s: float | None = None) -> None:
        self.model_name = model_name
        self.created_s = time.time() if created_s is None else created_s
        self.snapshot: EngineSnapshot | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(self))
        self.request_success = Counter(
            "vllm:request_success", "Count of successfully processed requests.",
            [*_LABELS, "finished_reason"], registry=self.registry,
        )  # fmt: skip
        for reason in FinishReason:
            self.request_success.labels(model_name, "0", reason.value)
        self.histograms = {
            name: Histogram(
                name, help_text, _LABELS, buckets=bounds, registry=self.registry
            ).labels(model_name, "0")
            for name, help_text, bounds in _HISTOGRAMS
        }
        self.residency: dict[str, Histogram] = {}  # --kv-cache-metrics (empty: off)

    def enable_residency(self) -> None:
        """``--kv-cache-metrics``: the three residency histograms, as vLLM registers them."""
        if self.residency:
            return
        self.residency = {
            name: Histogram(
                name, help_text, _LABELS, buckets=KV_CACHE_RESIDENCY_BUCKETS_S,
                registry=self.registry,
            ).labels(self.model_name, "0")
            for name, help_text in RESIDENCY_METRICS
        }  # fmt: skip

    def observe_evictions(self, events: Sequence[EvictionEvent], time_scale: float) -> None:
        """Sampled evictions (engine seconds, scaled to the server's wall clock), as vLLM's
        logger observes each stats interval's events."""
        if not self.residency:
            return
        lifetime, idle, reuse = (self.residency[name] for name, _ in RESIDENCY_METRICS)
        for event in events:
            lifetime.observe(event.lifetime_s * time_scale)
            idle.observe(event.idle_s * time_scale)
            for gap in event.reuse_gaps_s:
                reuse.observe(gap * time_scale)

    def observe_finished(self, request: FinishedRequest) -> None:
        self.request_success.labels(self.model_name, "0", request.finish_reason.value).inc()
        times = request.token_times_s
        self.histograms["vllm:e2e_request_latency_seconds"].observe(
            request.finish_s - request.arrival_s
        )
        if not times:
            return
        self.histograms["vllm:time_to_first_token_seconds"].observe(times[0] - request.arrival_s)
        itl = self.histograms["vllm:inter_token_latency_seconds"]
        for before, after in pairwise(times):
            itl.observe(after - before)
        if len(times) > 1:
            self.histograms["vllm:request_time_per_output_token_seconds"].observe(
                (times[-1] - times[0]) / (len(times) - 1)
            )

    def render(self, snapshot: EngineSnapshot) -> str:
        """The exposition, with the engine's state as of ``snapshot``."""
        self.snapshot = snapshot
        text: bytes = generate_latest(self.registry)
        return text.decode("utf-8")
