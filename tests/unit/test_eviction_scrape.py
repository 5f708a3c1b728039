"""A window's eviction evidence read from /metrics as vLLM (and sim-serve) write it:
the residency histograms per bucket and the simulator's tuner_sim: series, as deltas."""

from __future__ import annotations

import pytest

from tuner.serving.eviction_scrape import ResidencyHistogram
from tuner.serving.prometheus_scrape import ServerCounters, parse_prometheus
from tuner.sim.lost_history import MissCause, MissedBy
from tuner.sim.prometheus import EngineSnapshot, LostHistorySnapshot, ServerMetrics
from tuner.sim.residency import EvictionEvent
from tuner.vllm.kv_cache_metrics import IDLE_BEFORE_EVICT_METRIC, KV_CACHE_RESIDENCY_BUCKETS_S


def snapshot(lost: int, new: int, continuing: int, lost_turns: int) -> EngineSnapshot:
    misses = (
        (MissedBy.CONTINUING, MissCause.EVICTED_UNDER_WAY, lost),
        (MissedBy.CONTINUING, MissCause.NEW, new),
        (MissedBy.OTHER, MissCause.NEW, 10_000),  # first turns: not in the share
    )
    return EngineSnapshot(
        num_running=0, num_waiting=0, kv_cache_usage=0.5, num_preemptions=0, prompt_tokens=0,
        generation_tokens=0, prefix_cache_queries=0, prefix_cache_hits=0,
        lost_history=LostHistorySnapshot(
            miss_tokens=misses, continuing_requests=continuing, history_evicted_requests=lost_turns
        ),
    )  # fmt: skip


def test_the_windows_deltas_per_bucket_and_the_share() -> None:
    metrics = ServerMetrics("my model, v2")
    metrics.enable_residency()
    metrics.observe_evictions([EvictionEvent(5.0, 0.4, (1.0, 2.0))], time_scale=1.0)
    before = parse_prometheus(metrics.render(snapshot(100, 100, 2, 1)))
    events = [EvictionEvent(5.0, 0.4, ()), EvictionEvent(60.0, 25.0, (3.0,))]
    metrics.observe_evictions(events, time_scale=2.0)  # a clock twice as slow: wall seconds
    after = parse_prometheus(metrics.render(snapshot(1000, 400, 12, 7)))
    counters = ServerCounters.between(before, after, None)
    ev = counters.eviction
    assert ev is not None and ev.idle_before_evict is not None and ev.lost_history is not None
    idle = ev.idle_before_evict
    assert (idle.metric, idle.count) == (IDLE_BEFORE_EVICT_METRIC, 2)
    assert idle.sum_s == pytest.approx(50.8)
    assert (
        idle.bucket_counts
        == ResidencyHistogram.of(IDLE_BEFORE_EVICT_METRIC, [0.8, 50.0]).bucket_counts
    )
    assert idle.bounds_s == KV_CACHE_RESIDENCY_BUCKETS_S
    assert ev.reuse_gap is not None and ev.reuse_gap.count == 1  # 6 s, this window's only
    assert ev.lost_history.continuing_requests == 10
    assert ev.lost_history.history_evicted_requests == 6
    # (1000 - 100) of (1000 - 100) + (400 - 100) continuing tokens missed
    assert ev.evicted_under_way_share == pytest.approx(900 / 1200)


def test_a_server_without_them_has_no_evidence() -> None:
    text = "# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total 3.0\n"
    assert ServerCounters.between({}, parse_prometheus(text), None).eviction is None


def test_quantiles_are_bucket_bounds() -> None:
    h = ResidencyHistogram.of(IDLE_BEFORE_EVICT_METRIC, [0.3, 0.4, 1.5, 4000.0])
    assert (h.quantile_s(0.5), h.quantile_s(0.75), h.quantile_s(1.0)) == (0.5, 2.0, 1800.0)
    assert h.bucket_counts[-1] == 1  # beyond the last bound: the +Inf bucket
    assert h.share_below_s(2.0) == 0.75
