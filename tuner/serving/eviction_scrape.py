"""Eviction evidence of one measured window, from /metrics: vLLM's ``--kv-cache-metrics``
histograms, and on the simulated engine its own ground truth of why later turns missed.

``parse_prometheus`` keeps these families per label set (a bucket's ``le``, a miss's
``request`` and ``cause``) under keys such as ``vllm:kv_block_lifetime_seconds_bucket{le="0.5"}``;
``EvictionEvidence.between`` takes the window's deltas from two scrapes.

What the share means: of the prompt tokens that later turns of a conversation missed in
the prefix cache (neither on the GPU nor in the CPU tier), the share that was their own
conversation's history, cached by an earlier turn and evicted before this one came. The
simulated engine knows it (``tuner.sim.lost_history``). vLLM does not: its histograms
count sampled blocks as they are evicted without the request or conversation that held
them, so on real vLLM the share is not measurable; the idle-before-eviction histogram
against the workload's think time is the closest evidence it gives.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from tuner.vllm.kv_cache_metrics import (
    IDLE_BEFORE_EVICT_METRIC,
    KV_CACHE_RESIDENCY_BUCKETS_S,
    LIFETIME_METRIC,
    REUSE_GAP_METRIC,
    SIM_CONTINUING_METRIC,
    SIM_HISTORY_EVICTED_METRIC,
    SIM_MISS_TOKENS_METRIC,
    SIM_PREFIX,
)

LABELLED_PREFIXES = ("vllm:kv_block_", SIM_PREFIX)  # families kept per label set
_KEPT_LABELS = ("le", "request", "cause")


def labelled_key(name: str, labels: Mapping[str, str]) -> str | None:
    """The key a sample of a per-label-set family is kept under (None: not such a family)."""
    if not name.startswith(LABELLED_PREFIXES):
        return None
    parts = [f'{k}="{labels[k]}"' for k in _KEPT_LABELS if k in labels]
    return f"{name}{{{','.join(parts)}}}" if parts else None


def _le_text(bound: float) -> str:
    return repr(float(bound))  # as prometheus_client writes a bucket's bound


class ResidencyHistogram(BaseModel):
    """One of vLLM's residency histograms over a window: counts per bucket, in seconds."""

    model_config = ConfigDict(frozen=True)

    metric: str  # vLLM's name, e.g. vllm:kv_block_idle_before_evict_seconds
    bounds_s: tuple[float, ...]  # upper bounds, +Inf left out
    bucket_counts: tuple[int, ...]  # per bucket (not cumulative), the +Inf one last
    count: int
    sum_s: float

    @property
    def mean_s(self) -> float | None:
        return self.sum_s / self.count if self.count else None

    def quantile_s(self, q: float) -> float | None:
        """The bucket bound under which a share ``q`` of the observations fall (None:
        empty; the last finite bound when it falls in +Inf)."""
        if not self.count:
            return None
        need = q * self.count
        seen = 0
        for bound, n in zip(self.bounds_s, self.bucket_counts, strict=False):
            seen += n
            if seen >= need:
                return bound
        return self.bounds_s[-1] if self.bounds_s else None

    def share_below_s(self, limit_s: float) -> float | None:
        """The share of observations in buckets whose bound is at most ``limit_s``."""
        if not self.count:
            return None
        below = sum(
            n
            for bound, n in zip(self.bounds_s, self.bucket_counts, strict=False)
            if bound <= limit_s
        )
        return below / self.count

    @classmethod
    def of(cls, metric: str, values_s: Sequence[float]) -> ResidencyHistogram:
        """The histogram vLLM's logger would hold after observing ``values_s``."""
        counts = [0] * (len(KV_CACHE_RESIDENCY_BUCKETS_S) + 1)
        for value in values_s:
            counts[bisect.bisect_left(KV_CACHE_RESIDENCY_BUCKETS_S, value)] += 1
        return cls(
            metric=metric,
            bounds_s=KV_CACHE_RESIDENCY_BUCKETS_S,
            bucket_counts=tuple(counts),
            count=len(values_s),
            sum_s=float(sum(values_s)),
        )

    @classmethod
    def between(
        cls, metric: str, before: Mapping[str, float], after: Mapping[str, float]
    ) -> ResidencyHistogram | None:
        if f"{metric}_count" not in after:
            return None

        def delta(key: str) -> float:
            return after.get(key, 0.0) - before.get(key, 0.0)

        cumulative = [
            delta(f'{metric}_bucket{{le="{_le_text(b)}"}}') for b in KV_CACHE_RESIDENCY_BUCKETS_S
        ]
        count = int(delta(f"{metric}_count"))
        counts = [int(c - p) for c, p in zip(cumulative, [0.0, *cumulative[:-1]], strict=True)]
        counts.append(max(count - int(cumulative[-1]), 0))
        return cls(
            metric=metric,
            bounds_s=KV_CACHE_RESIDENCY_BUCKETS_S,
            bucket_counts=tuple(counts),
            count=count,
            sum_s=delta(f"{metric}_sum"),
        )


class LostHistoryCounts(BaseModel):
    """The simulated engine's ground truth over a window (``tuner_sim:`` series)."""

    model_config = ConfigDict(frozen=True)

    continuing_requests: int  # admitted requests that continue an earlier turn
    history_evicted_requests: int  # of those, whose earlier turns were evicted under way
    continuing_miss_tokens: int  # prompt tokens later turns missed, every cause
    evicted_under_way_tokens: int  # of those, their own history evicted while under way

    @property
    def evicted_under_way_share(self) -> float | None:
        """Of the tokens later turns missed, the share lost to eviction while under way."""
        if self.continuing_miss_tokens <= 0:
            return None
        return self.evicted_under_way_tokens / self.continuing_miss_tokens

    @classmethod
    def between(
        cls, before: Mapping[str, float], after: Mapping[str, float]
    ) -> LostHistoryCounts | None:
        continuing = f"{SIM_CONTINUING_METRIC}_total"
        if continuing not in after:
            return None

        def delta(key: str) -> int:
            return int(after.get(key, 0.0) - before.get(key, 0.0))

        prefix = f'{SIM_MISS_TOKENS_METRIC}_total{{request="continuing",cause="'
        keys = {k for k in after if k.startswith(prefix)}
        return cls(
            continuing_requests=delta(continuing),
            history_evicted_requests=delta(f"{SIM_HISTORY_EVICTED_METRIC}_total"),
            continuing_miss_tokens=sum(delta(k) for k in keys),
            evicted_under_way_tokens=delta(f'{prefix}evicted_under_way"}}'),
        )


class EvictionEvidence(BaseModel):
    """What a window shows of KV evictions: vLLM's residency histograms where the server
    ran with ``--kv-cache-metrics``, and the simulated engine's ground truth."""

    model_config = ConfigDict(frozen=True)

    lifetime: ResidencyHistogram | None = None
    idle_before_evict: ResidencyHistogram | None = None
    reuse_gap: ResidencyHistogram | None = None
    lost_history: LostHistoryCounts | None = None  # the simulated engine only

    @property
    def evicted_under_way_share(self) -> float | None:
        return self.lost_history.evicted_under_way_share if self.lost_history else None

    @property
    def empty(self) -> bool:
        return not (self.lifetime or self.idle_before_evict or self.reuse_gap or self.lost_history)

    @classmethod
    def between(
        cls, before: Mapping[str, float], after: Mapping[str, float]
    ) -> EvictionEvidence | None:
        evidence = cls(
            lifetime=ResidencyHistogram.between(LIFETIME_METRIC, before, after),
            idle_before_evict=ResidencyHistogram.between(IDLE_BEFORE_EVICT_METRIC, before, after),
            reuse_gap=ResidencyHistogram.between(REUSE_GAP_METRIC, before, after),
            lost_history=LostHistoryCounts.between(before, after),
        )
        return None if evidence.empty else evidence
