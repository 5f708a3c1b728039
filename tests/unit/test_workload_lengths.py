"""Length distributions: medians, clipping, empirical trace quantiles, mixtures, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from workloads.lengths import TraceColumn, lengths_for_rows, sample_lengths
from workloads.spec import (
    FixedLength,
    LognormalLength,
    MixtureComponent,
    MixtureLength,
    TraceLength,
    UniformLength,
    WorkloadError,
    read_trace_ref,
)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_fixed_and_uniform() -> None:
    assert set(sample_lengths(FixedLength(kind="fixed", value=7), 100, rng())) == {7}
    values = sample_lengths(UniformLength(kind="uniform", low=3, high=6), 10_000, rng())
    assert set(values) == {3, 4, 5, 6}  # both ends included
    assert values.mean() == pytest.approx(4.5, rel=0.02)


def test_lognormal_median_and_clipping() -> None:
    spec = LognormalLength(kind="lognormal", median=200, sigma=0.8, low=20, high=1000)
    values = sample_lengths(spec, 100_000, rng(1))
    assert values.dtype == np.int64
    assert np.median(values) == pytest.approx(200, rel=0.03)
    assert values.min() == 20 and values.max() == 1000
    # exp(N(ln 200, 0.8)) is above 1000 with probability P(Z > ln 5 / 0.8) ≈ 2.2%.
    assert (values == 1000).mean() == pytest.approx(0.022, abs=0.003)


def test_lognormal_without_high_and_zero_sigma() -> None:
    values = sample_lengths(LognormalLength(kind="lognormal", median=50, sigma=0), 10, rng())
    assert set(values) == {50}
    wide = sample_lengths(LognormalLength(kind="lognormal", median=3, sigma=2), 10_000, rng())
    assert wide.min() >= 1  # never below one token


@pytest.mark.parametrize("column", [TraceColumn.PROMPT, TraceColumn.OUTPUT])
def test_empirical_distribution_matches_the_trace_quantiles(column: TraceColumn) -> None:
    trace = read_trace_ref("builtin:azure-code")
    recorded = np.array(
        [r.prompt_tokens if column is TraceColumn.PROMPT else r.output_tokens for r in trace]
    )
    values = sample_lengths(
        TraceLength(kind="trace", path="builtin:azure-code"), 50_000, rng(2), column=column
    )
    assert set(values) <= set(recorded)
    # The sample's CDF at the trace's quantiles is the trace's own (Kolmogorov distance).
    for q in (10, 25, 50, 75, 90, 99):
        cut = np.percentile(recorded, q)
        assert (values <= cut).mean() == pytest.approx((recorded <= cut).mean(), abs=0.01)
    assert np.median(values) == pytest.approx(np.median(recorded), rel=0.05)


def test_mixture_weights() -> None:
    spec = MixtureLength(
        kind="mixture",
        components=[
            MixtureComponent(weight=19, length=UniformLength(kind="uniform", low=100, high=300)),
            MixtureComponent(weight=1, length=UniformLength(kind="uniform", low=4096, high=8192)),
        ],
    )
    values = sample_lengths(spec, 100_000, rng(3))
    long = values >= 4096
    assert long.mean() == pytest.approx(0.05, abs=0.003)
    assert values[~long].min() >= 100 and values[~long].max() <= 300


def test_rows_keep_their_own_lengths() -> None:
    trace = read_trace_ref("builtin:azure-code")[:50]
    own = lengths_for_rows(TraceLength(kind="trace"), trace, rng(), column=TraceColumn.OUTPUT)
    assert list(own) == [r.output_tokens for r in trace]
    fixed = lengths_for_rows(
        FixedLength(kind="fixed", value=9), trace, rng(), column=TraceColumn.OUTPUT
    )
    assert set(fixed) == {9}


def test_a_row_length_needs_the_rows() -> None:
    with pytest.raises(WorkloadError, match="needs a trace arrival"):
        sample_lengths(TraceLength(kind="trace"), 3, rng())


@pytest.mark.parametrize(
    "spec",
    [
        UniformLength(kind="uniform", low=1, high=1000),
        LognormalLength(kind="lognormal", median=100, sigma=1),
        TraceLength(kind="trace", path="builtin:azure-code"),
    ],
)
def test_deterministic_for_a_seed(spec: UniformLength | LognormalLength | TraceLength) -> None:
    assert np.array_equal(sample_lengths(spec, 500, rng(5)), sample_lengths(spec, 500, rng(5)))
    assert not np.array_equal(sample_lengths(spec, 500, rng(5)), sample_lengths(spec, 500, rng(6)))
