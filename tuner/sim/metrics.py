"""The simulator's ``/metrics``: vLLM's Prometheus names, labels and buckets, written by hand.

The exposition follows what ``prometheus_client`` prints for vLLM's V1 metric
loggers (``vllm/v1/metrics/loggers.py``): counters carry ``_total`` and
``_created`` samples, histograms ``_bucket``/``_count``/``_sum``/``_created``,
every series is labelled ``model_name`` and ``engine="0"``. Latencies are in the
server's own (wall-clock) seconds and are observed when a request finishes.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise

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


def format_value(value: float) -> str:
    """A sample value as prometheus_client writes it (Go's float formatting)."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


@dataclass
class Histogram:
    """Cumulative-bucket histogram over fixed upper bounds."""

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

    def cumulative(self) -> list[tuple[float, int]]:
        running = 0
        out: list[tuple[float, int]] = []
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += n
            out.append((bound, running))
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


class ServerMetrics:
    """Request-level metrics the server records; engine counters are read at render time."""

    def __init__(self, model_name: str, *, created_s: float | None = None) -> None:
        self.model_name = model_name
        self.created_s = time.time() if created_s is None else created_s
        self.histograms = {name: Histogram(bounds) for name, _, bounds in _HISTOGRAMS}
        self.request_success = dict.fromkeys(FinishReason, 0)

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

    # -- exposition -------------------------------------------------------------------------

    def _labels(self, **extra: str) -> str:
        pairs = {"model_name": self.model_name, "engine": "0", **extra}
        body = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs.items())
        return "{" + body + "}"

    def render(self, snapshot: EngineSnapshot) -> str:
        lines: list[str] = []
        labels = self._labels()
        gauges = (
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                snapshot.num_running,
            ),
            (
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                snapshot.num_waiting,
            ),
            (
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                snapshot.kv_cache_usage,
            ),
        )
        for name, help_text, value in gauges:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
            lines.append(f"{name}{labels} {format_value(value)}")
        counters = (
            (
                "vllm:num_preemptions",
                "Cumulative number of preemption from the engine.",
                snapshot.num_preemptions,
            ),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", snapshot.prompt_tokens),
            (
                "vllm:generation_tokens",
                "Number of generation tokens processed.",
                snapshot.generation_tokens,
            ),
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                snapshot.prefix_cache_queries,
            ),
            (
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                snapshot.prefix_cache_hits,
            ),
        )
        created = format_value(self.created_s)
        for name, help_text, count in counters:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
            lines.append(f"{name}_total{labels} {format_value(count)}")
            lines.append(f"{name}_created{labels} {created}")
        name = "vllm:request_success"
        lines += [
            f"# HELP {name} Count of successfully processed requests.",
            f"# TYPE {name} counter",
        ]
        for reason, count in self.request_success.items():
            reason_labels = self._labels(finished_reason=reason.value)
            lines.append(f"{name}_total{reason_labels} {format_value(count)}")
            lines.append(f"{name}_created{reason_labels} {created}")
        for name, help_text, _ in _HISTOGRAMS:
            histogram = self.histograms[name]
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
            for bound, cumulative in histogram.cumulative():
                le = self._labels(le=format_value(bound))
                lines.append(f"{name}_bucket{le} {format_value(cumulative)}")
            lines.append(f"{name}_count{labels} {format_value(histogram.count)}")
            lines.append(f"{name}_sum{labels} {format_value(histogram.total)}")
            lines.append(f"{name}_created{labels} {created}")
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
