"""How sure a level's SLO verdict is: the share of resamples of its requests that meet it.

A level's verdict compares percentiles of its window's requests with the SLO's limits.
Near capacity a p99 over a few hundred requests moves with which requests the window
happened to hold, and a verdict of "met" says nothing of how close it came. Resampling
the window's requests with replacement (a request is the unit: it brings all of its
token gaps, which are not independent of one another), judging each resample exactly
as the level was judged (``LoadResult.from_records`` then ``slo_verdict``: the same
values, pandas' linear-interpolated percentiles, a failed request breaking it) and
counting those that hold gives ``hold_share``: an estimate of the probability that
another window of the same steady state would meet the SLO, from this window's own
statistics. It covers the sampling noise of the percentiles, not the server's
run-to-run variation (a preemption cascade that starts in one run and not in another),
which only repeated runs show.

A resample is a vector of counts (how often each request was drawn); a percentile of a
resample is the weighted percentile of the sorted values, found with one cumulative sum
of the counts: ``REPLICATES`` resamples of a level of 500 requests with 300 token gaps
each take about a tenth of a second.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from workloads.load_result import request_latencies
from workloads.schedule import RequestRecord
from workloads.slo import Slo

REPLICATES = 200
SEED = 20_261_204  # fixed: the same window always gets the same share


def hold_share(
    records: Iterable[RequestRecord],
    slo: Slo,
    *,
    time_scale: float = 1.0,
    cut_short: bool = False,
    replicates: int = REPLICATES,
    seed: int = SEED,
) -> float | None:
    """The share of ``replicates`` resamples of ``records`` (a level's window) that meet
    ``slo``; None with no request. ``time_scale``: the records' clock runs this many
    times slower than the emulated GPU's (the limits are scaled as the verdict scales them)."""
    latencies = request_latencies(records, cut_short=cut_short)
    n = latencies.count
    if n == 0:
        return None
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=replicates)
    held = np.ones(replicates, dtype=bool)
    if latencies.failed.any():  # a resample holding a failed request breaks the SLO
        held &= counts[:, latencies.failed].sum(axis=1) == 0
    for objective in slo.objectives():
        values, rows = latencies.of(objective.metric)
        if values.size == 0:
            continue  # no value: the verdict has nothing to break either
        order = np.argsort(values, kind="stable")
        ordered, ordered_rows = values[order], rows[order]
        limit_ms = objective.limit_ms * time_scale
        q = objective.percentile / 100.0
        for b in np.flatnonzero(held):
            value = _weighted_quantile(ordered, counts[b, ordered_rows], q)
            if value is not None and value > limit_ms:
                held[b] = False
    return float(held.mean())


def _weighted_quantile(
    ordered: np.ndarray[Any, np.dtype[np.float64]],
    weights: np.ndarray[Any, np.dtype[np.int64]],
    q: float,
) -> float | None:
    """The ``q`` quantile (linear interpolation, as pandas' default) of the sample that
    holds ``ordered[i]`` ``weights[i]`` times; None when it is empty."""
    cumulative = np.cumsum(weights)
    total = int(cumulative[-1]) if cumulative.size else 0
    if total == 0:
        return None
    h = (total - 1) * q
    below = int(np.floor(h))
    fraction = h - below
    at = np.searchsorted(cumulative, [below, min(below + 1, total - 1)], side="right")
    low, high = float(ordered[at[0]]), float(ordered[at[1]])
    return low + fraction * (high - low)


__all__ = ["REPLICATES", "SEED", "hold_share"]
