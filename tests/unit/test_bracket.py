"""The rate bracket shared by the live search and the twin's."""

from __future__ import annotations

import pytest

from tuner.serving.bracket import RateBracket, search


@pytest.mark.parametrize("capacity", [0.37, 7.3, 123.0])
@pytest.mark.parametrize("start", [1.0, 50.0])
def test_search_brackets_a_capacity_to_its_precision(capacity: float, start: float) -> None:
    calls: list[float] = []

    def held(rate: float) -> bool:
        calls.append(rate)
        return rate <= capacity

    found = search(held, start, precision=0.02, max_runs=30, step=2.0)
    assert found <= capacity
    assert found >= capacity / 1.0201
    assert len(calls) < 30


def test_nothing_held_is_zero_and_the_descent_stops_at_its_floor() -> None:
    calls: list[float] = []
    assert (
        search(lambda r: calls.append(r) or False, 1.0, precision=0.05, max_runs=50, step=2.0)
        == 0.0
    )
    # 1, 1/2, 1/4, then the move squared up to 4x: 1/16, 1/64, 1/256; 1/1024 is past it
    assert min(calls) >= 1e-3 and calls == [1.0, 0.5, 0.25, 0.0625, 0.015625, 0.00390625]


@pytest.mark.parametrize(("capacity", "start"), [(0.38, 3.8), (40.0, 4.0), (1.0, 50.0)])
def test_a_start_far_off_is_bracketed_within_the_screens_runs(
    capacity: float, start: float
) -> None:
    """The capacity screen's search (steps of 25 %) from a start 10x or 50x off: steps of
    25 % alone cover 1.25^8 = 6x in its runs and said no rate held (the built-in ``code``
    workload on an H100); galloping, it finds the capacity to its precision."""
    from tuner.capacity.option import MAX_RUNS, SCREEN_PRECISION, STEP

    calls: list[float] = []

    def held(rate: float) -> bool:
        calls.append(rate)
        return rate <= capacity

    found = search(held, start, precision=SCREEN_PRECISION, max_runs=MAX_RUNS, step=STEP)
    assert capacity / (1 + SCREEN_PRECISION) / 1.0001 <= found <= capacity, calls


def test_runs_spent_give_the_best_rate_held_so_far() -> None:
    assert search(lambda r: r <= 100.0, 1.0, precision=0.01, max_runs=3, step=2.0) == 4.0


def test_next_rate_climbs_descends_bisects_and_closes() -> None:
    b = RateBracket(0.05)
    b.record(10.0, True)
    assert b.next_rate(up=1.5, down=2.0) == 15.0
    b.record(15.0, False)
    assert (b.low, b.high) == (10.0, 15.0)
    assert b.next_rate(up=1.5, down=2.0) == pytest.approx((10.0 * 15.0) ** 0.5)
    b.record(10.4, True)
    b.record(10.9, False)
    assert b.closed and b.next_rate(up=1.5, down=2.0) is None
    only_broke = RateBracket(0.05, [(8.0, False), (4.0, False)])
    assert only_broke.low is None and only_broke.high == 4.0
    assert only_broke.next_rate(up=1.5, down=2.0) == 2.0


def test_a_broken_rate_below_the_best_held_is_not_the_upper_end() -> None:
    b = RateBracket(0.05, [(10.0, True), (6.0, False), (20.0, False)])
    assert (b.low, b.high) == (10.0, 20.0)
