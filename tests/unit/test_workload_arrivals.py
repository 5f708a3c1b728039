"""Arrival processes: statistics on large samples, determinism, warm-up planning."""

from __future__ import annotations

import numpy as np
import pytest

from workloads.arrivals import (
    busiest_start_share,
    diurnal_arrivals,
    diurnal_rate,
    gamma_arrivals,
    plan_arrivals,
    poisson_arrivals,
    ramp_arrivals,
    trace_arrivals,
    trace_pass_s,
)
from workloads.spec import (
    ClosedArrival,
    DiurnalArrival,
    GammaArrival,
    PoissonArrival,
    RampArrival,
    TraceArrival,
    WarmupSpec,
    read_trace_ref,
)
from workloads.traces import TraceRecord


def rate_in(times: np.ndarray, lo: float, hi: float) -> float:
    return float(((times >= lo) & (times < hi)).sum()) / (hi - lo)


def test_poisson_mean_rate_within_5_percent() -> None:
    times = poisson_arrivals(rate_per_s=50, duration_s=2000, seed=1)
    assert len(times) / 2000 == pytest.approx(50, rel=0.05)
    assert np.all(np.diff(times) >= 0) and times[0] >= 0 and times[-1] < 2000
    gaps = np.diff(times)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential gaps


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 2.0, 4.0])
def test_gamma_cv_is_the_burstiness(burstiness: float) -> None:
    times = gamma_arrivals(rate_per_s=20, burstiness=burstiness, duration_s=10_000, seed=3)
    gaps = np.diff(times)
    assert gaps.std() / gaps.mean() == pytest.approx(burstiness, rel=0.10)
    assert len(times) / 10_000 == pytest.approx(20, rel=0.05)


def test_ramp_rises_from_start_to_end_rate() -> None:
    duration = 2000.0
    times = ramp_arrivals(start_rate_per_s=10, end_rate_per_s=50, duration_s=duration, seed=4)
    # Linear from 10 to 50: the first quarter averages 15/s, the last 45/s.
    assert rate_in(times, 0, duration / 4) == pytest.approx(15, rel=0.05)
    assert rate_in(times, 3 * duration / 4, duration) == pytest.approx(45, rel=0.05)
    assert len(times) / duration == pytest.approx(30, rel=0.05)


def test_ramp_down() -> None:
    times = ramp_arrivals(start_rate_per_s=40, end_rate_per_s=0, duration_s=1000, seed=5)
    assert rate_in(times, 0, 250) == pytest.approx(35, rel=0.05)
    assert rate_in(times, 750, 1000) == pytest.approx(5, rel=0.15)


def test_diurnal_has_its_trough_at_the_ends_and_its_peak_in_the_middle() -> None:
    duration, peak, trough = 4000.0, 40.0, 4.0
    times = diurnal_arrivals(
        peak_rate_per_s=peak, trough_rate_per_s=trough, periods=1, duration_s=duration, seed=6
    )
    rate = diurnal_rate(peak, trough, 1, duration)
    grid = np.linspace(0, duration, 100_001)

    def expected(lo: float, hi: float) -> float:
        inside = grid[(grid >= lo) & (grid < hi)]
        return float(rate(inside).mean())

    middle = (0.45 * duration, 0.55 * duration)
    start = (0.0, 0.05 * duration)
    assert rate_in(times, *middle) == pytest.approx(expected(*middle), rel=0.05)
    assert rate_in(times, *start) == pytest.approx(expected(*start), rel=0.15)
    assert rate_in(times, *middle) > 5 * rate_in(times, *start)
    assert len(times) / duration == pytest.approx((peak + trough) / 2, rel=0.05)


def test_diurnal_periods_repeat_the_day() -> None:
    times = diurnal_arrivals(
        peak_rate_per_s=30, trough_rate_per_s=0, periods=2, duration_s=2000, seed=7
    )
    # Two days in the run: peaks at 1/4 and 3/4, a trough in the middle.
    assert rate_in(times, 450, 550) > 25
    assert rate_in(times, 1450, 1550) > 25
    assert rate_in(times, 975, 1025) < 2


@pytest.fixture(scope="module")
def azure() -> tuple[TraceRecord, ...]:
    return read_trace_ref("builtin:azure-code")


def test_trace_replay_is_scaled_to_the_target_rate(azure: tuple[TraceRecord, ...]) -> None:
    """The looped trace averages the rate: whole passes hold n / rate seconds each, at
    every rate and whatever the run's length."""
    n = len(azure)
    for rate in (1.0, 4.0, 25.0):
        one = trace_pass_s(azure, rate)
        assert one == pytest.approx(n / rate)
        times, rows = trace_arrivals(azure, rate_per_s=rate, duration_s=3 * one)
        assert len(times) == 3 * n
        assert list(rows[:n]) == list(range(n))
        # A short run replays the start of the trace at the same pace at every length.
        short, _ = trace_arrivals(azure, rate_per_s=rate, duration_s=one / 4)
        assert np.allclose(short, times[: len(short)])
    # The trace's own shape is kept: gaps are the recorded gaps times one factor.
    times, rows = trace_arrivals(azure, rate_per_s=4.0, duration_s=60)
    recorded = np.array([azure[i].arrival_s for i in rows])
    ratio = np.diff(times)[1:50] / np.diff(recorded)[1:50]
    assert np.allclose(ratio, ratio[0])


def test_trace_replay_loops_when_the_run_outlasts_it(azure: tuple[TraceRecord, ...]) -> None:
    times, rows = trace_arrivals(azure, rate_per_s=50, duration_s=60)  # 3000 of 1000 rows
    assert len(times) == 3000
    assert np.all(np.diff(times) >= 0)
    assert rows[999] == 999 and rows[1000] == 0


def test_a_replay_starts_where_it_is_told_and_finds_the_busiest_stretch(
    azure: tuple[TraceRecord, ...],
) -> None:
    one = trace_pass_s(azure, 2.0)
    whole, rows = trace_arrivals(azure, rate_per_s=2.0, duration_s=2 * one)
    half, half_rows = trace_arrivals(azure, rate_per_s=2.0, duration_s=one, start_share=0.5)
    # Half a pass in: the same gaps, the rows from there on, the start replayed after.
    later = whole[(whole >= one / 2) & (whole < 1.5 * one)] - one / 2
    assert np.allclose(half, later)
    assert half_rows[0] == rows[np.searchsorted(whole, one / 2)]
    # The busiest stretch of 60 s, 10 s into the run: no other start puts more requests there.
    share = busiest_start_share(azure, rate_per_s=2.0, length_s=60.0, lead_s=10.0)
    placed, _ = trace_arrivals(azure, rate_per_s=2.0, duration_s=one, start_share=share)
    held = int(np.sum((placed >= 10.0) & (placed < 70.0)))
    for other in np.linspace(0.0, 0.99, 67):
        times, _ = trace_arrivals(azure, rate_per_s=2.0, duration_s=one, start_share=other)
        assert np.sum((times >= 10.0) & (times < 70.0)) <= held
    assert held > 3 * 60 * 2.0  # the trace's bursts: three times its mean rate there


def test_trace_replay_as_recorded(azure: tuple[TraceRecord, ...]) -> None:
    times, _ = trace_arrivals(azure, rate_per_s=None, duration_s=10)
    assert list(times) == [r.arrival_s for r in azure if r.arrival_s < 10]


@pytest.mark.parametrize(
    "make",
    [
        lambda s: poisson_arrivals(rate_per_s=5, duration_s=100, seed=s),
        lambda s: gamma_arrivals(rate_per_s=5, burstiness=2, duration_s=100, seed=s),
        lambda s: ramp_arrivals(start_rate_per_s=1, end_rate_per_s=9, duration_s=100, seed=s),
        lambda s: diurnal_arrivals(
            peak_rate_per_s=9, trough_rate_per_s=1, periods=1, duration_s=100, seed=s
        ),
    ],
)
def test_deterministic_for_a_seed(make) -> None:  # type: ignore[no-untyped-def]
    assert np.array_equal(make(11), make(11))
    assert not np.array_equal(make(11), make(12))


def test_a_longer_horizon_keeps_the_same_prefix() -> None:
    short = poisson_arrivals(rate_per_s=50, duration_s=100, seed=2)
    long = poisson_arrivals(rate_per_s=50, duration_s=1000, seed=2)
    assert np.array_equal(long[: len(short)], short)


class TestPlan:
    def test_warmup_seconds_come_first_then_the_measured_window(self) -> None:
        plan = plan_arrivals(
            PoissonArrival(kind="poisson", rate_per_s=20),
            duration_s=30,
            warmup=WarmupSpec(duration_s=5),
            seed=1,
        )
        assert plan.measured_start_s == 5 and plan.measured_end_s == 35
        warm = plan.send_s[plan.warmup]
        measured = plan.send_s[~plan.warmup]
        assert np.all(warm < 5) and np.all((measured >= 5) & (measured < 35))
        assert plan.warmup[: len(warm)].all()  # warm-up requests are the first ones
        assert len(measured) / 30 == pytest.approx(20, rel=0.2)

    def test_warmup_requests_extend_the_warmup(self) -> None:
        plan = plan_arrivals(
            PoissonArrival(kind="poisson", rate_per_s=1),
            duration_s=60,
            warmup=WarmupSpec(duration_s=2, requests=10),
            seed=2,
        )
        assert int(plan.warmup.sum()) == 10
        assert plan.measured_start_s == plan.send_s[9] > 2
        assert plan.measured_end_s == pytest.approx(plan.measured_start_s + 60)
        assert np.all(plan.send_s[10:] >= plan.measured_start_s)

    def test_more_warmup_seconds_than_requests(self) -> None:
        plan = plan_arrivals(
            PoissonArrival(kind="poisson", rate_per_s=10),
            duration_s=10,
            warmup=WarmupSpec(duration_s=5, requests=3),
            seed=3,
        )
        assert plan.measured_start_s == 5 and int(plan.warmup.sum()) > 3

    def test_no_warmup(self) -> None:
        plan = plan_arrivals(
            GammaArrival(kind="gamma", rate_per_s=10, burstiness=2),
            duration_s=10,
            warmup=WarmupSpec(),
            seed=3,
        )
        assert not plan.warmup.any() and plan.measured_start_s == 0

    def test_ramp_starts_its_shape_when_measuring_starts(self) -> None:
        plan = plan_arrivals(
            RampArrival(kind="ramp", start_rate_per_s=5, end_rate_per_s=50),
            duration_s=400,
            warmup=WarmupSpec(duration_s=20),
            seed=4,
        )
        measured = plan.send_s[~plan.warmup] - plan.measured_start_s
        assert rate_in(plan.send_s[plan.warmup], 0, 20) == pytest.approx(5, rel=0.35)
        assert rate_in(measured, 0, 100) == pytest.approx(5 + 45 / 8, rel=0.1)
        assert rate_in(measured, 300, 400) == pytest.approx(5 + 45 * 7 / 8, rel=0.1)

    def test_diurnal_with_a_zero_trough_still_warms_up(self) -> None:
        plan = plan_arrivals(
            DiurnalArrival(kind="diurnal", peak_rate_per_s=10, trough_rate_per_s=0),
            duration_s=60,
            warmup=WarmupSpec(requests=5),
            seed=5,
        )
        assert int(plan.warmup.sum()) == 5

    def test_trace_plan_keeps_the_rows(self, azure: tuple[TraceRecord, ...]) -> None:
        plan = plan_arrivals(
            TraceArrival(kind="trace", path="builtin:azure-code", rate_per_s=4),
            duration_s=60,
            warmup=WarmupSpec(duration_s=5),
            seed=0,
            trace=azure,
        )
        assert plan.trace_rows is not None and len(plan.trace_rows) == len(plan.send_s)
        times, rows = trace_arrivals(azure, rate_per_s=4, duration_s=65)
        assert np.allclose(plan.send_s, times) and list(plan.trace_rows) == list(rows)

    def test_closed_sends_everything_at_once(self) -> None:
        plan = plan_arrivals(
            ClosedArrival(kind="closed", requests=100),
            duration_s=60,
            warmup=WarmupSpec(duration_s=5, requests=10),
            seed=0,
        )
        assert len(plan) == 110 and plan.measured_end_s is None
        assert list(plan.send_s[:10]) == [0.0] * 10 and plan.warmup[:10].all()
        assert set(plan.send_s[10:]) == {5.0} and not plan.warmup[10:].any()
        bare = plan_arrivals(
            ClosedArrival(kind="closed", requests=3), duration_s=1, warmup=WarmupSpec(), seed=0
        )
        assert list(bare.send_s) == [0.0, 0.0, 0.0]

    def test_plans_are_deterministic(self) -> None:
        def plan() -> np.ndarray:
            return plan_arrivals(
                GammaArrival(kind="gamma", rate_per_s=3, burstiness=3),
                duration_s=60,
                warmup=WarmupSpec(duration_s=5, requests=10),
                seed=9,
            ).send_s

        assert np.array_equal(plan(), plan())
