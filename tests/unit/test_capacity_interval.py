"""A trial's capacity interval from its levels' hold probabilities."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from tuner.run.evaluation import LevelRecord
from tuner.run.goodput import CapacityInterval
from tuner.search.capacity_interval import capacity_gain, capacity_interval
from tuner.search.edge_posterior import TAU_PRIOR
from tuner.serving.backlog import BacklogCheck, BacklogVerdict, Signal, SignalTrend
from workloads.load_result import LoadResult

EMPTY = LoadResult.from_records([])


def _level(
    rate: float, share: float | None, *, met: bool | None = None, **extra: object
) -> LevelRecord:
    return LevelRecord(
        rate_per_s=rate, met=(share or 0.0) >= 0.5 if met is None else met, stopped_early=False,
        dir=f"level-{rate}", load=EMPTY, violations=[], num_preemptions=None,
        max_kv_cache_usage=None, prefix_cache_hit_rate=None, hold_share=share, **extra,
    )  # fmt: skip


def test_the_interval_is_where_the_share_falls_through_its_tails() -> None:
    levels = [_level(1, 1.0), _level(2, 0.97), _level(4, 0.3), _level(8, 0.0)]
    interval = capacity_interval(levels, levels[1])
    assert interval is not None
    # 0.95 is crossed between 2 (0.97) and 4 (0.30); 0.05 between 4 (0.30) and 8 (0)
    assert interval.low_per_s == pytest.approx(2 + (0.97 - 0.95) / (0.97 - 0.30) * 2)
    assert interval.high_per_s == pytest.approx(4 + (0.30 - 0.05) / 0.30 * 4)
    assert interval.hold_at_goodput == pytest.approx(0.97)
    assert interval.bracket() == "capacity 90% in [2.06, 7.33]"


def test_a_lucky_window_above_one_that_broke_does_not_widen_it() -> None:
    """Shares rise no higher at a higher rate: the running minimum from below."""
    levels = [_level(2, 1.0), _level(4, 0.2), _level(6, 0.9, met=True), _level(8, 0.0)]
    as_if_it_had_not = [_level(2, 1.0), _level(4, 0.2), _level(6, 0.2), _level(8, 0.0)]
    assert capacity_interval(levels) == capacity_interval(as_if_it_had_not)


def test_no_rate_that_surely_broke_has_no_upper_end() -> None:
    levels = [_level(2, 1.0), _level(4, 0.99)]
    interval = capacity_interval(levels, levels[-1])
    assert interval is not None
    assert interval.low_per_s == 4 and interval.high_per_s is None
    assert interval.bracket() == "capacity 90% in [4.00, -]"


def test_a_first_level_already_unsure_reaches_down_towards_no_load() -> None:
    interval = capacity_interval([_level(4, 0.5), _level(8, 0.0)])
    assert interval is not None
    assert 0 < interval.low_per_s < 4 and interval.high_per_s is not None


def test_a_growing_queue_holds_nothing_and_old_levels_count_as_their_verdict() -> None:
    def trend(signal: Signal, verdict: BacklogVerdict, p_full: float | None = None) -> SignalTrend:
        return SignalTrend(signal=signal, verdict=verdict, points=40, span_s=10.0, margin=0.1,
                           p_full=p_full)  # fmt: skip

    def check(waiting: BacklogVerdict, kv: BacklogVerdict, p_full: float | None) -> BacklogCheck:
        steady = BacklogVerdict.STEADY
        return BacklogCheck(
            verdict=BacklogVerdict.GROWING if BacklogVerdict.GROWING in (waiting, kv) else steady,
            window_s=10.0, settle_s=2.0, waiting=trend(Signal.WAITING, waiting),
            kv_usage=trend(Signal.KV_USAGE, kv, p_full), ttft=trend(Signal.TTFT, steady),
        )  # fmt: skip

    grow, steady = BacklogVerdict.GROWING, BacklogVerdict.STEADY
    queue = check(grow, steady, 0.1)
    assert _level(4, 1.0, met=True, backlog=queue).hold_probability == 0.0
    # KV usage alone: the share times the probability that the cache does not fill
    filling = check(steady, grow, 0.7)
    assert _level(4, 0.9, met=False, window_met=True, backlog=filling).hold_probability == (
        pytest.approx(0.9 * 0.3)
    )
    assert _level(4, 1.0, met=True, backlog=check(steady, steady, 0.2)).hold_probability == (
        pytest.approx(0.8)
    )
    assert _level(4, None, met=True).hold_probability == 1.0
    assert _level(4, None, met=False).hold_probability == 0.0
    # a window that broke counts at most as a coin toss, whatever its resamples say
    assert _level(4, 0.9, met=False).hold_probability == 0.5
    # a window that met the SLO but too few of its resamples did (the hold rule) counts
    # as its resamples say
    assert _level(4, 0.7, met=False, window_met=True).hold_probability == 0.7
    assert capacity_interval([]) is None


def _drawn(*brackets: tuple[float, float]) -> list[LevelRecord]:
    """The search's own levels below and above the edge, then each draw's bracket: the
    rate it held and the one above it that broke (draw 0 the search's own)."""
    levels = [_level(2.5, 1.0), _level(5.0, 1.0), _level(10.0, 0.0)]
    for draw, (held, broke) in enumerate(brackets):
        levels += [_level(held, 1.0, draw=draw), _level(broke, 0.0, draw=draw)]
    return levels


def _half(interval: CapacityInterval | None) -> float:
    assert interval is not None and interval.high_per_s is not None
    return (interval.high_per_s - interval.low_per_s) / (interval.high_per_s + interval.low_per_s)


def test_the_interval_narrows_with_draws_that_agree_and_widens_with_draws_that_differ() -> None:
    """Issue 34: where the bracket's ends were measured with several draws, the interval is
    where another trial with as many draws places its estimate: draws that agree narrow it
    (four more than two), a draw whose edge lies far from the others' widens it."""
    two, four = (
        capacity_interval(_drawn(*[(6.0, 6.3)] * 2)),
        capacity_interval(_drawn(*[(6.0, 6.3)] * 4)),
    )
    far = capacity_interval(_drawn((6.0, 6.3), (5.0, 5.3), (7.0, 7.3), (6.0, 6.3)))
    assert two is not None and four is not None and far is not None
    assert 0.02 < _half(four) < _half(two) < 0.09
    assert _half(far) > 2 * _half(four)
    # draws that agree around the bracket's geometric middle: an interval about it
    middle = math.sqrt(6.0 * 6.3)
    for interval in (two, four):
        assert interval.high_per_s is not None
        assert interval.low_per_s < 6.0 and interval.high_per_s > 6.3
        assert math.sqrt(interval.low_per_s * interval.high_per_s) == pytest.approx(
            middle, rel=0.01
        )
    # a draw that held where the others broke places the edge higher, and less surely
    higher = capacity_interval(_drawn((6.0, 6.3), (6.3, 6.6), (6.0, 6.3), (6.0, 6.3)))
    assert higher is not None and higher.high_per_s is not None and four.high_per_s is not None
    assert higher.high_per_s > four.high_per_s and _half(higher) > _half(four)
    # one draw: the window's noise alone (linear between the rates), narrower still
    alone = capacity_interval(_drawn((6.0, 6.3)))
    assert alone is not None and _half(alone) < _half(four)
    # the same draw measured twice is one draw, not two
    twice = [*_drawn((6.0, 6.3)), _level(6.0, 1.0), _level(6.3, 0.0)]
    assert capacity_interval(twice) == alone
    # no draw broke a rate (or none held one): not bounded on that side, the one-draw reading
    held = [_level(6.0, 1.0), _level(6.3, 1.0), _level(6.0, 1.0, draw=1), _level(6.3, 1.0, draw=1)]
    lower_bound = capacity_interval(held)
    assert lower_bound is not None and lower_bound.high_per_s is None


def test_the_interval_holds_another_trials_estimate_as_often_as_it_says() -> None:
    """Simulated trials whose draws' edges move by the prior's spread (log-normal about
    6/s), each draw bracketed on a 5% grid placed at random, four draws each as a
    confirmation measures them: each trial's 90% interval holds the other trials'
    estimates (the middle of their intervals) about 90% of the time, and is within 8%."""
    rng = random.Random(7)
    step = math.log(1.05)
    intervals = []
    for _ in range(40):
        offset = rng.uniform(0.0, step)
        brackets = []
        for _ in range(4):
            edge = math.log(6.0) + rng.gauss(0.0, TAU_PRIOR)
            below = math.floor((edge - offset) / step) * step + offset
            brackets.append((math.exp(below), math.exp(below + step)))
        interval = capacity_interval(_drawn(*brackets))
        assert interval is not None and interval.high_per_s is not None
        intervals.append((interval.low_per_s, interval.high_per_s))
    middles = [(low + high) / 2 for low, high in intervals]
    held = [
        low <= middles[j] <= high
        for i, (low, high) in enumerate(intervals)
        for j in range(len(intervals))
        if i != j
    ]
    assert 0.8 <= sum(held) / len(held) <= 0.99
    assert statistics.median((high - low) / (high + low) for low, high in intervals) < 0.08


def test_a_record_written_before_draws_reads_as_the_searchs_own_draw() -> None:
    old = _level(6.0, 1.0).model_dump(mode="json", exclude={"draw", "seed"})
    record = LevelRecord.model_validate(old)
    assert record.draw == 0 and record.seed is None


def _interval(low: float, high: float | None) -> CapacityInterval:
    return CapacityInterval(low_per_s=low, high_per_s=high)


def test_a_gain_is_measurable_only_where_the_intervals_do_not_overlap() -> None:
    gain = capacity_gain(_interval(8, 10), _interval(5, 6))
    assert gain is not None and gain.measurable
    assert gain.ratio == pytest.approx(9 / 5.5)
    assert gain.low_ratio == pytest.approx(8 / 6) and gain.high_ratio == pytest.approx(10 / 5)
    assert gain.text() == "capacity +64% [+33%, +100%] over vLLM's defaults"

    tie = capacity_gain(_interval(5.5, 7), _interval(5, 6))
    assert tie is not None and not tie.measurable
    assert tie.text().startswith(
        "no measurable gain over vLLM's defaults: capacity +14% [-8%, +40%]"
    )

    loss = capacity_gain(_interval(2, 3), _interval(5, 6))
    assert loss is not None and loss.measurable and loss.ratio < 1
    assert "against vLLM's defaults" in loss.text()


def test_defaults_with_no_upper_end_leave_no_measurable_gain() -> None:
    """The defaults held at every rate measured: their capacity may be anywhere above."""
    gain = capacity_gain(_interval(8, 10), _interval(5, None))
    assert gain is not None and not gain.measurable and gain.low_ratio == 0.0
    assert capacity_gain(None, _interval(5, 6)) is None
