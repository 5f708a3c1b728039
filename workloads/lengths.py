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
