"""The simulator's ``/metrics``: vLLM's Prometheus names, labels and buckets.

Written with ``prometheus_client``, as vLLM's V1 metric loggers write theirs
(``vllm/v1/metrics/loggers.py``): counters carry ``_total`` and ``_created``
samples, histograms ``_bucket``/``_count``/``_sum``/``_created``, every series is
labelled ``model_name`` and ``engine="0"``. Each server has a registry of its own.
Latencies are in the server's own (wall-clock) seconds and are observed when a
request finishes; the engine's gauges and counters are read when ``/metrics`` is.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from tuner.sim.engine import FinishReason

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


@dataclass
class Histogram:
    """Cumulative-bucket histogram over fixed upper bounds (observed without a lock: the
    server's one event loop observes, a scrape reads)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def buckets(self) -> list[tuple[str, float]]:
        """(upper bound as prometheus_client writes it, cumulative count), +Inf last."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += n
            out.append(("+Inf" if math.isinf(bound) else repr(float(bound)), float(running)))
        return out


@dataclass(frozen=True)
class FinishedRequest:
    """What the server saw of one request, in wall-clock seconds."""

    arrival_s: float
    token_times_s: Sequence[float]
    finish_s: float
    finish_reason: FinishReason


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


class ServerMetrics(Collector):
    """Request-level metrics the server records, and the engine's gauges and counters read
    from its snapshot at each scrape; exposed by ``prometheus_client`` (``render``).

    The histograms are counted here, not by ``prometheus_client.Histogram``: a request of
    500 tokens is 500 inter-token observations, each of which that class takes a lock
    for (three times the cost, on the event loop that runs the engine)."""

    def __init__(self, model_name: str, *, created_s: float | None = None) -> None:
        self.model_name = model_name
        self.created_s = time.time() if created_s is None else created_s
        self.histograms = {name: Histogram(bounds) for name, _, bounds in _HISTOGRAMS}
        self.request_success = dict.fromkeys(FinishReason, 0)
        self.snapshot: EngineSnapshot | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def collect(self) -> Iterator[Metric]:
        labels = [self.model_name, "0"]
        snapshot = self.snapshot
        if snapshot is not None:
            for name, help_text, attr in _GAUGES:
                gauge = GaugeMetricFamily(name, help_text, labels=list(_LABELS))
                gauge.add_metric(labels, float(getattr(snapshot, attr)))
                yield gauge
            for name, help_text, attr in _COUNTERS:
                counter = CounterMetricFamily(name, help_text, labels=list(_LABELS))
                counter.add_metric(labels, float(getattr(snapshot, attr)), created=self.created_s)
                yield counter
        success = CounterMetricFamily(
            "vllm:request_success", "Count of successfully processed requests.",
            labels=[*_LABELS, "finished_reason"],
        )  # fmt: skip
        for reason, count in self.request_success.items():
            success.add_metric([*labels, reason.value], float(count), created=self.created_s)
        yield success
        for name, help_text, _ in _HISTOGRAMS:
            histogram = self.histograms[name]
            family = HistogramMetricFamily(name, help_text, labels=list(_LABELS))
            family.add_metric(labels, histogram.buckets(), sum_value=histogram.total)
            family.samples.append(
                Sample(f"{name}_created", dict(zip(_LABELS, labels, strict=True)), self.created_s)
            )
            yield family

    def observe_finished(self, request: FinishedRequest) -> None:
        self.request_success[request.finish_reason] += 1
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
        """The exposition, with the engine's state at ``snapshot``."""
        self.snapshot = snapshot
        return generate_latest(self.registry).decode("utf-8")
