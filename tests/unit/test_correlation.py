"""The correlation time of a sampled signal (tuner.serving.correlation)."""

from __future__ import annotations

import math
import random

import pytest

from tuner.serving.correlation import correlation_time_s


def ar1(phi: float, n: int, dt_s: float, seed: int) -> list[tuple[float, float]]:
    """An AR(1) series: autocorrelation phi**k, a correlation time of about
    dt * (1/2 + phi / (1 - phi))."""
    rng = random.Random(seed)
    x = 0.0
    points = []
    for i in range(n):
        x = phi * x + rng.gauss(0.0, 1.0)
        points.append((i * dt_s, x))
    return points


@pytest.mark.parametrize("phi", [0.0, 0.5, 0.9, 0.98])
def test_an_ar1_series_has_the_correlation_time_of_its_coefficient(phi: float) -> None:
    dt = 0.25
    expected = dt * (0.5 + phi / (1.0 - phi))
    estimates = [correlation_time_s(ar1(phi, 20_000, dt, seed)) for seed in range(5)]
    mean = sum(e for e in estimates if e is not None) / len(estimates)
    assert mean == pytest.approx(expected, rel=0.15)


def test_the_time_does_not_depend_on_how_often_a_slow_signal_is_sampled() -> None:
    # the same process (correlation time 10 s) sampled every 0.25 s and every 1 s
    fine = correlation_time_s(ar1(math.exp(-0.25 / 10.0), 40_000, 0.25, 1))
    coarse = correlation_time_s(ar1(math.exp(-1.0 / 10.0), 10_000, 1.0, 2))
    assert fine is not None and coarse is not None
    assert fine == pytest.approx(10.0, rel=0.2)
    assert coarse == pytest.approx(10.0, rel=0.2)


def test_irregular_samples_are_read_on_an_even_grid() -> None:
    points = ar1(0.9, 8_000, 0.25, 3)
    # every tenth scrape took three times as long: drop the two samples after it
    irregular = [p for i, p in enumerate(points) if i % 10 not in (1, 2)]
    regular = correlation_time_s(points)
    estimate = correlation_time_s(irregular)
    assert regular is not None and estimate is not None
    assert estimate == pytest.approx(regular, rel=0.3)


def test_too_few_points_say_nothing_and_a_constant_has_none() -> None:
    assert correlation_time_s([(float(i), 1.0) for i in range(10)]) is None
    assert correlation_time_s([(float(i), 3.0) for i in range(100)]) == 0.0
    assert correlation_time_s([(0.0, 1.0)] * 40) is None  # no spread in time


def test_a_trend_reads_as_a_long_memory() -> None:
    # a ramp (a server still filling up) is correlated over the whole series: 100 s of it
    # are not 20 correlation times, so a window on it would go on
    ramp = [(i * 0.25, i * 0.01 + random.Random(i).gauss(0.0, 0.05)) for i in range(400)]
    tau = correlation_time_s(ramp)
    assert tau is not None and 20 * tau > 100.0
