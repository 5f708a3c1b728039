"""A trial's capacity interval, from the hold probabilities of the rates it measured.

Each level records its estimated probability of holding (``LevelRecord.hold_probability``):
the share of resamples of its window's requests that meet the SLO
(``workloads.slo_bootstrap``) times the probability that its KV usage does not fill the
cache within a conversation (``tuner.serving.backlog.kv_trend``). Over the levels of a
rate search it falls as the rate rises; the interval is where it falls through
the confidence's two tails:

* the shares are made non-increasing in the rate (a rate holds no more surely than a
  lower one: the running minimum from the lowest rate up; two levels at one rate, their
  mean);
* between two measured rates the share is taken as linear in the rate, and below the
  lowest as linear from 1 at no load;
* ``low_per_s``: where it falls through ``1 - (1 - confidence) / 2`` (0.95 at 90%), the
  highest measured rate if it never does; ``high_per_s``: where it falls through
  ``(1 - confidence) / 2`` (0.05), None if it never does (no measured rate broke the SLO
  surely enough: the goodput is then a lower bound, and so is the interval's top).

The capacity (the rate up to which the SLO holds) lies between the last rate that held
and the first that broke; the interval says where, with the sampling noise of the
levels' percentiles and KV projections, which the search's bracket alone does not. The
goodput (the last rate that held) may lie below it.

**Between draws.** Where the edge falls also moves with the draw of the workload (its
arrivals, its conversations' lengths) by more than one window's resamples see. Where the
levels hold two draws or more (``LevelRecord.draw``: the rate search's edge draws), the
interval is where another trial of the same settings, with as many draws, places its
estimate (``tuner.search.edge_posterior``: each draw's edge censored by the rates it held
and broke, their spread with a prior from the repeatability runs). It does not hold the
server's run-to-run variation beyond the workload's draw (a restart, a neighbour on the
host), which repeated runs measure (``tuner tune --repeats``, ``tuner check``).
"""

from __future__ import annotations

from collections.abc import Sequence

from tuner.run.evaluation import LevelRecord
from tuner.run.goodput import CapacityGain, CapacityInterval
from tuner.search.edge_posterior import edge_posterior

CONFIDENCE = 0.9


def capacity_interval(
    levels: Sequence[LevelRecord],
    best: LevelRecord | None = None,
    *,
    confidence: float = CONFIDENCE,
) -> CapacityInterval | None:
    """The interval of a rate search's ``levels`` (arrival rates in the workload's unit);
    ``best``: the level the goodput was taken at. None without a measured rate."""
    by_rate = _by_rate(levels)
    curve = _hold_curve(by_rate)
    if not curve:
        return None
    tail = (1.0 - confidence) / 2.0
    hold = None
    if best is not None:
        hold = (
            _pooled(by_rate[best.rate_per_s])
            if best.rate_per_s in by_rate
            else best.hold_probability
        )
    drawn = edge_posterior(levels)
    if drawn is not None:
        return CapacityInterval(
            low_per_s=drawn.quantile_per_s(tail),
            high_per_s=drawn.quantile_per_s(1.0 - tail),
            confidence=confidence,
            hold_at_goodput=hold,
        )
    low = _falls_through(curve, 1.0 - tail)
    return CapacityInterval(
        low_per_s=curve[-1][0] if low is None else low,
        high_per_s=_falls_through(curve, tail),
        confidence=confidence,
        hold_at_goodput=hold,
    )


def _by_rate(levels: Sequence[LevelRecord]) -> dict[float, dict[int, list[float]]]:
    """Each measured rate's P(hold)s by draw."""
    by_rate: dict[float, dict[int, list[float]]] = {}
    for level in levels:
        if level.rate_per_s > 0:
            draws = by_rate.setdefault(level.rate_per_s, {})
            draws.setdefault(level.draw, []).append(level.hold_probability)
    return by_rate


def _pooled(draws: dict[int, list[float]]) -> float:
    """A rate's P(hold) over its draws: their mean, each draw's own the mean of its levels."""
    return sum(sum(p) / len(p) for p in draws.values()) / len(draws)


def _hold_curve(by_rate: dict[float, dict[int, list[float]]]) -> list[tuple[float, float]]:
    """(rate, share) by rising rate, the share non-increasing."""
    curve: list[tuple[float, float]] = []
    lowest = 1.0
    for rate in sorted(by_rate):
        lowest = min(lowest, _pooled(by_rate[rate]))
        curve.append((rate, lowest))
    return curve


def _falls_through(curve: list[tuple[float, float]], share: float) -> float | None:
    """The rate at which the curve (from (0, 1), linear between its points) falls below
    ``share``; None if it never does."""
    previous_rate, previous_share = 0.0, 1.0
    for rate, held in curve:
        if held < share:
            span = previous_share - held
            fraction = (previous_share - share) / span if span > 0 else 0.0
            return previous_rate + fraction * (rate - previous_rate)
        previous_rate, previous_share = rate, held
    return None


def capacity_gain(
    recommended: CapacityInterval | None, default: CapacityInterval | None
) -> CapacityGain | None:
    """The recommendation's capacity against the defaults' (None without both). Its
    bounds pair each interval's ends the unfavourable way, so a gain is measurable only
    where the intervals do not overlap."""
    if recommended is None or default is None or min(recommended.low_per_s, default.low_per_s) <= 0:
        return None
    low_ratio = recommended.low_per_s / default.high_per_s if default.high_per_s else 0.0
    high_ratio = (
        recommended.high_per_s / default.low_per_s if recommended.high_per_s is not None else None
    )
    ratio = _middle(recommended) / _middle(default)
    return CapacityGain(
        ratio=ratio,
        low_ratio=low_ratio,
        high_ratio=high_ratio,
        measurable=not recommended.overlaps(default),
    )


def _middle(interval: CapacityInterval) -> float:
    """The middle of an interval; its low end where it has no upper one."""
    if interval.high_per_s is None:
        return interval.low_per_s
    return (interval.low_per_s + interval.high_per_s) / 2.0
