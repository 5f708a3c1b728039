"""Token-length distributions: prompt, output and turn counts, deterministic for a seed.

``sample_lengths`` draws ``n`` positive integers from a ``LengthSpec``:

* fixed: always ``value``;
* uniform: integers in [low, high], both included;
* lognormal: exp(Normal(ln median, sigma)) rounded, clipped to [low, high];
* trace: the empirical distribution of a trace column (prompt or output tokens),
  sampled with replacement;
* mixture: each draw picks a component by weight, then samples it.

A ``trace`` length without a path (a request keeps its own trace row's length) is
resolved by the schedule builder, which has the rows; here it is an error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from workloads.spec import (
    FixedLength,
    LengthSpec,
    LognormalLength,
    MixtureLength,
    TraceLength,
    TurnsSpec,
    UniformLength,
    WorkloadError,
    read_trace_ref,
)
from workloads.traces import TraceRecord

IntArray = npt.NDArray[np.int64]


class TraceColumn(StrEnum):
    PROMPT = "prompt"
    OUTPUT = "output"


def trace_column(records: Sequence[TraceRecord], column: TraceColumn) -> IntArray:
    """One column of a trace, lengths at least 1."""
    values = [r.prompt_tokens if column is TraceColumn.PROMPT else r.output_tokens for r in records]
    return np.maximum(np.asarray(values, dtype=np.int64), 1)


def sample_lengths(
    spec: LengthSpec | TurnsSpec,
    n: int,
    rng: np.random.Generator,
    *,
    column: TraceColumn = TraceColumn.PROMPT,
) -> IntArray:
    """n lengths (each ≥ 1) from a distribution; ``column`` says which trace column a
    ``trace`` distribution reads."""
    if isinstance(spec, FixedLength):
        return np.full(n, spec.value, dtype=np.int64)
    if isinstance(spec, UniformLength):
        return rng.integers(spec.low, spec.high, size=n, endpoint=True, dtype=np.int64)
    if isinstance(spec, LognormalLength):
        raw = np.rint(rng.lognormal(np.log(spec.median), spec.sigma, size=n))
        high = spec.high if spec.high is not None else np.iinfo(np.int64).max // 2
        return np.clip(raw, spec.low, high).astype(np.int64)
    if isinstance(spec, TraceLength):
        if spec.path is None:
            raise WorkloadError(
                "a trace length without a path takes each request's trace row; "
                "it needs a trace arrival"
            )
        values = trace_column(read_trace_ref(spec.path), column)
        return rng.choice(values, size=n, replace=True)
    assert isinstance(spec, MixtureLength)
    weights = np.array([c.weight for c in spec.components], dtype=np.float64)
    picks = rng.choice(len(weights), size=n, p=weights / weights.sum())
    out = np.empty(n, dtype=np.int64)
    for index, component in enumerate(spec.components):
        chosen = picks == index
        out[chosen] = sample_lengths(component.length, int(chosen.sum()), rng, column=column)
    return out


def lengths_for_rows(
    spec: LengthSpec,
    rows: Sequence[TraceRecord],
    rng: np.random.Generator,
    *,
    column: TraceColumn,
) -> IntArray:
    """One length per trace row: the row's own value where the spec says so
    (``trace`` without a path, also inside a mixture), else a draw from the spec."""
    own = trace_column(rows, column) if rows else np.empty(0, dtype=np.int64)
    if isinstance(spec, TraceLength) and spec.path is None:
        return own
    if isinstance(spec, MixtureLength):
        weights = np.array([c.weight for c in spec.components], dtype=np.float64)
        picks = rng.choice(len(weights), size=len(rows), p=weights / weights.sum())
        out = np.empty(len(rows), dtype=np.int64)
        for index, component in enumerate(spec.components):
            chosen = picks == index
            length = component.length
            if isinstance(length, TraceLength) and length.path is None:
                out[chosen] = own[chosen]
            else:
                out[chosen] = sample_lengths(length, int(chosen.sum()), rng, column=column)
        return out
    return sample_lengths(spec, len(rows), rng, column=column)


def mean_length(
    spec: LengthSpec | TurnsSpec,
    *,
    column: TraceColumn = TraceColumn.PROMPT,
    rows: Sequence[TraceRecord] | None = None,
) -> float:
    """The expected value of ``sample_lengths``' draws (exact: no sampling): fixed, its
    value; uniform, the middle; lognormal, the mean of its rounded and clipped draws;
    trace, its column's mean. ``rows``: the trace rows a ``trace`` length without a path
    takes its lengths from (a trace arrival's, one pass), required for one."""
    if isinstance(spec, FixedLength):
        return float(spec.value)
    if isinstance(spec, UniformLength):
        return (spec.low + spec.high) / 2.0
    if isinstance(spec, LognormalLength):
        return _lognormal_mean(spec)
    if isinstance(spec, TraceLength):
        if spec.path is None:
            if not rows:
                raise WorkloadError(
                    "a trace length without a path takes each request's trace row; "
                    "it needs a trace arrival"
                )
            return float(trace_column(rows, column).mean())
        return float(trace_column(read_trace_ref(spec.path), column).mean())
    assert isinstance(spec, MixtureLength)
    weights = [c.weight for c in spec.components]
    means = [mean_length(c.length, column=column, rows=rows) for c in spec.components]
    return sum(w * m for w, m in zip(weights, means, strict=True)) / sum(weights)


_EXACT_SPAN = 100_000  # integers summed one by one; a wider lognormal is integrated
_MEAN_TAIL_Z = 8.0  # beyond this many sigmas a lognormal's mass is below 1e-15


def _normal_cdf(z: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    erfc = np.vectorize(math.erfc, otypes=[np.float64])
    return np.asarray(0.5 * erfc(-z / math.sqrt(2.0)), dtype=np.float64)


def _lognormal_mean(spec: LognormalLength) -> float:
    """E[clip(rint(X), low, high)] for X = exp(Normal(ln median, sigma))."""
    mu, sigma, low = math.log(spec.median), spec.sigma, spec.low
    high = spec.high
    if sigma == 0:
        value = max(round(spec.median), low)
        return float(value if high is None else min(value, high))
    top = math.ceil(spec.median * math.exp(_MEAN_TAIL_Z * sigma))
    last = min(high, top) if high is not None else top
    if last - low <= _EXACT_SPAN:  # each integer's share: rint(X) = k for X in [k - 1/2, k + 1/2)
        k = np.arange(low, last + 1, dtype=np.float64)
        cdf = _normal_cdf((np.log(k + 0.5) - mu) / sigma)
        below = np.concatenate([[0.0], cdf[:-1]])
        share = cdf - below
        share[-1] = 1.0 - below[-1]  # the last integer takes everything above it (clipped)
        return float((k * share).sum())
    # Wide: integrate the clipped lognormal (rounding moves no mean by more than 1/2).
    ceiling = float(high) if high is not None else math.inf
    lo_z = (math.log(low) - mu) / sigma
    p_low = 0.5 * math.erfc(-lo_z / math.sqrt(2.0))
    mean_x = math.exp(mu + sigma * sigma / 2.0)

    def partial(z: float) -> float:  # E[X; X >= exp(mu + z sigma)]
        return mean_x * 0.5 * math.erfc((z - sigma) / math.sqrt(2.0))

    if math.isinf(ceiling):
        return low * p_low + partial(lo_z)
    hi_z = (math.log(ceiling) - mu) / sigma
    p_high = 0.5 * math.erfc(hi_z / math.sqrt(2.0))
    return low * p_low + partial(lo_z) - partial(hi_z) + ceiling * p_high
