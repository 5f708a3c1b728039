"""The backlog guard on synthetic timelines: steady noise, growth, ramps, bursts, short windows."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.serving.backlog import (
    BacklogCheck,
    BacklogVerdict,
    Signal,
    check_backlog,
    clearly_growing,
    trend,
)
from tuner.serving.prometheus_scrape import MetricsSample
from workloads.load_errors import ABORTED
from workloads.schedule import RequestRecord

T0 = 1_700_000_000.0  # Unix time of the window's start


def timeline(
    waiting: list[float], *, kv: list[float] | None = None, running: float = 8.0, dt: float = 0.25
) -> list[MetricsSample]:
    kv = kv if kv is not None else [0.4] * len(waiting)
    return [
        MetricsSample(
            unix_s=T0 + i * dt, kv_cache_usage=u, running=running, waiting=w, preemptions_total=0.0
        )
        for i, (w, u) in enumerate(zip(waiting, kv, strict=True))
    ]


def record(i: int, send_s: float, ttft_s: float | None, *, life_s: float = 0.5) -> RequestRecord:
    scheduled = T0 + send_s
    if ttft_s is None:  # still waiting for its first token when the run was cut
        return RequestRecord(
            request_id=f"r{i}",
            scheduled_s=scheduled,
            sent_s=scheduled,
            prompt_tokens=64,
            output_tokens=0,
            status=200,
            end_s=scheduled + 3.0,
            error=ABORTED,
        )
    first = scheduled + ttft_s
    return RequestRecord(
        request_id=f"r{i}",
        scheduled_s=scheduled,
        sent_s=scheduled,
        prompt_tokens=64,
        output_tokens=16,
        status=200,
        first_token_s=first,
        end_s=first + life_s,
    )


def steady_level(
    seed: int, window_s: float = 10.0
) -> tuple[list[MetricsSample], list[RequestRecord]]:
    """A server well within capacity: a queue that forms and clears, KV usage and TTFT noisy."""
    rng = np.random.default_rng(seed)
    n = int(window_s / 0.25) + 1
    waiting = [float(w) for w in rng.poisson(0.8, n)]
    kv = list(np.clip(0.45 + rng.normal(0.0, 0.04, n), 0.0, 1.0))
    sends = np.sort(rng.uniform(0.0, window_s, int(4 * window_s)))
    records = [record(i, float(s), float(rng.gamma(2.0, 0.1))) for i, s in enumerate(sends)]
    return timeline(waiting, kv=kv), records


def judge(samples: list[MetricsSample], window_s: float = 10.0) -> BacklogVerdict:
    return check_backlog(
        samples, (), window_start_unix_s=T0, window_end_unix_s=T0 + window_s
    ).verdict


def test_a_steady_noisy_level_is_steady_whatever_the_seed() -> None:
    for seed in range(200):
        samples, records = steady_level(seed)
        check = check_backlog(
            samples,
            records,
            window_start_unix_s=T0,
            window_end_unix_s=T0 + 10.0,
            ttft_limit_ms=1000.0,
        )
        assert check.verdict is BacklogVerdict.STEADY, (seed, check)
        assert all(s.verdict is BacklogVerdict.STEADY for s in check.signals)


def test_a_queue_growing_linearly_is_growing_with_its_slope_and_growth() -> None:
    rng = np.random.default_rng(1)
    waiting = [max(0.0, 3.0 * i * 0.25 + rng.normal(0.0, 1.0)) for i in range(41)]  # +3/s
    check = check_backlog(
        timeline(waiting), (), window_start_unix_s=T0, window_end_unix_s=T0 + 10.0
    )
    assert check.verdict is BacklogVerdict.GROWING
    w = check.waiting
    assert w.verdict is BacklogVerdict.GROWING
    assert w.slope_per_s == pytest.approx(3.0, rel=0.1)
    assert w.growth == pytest.approx(30.0, rel=0.1)
    assert w.margin == 2.0  # max(2 requests, 25 % of a batch of 8)
    assert check.summary().startswith("backlog: waiting +3") and "over 10 s" in check.summary()
    assert check.kv_usage.verdict is BacklogVerdict.STEADY
    assert check.ttft.verdict is BacklogVerdict.TOO_SHORT  # no records given


def test_too_few_samples_are_too_short_to_decide() -> None:
    check = check_backlog(
        timeline([0.0, 5.0, 10.0, 15.0, 20.0]),
        (),
        window_start_unix_s=T0,
        window_end_unix_s=T0 + 10.0,
    )
    assert check.verdict is BacklogVerdict.TOO_SHORT
    assert check.waiting.points == 5 and check.waiting.slope_per_s is None
    assert check.summary() == "backlog: too short"


def test_growth_below_the_margin_is_steady() -> None:
    # +1.5 requests over the window, perfectly linear: significant but not material
    waiting = [1.5 * i / 40 for i in range(41)]
    assert judge(timeline(waiting)) is BacklogVerdict.STEADY
    # the margin scales with the batch: +10 is nothing for a batch of 256 (margin 64)
    waiting = [10.0 * i / 40 for i in range(41)]
    assert judge(timeline(waiting, running=8.0)) is BacklogVerdict.GROWING
    assert judge(timeline(waiting, running=256.0)) is BacklogVerdict.STEADY


def test_a_burst_at_the_end_of_a_steady_window_is_not_a_backlog() -> None:
    waiting = [0.0] * 34 + [3.0, 5.0, 6.0, 6.0, 5.0, 4.0, 3.0]
    assert judge(timeline(waiting)) is BacklogVerdict.STEADY


def test_a_ramp_from_an_idle_server_that_levels_off_is_not_a_backlog() -> None:
    # KV usage fills for the first 2 s (a request lifetime) and then holds
    kv = [min(0.6, 0.3 * i * 0.25) for i in range(41)]
    records = [record(i, 0.25 * i, 0.05 + min(0.3, 0.15 * 0.25 * i), life_s=2.0) for i in range(40)]
    check = check_backlog(
        timeline([0.0] * 41, kv=kv),
        records,
        window_start_unix_s=T0,
        window_end_unix_s=T0 + 10.0,
        ttft_limit_ms=1000.0,
    )
    assert check.settle_s == pytest.approx(2.0)
    assert check.verdict is BacklogVerdict.STEADY
    assert check.kv_usage.points < 41  # judged after the ramp


def test_kv_usage_and_ttft_trending_up_through_the_window_are_growing() -> None:
    kv = [0.2 + 0.05 * i * 0.25 for i in range(41)]  # +50 points over 10 s
    kv_check = check_backlog(
        timeline([0.0] * 41, kv=kv), (), window_start_unix_s=T0, window_end_unix_s=T0 + 10.0
    )
    assert kv_check.kv_usage.verdict is BacklogVerdict.GROWING
    assert kv_check.summary() == "backlog: KV usage +50 points over 10 s"
    # TTFT grows by 2.5 s over the window (margin: 25 % of the 1000 ms limit); the last
    # requests, cut off before their first token, count with the wait they had
    records = [record(i, 0.25 * i, 0.1 + 0.25 * 0.25 * i) for i in range(36)]
    records += [record(36 + i, 9.0 + 0.25 * i, None) for i in range(4)]
    check = check_backlog(
        timeline([0.0] * 41),
        records,
        window_start_unix_s=T0,
        window_end_unix_s=T0 + 10.0,
        ttft_limit_ms=1000.0,
    )
    assert check.ttft.verdict is BacklogVerdict.GROWING
    assert check.settle_s == pytest.approx(0.5)
    assert check.ttft.points == 38  # the 4 cut off counted; 2 sent in the first lifetime not
    assert check.verdict is BacklogVerdict.GROWING
    assert "TTFT +" in check.summary() and " ms over " in check.summary()


def test_only_the_window_counts_and_times_are_emulated_seconds() -> None:
    # the queue grows only after the window (the drain, or the next level): not judged
    waiting = [0.0] * 41 + [float(i) for i in range(40)]
    assert judge(timeline(waiting)) is BacklogVerdict.STEADY
    # on a 4x slower clock, +1 request per wall second is +4 per emulated second
    waiting = [0.25 * i for i in range(41)]
    check = check_backlog(
        timeline(waiting), (), window_start_unix_s=T0, window_end_unix_s=T0 + 10.0, time_scale=4.0
    )
    assert check.window_s == pytest.approx(2.5)
    assert check.waiting.slope_per_s == pytest.approx(4.0)
    assert check.waiting.growth == pytest.approx(10.0)


def test_clearly_growing_waits_for_a_third_of_the_window_and_a_large_margin() -> None:
    fast = check_backlog(
        timeline([2.0 * i for i in range(13)]),
        (),
        window_start_unix_s=T0,
        window_end_unix_s=T0 + 3.0,
    )  # +24 in 3 s
    assert fast.waiting.verdict is BacklogVerdict.GROWING
    assert not clearly_growing(fast, elapsed_s=3.0, window_s=12.0)  # a quarter of it
    assert clearly_growing(fast, elapsed_s=4.0, window_s=12.0)
    slow = check_backlog(
        timeline([0.075 * i for i in range(41)]),
        (),
        window_start_unix_s=T0,
        window_end_unix_s=T0 + 10.0,
    )  # +3: growing, not clearly
    assert slow.waiting.verdict is BacklogVerdict.GROWING
    assert not clearly_growing(slow, elapsed_s=10.0, window_s=12.0)


def test_an_exact_line_needs_no_noise_to_be_judged() -> None:
    points = [(0.5 * i, 1.0 * i) for i in range(12)]
    rising = trend(Signal.WAITING, points, margin=2.0)
    assert rising.verdict is BacklogVerdict.GROWING and rising.t_stat is None
    flat = trend(Signal.WAITING, [(0.5 * i, 3.0) for i in range(12)], margin=2.0)
    assert flat.verdict is BacklogVerdict.STEADY and flat.slope_per_s == 0.0


def test_kv_usage_is_a_backlog_only_when_it_would_fill_the_cache_within_its_horizon() -> None:
    # 4% -> 16% over 10 s with nothing waiting and TTFT steady: a cache still filling
    # towards its level, or one that fills until vLLM preempts? Continued at its slope
    # (1.2 points/s) for the horizon: the span itself (28%), a conversation of 60 s (88%):
    # steady; of 80 s (112%): growing.
    kv = [0.04 + 0.12 * i / 40 for i in range(41)]

    def judge(horizon_s: float) -> BacklogCheck:
        return check_backlog(
            timeline([0.0] * 41, kv=kv), (), window_start_unix_s=T0,
            window_end_unix_s=T0 + 10.0, kv_horizon_s=horizon_s,
        )  # fmt: skip

    for horizon_s, projected, verdict in (
        (0.0, 0.28, BacklogVerdict.STEADY),
        (60.0, 0.88, BacklogVerdict.STEADY),
        (80.0, 1.12, BacklogVerdict.GROWING),
    ):
        check = judge(horizon_s)
        assert check.kv_usage.verdict is verdict, horizon_s
        assert check.kv_usage.growth == pytest.approx(0.12)  # past the margin either way
        assert check.kv_usage.projected == pytest.approx(projected)
        assert check.kv_usage.horizon_s == pytest.approx(max(10.0, horizon_s))
        p_full = check.kv_usage.p_full
        assert p_full is not None and (p_full > 0.5) is (verdict is BacklogVerdict.GROWING)
        assert check.kv_stays == pytest.approx(1.0 - p_full)
        assert check.verdict is verdict
    # the same growth from 85% fills the cache within the span itself
    fuller = check_backlog(
        timeline([0.0] * 41, kv=[0.85 + u - 0.04 for u in kv]),
        (),
        window_start_unix_s=T0,
        window_end_unix_s=T0 + 10.0,
    )
    assert fuller.kv_usage.verdict is BacklogVerdict.GROWING


def test_kv_usage_short_of_the_margin_in_a_short_window_still_fills_within_its_horizon() -> None:
    # 40% -> 46% over 10 s: 6 points, short of the 10-point margin, but at that slope the
    # cache is full within a 150-s conversation; judged over the span alone, it is not
    kv = [0.40 + 0.06 * i / 40 for i in range(41)]
    verdicts = [
        check_backlog(
            timeline([0.0] * 41, kv=kv), (), window_start_unix_s=T0,
            window_end_unix_s=T0 + 10.0, kv_horizon_s=horizon_s,
        ).kv_usage.verdict
        for horizon_s in (0.0, 150.0)
    ]  # fmt: skip
    assert verdicts == [BacklogVerdict.STEADY, BacklogVerdict.GROWING]


def test_how_sure_the_kv_verdict_is_follows_the_fits_noise() -> None:
    """A noisy fit projected to about a full cache is a coin toss; a clean one is sure."""
    rng = np.random.default_rng(7)
    base = [0.40 + 0.06 * i / 40 for i in range(41)]  # 1.36 at 150 s

    def p_full(noise: float, horizon_s: float) -> float:
        kv = [u + rng.normal(0.0, noise) for u in base]
        check = check_backlog(
            timeline([0.0] * 41, kv=kv), (), window_start_unix_s=T0,
            window_end_unix_s=T0 + 10.0, kv_horizon_s=horizon_s,
        )  # fmt: skip
        assert check.kv_usage.p_full is not None
        return check.kv_usage.p_full

    assert p_full(0.001, 150.0) > 0.99
    assert 0.2 < p_full(0.02, 90.0) < 0.8  # projected ~1.0 through a noisy window
    assert p_full(0.001, 30.0) < 0.01  # 0.64 at 30 s


def test_a_flat_cache_has_no_chance_of_filling_however_noisy_its_fit() -> None:
    rng = np.random.default_rng(11)
    kv = [0.25 + rng.normal(0.0, 0.03) for _ in range(101)]
    check = check_backlog(
        timeline([0.0] * 101, kv=kv), (), window_start_unix_s=T0,
        window_end_unix_s=T0 + 25.0, kv_horizon_s=115.0,
    )  # fmt: skip
    assert check.kv_usage.p_full == 0.0 and check.kv_stays == 1.0
