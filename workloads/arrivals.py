"""Arrival times: when each request (or each session's first turn) is sent.

Generators take a numpy ``Generator`` and return sorted offsets in seconds, so a
seed gives the same times on every machine:

* ``poisson_arrivals``: exponential gaps at a constant rate;
* ``gamma_arrivals``: a renewal process whose gaps are gamma distributed with mean
  1/rate and coefficient of variation ``burstiness`` (shape 1/CV², scale CV²/rate);
* ``ramp_arrivals`` and ``diurnal_arrivals``: non-homogeneous Poisson processes
  (Lewis–Shedler thinning) whose rate moves linearly, or along a sinusoid from
  trough to peak and back, over the run;
* ``trace_arrivals``: a trace's own arrival times, rescaled so that the trace, looped,
  averages a target rate, then cut to the run; ``replay_trace`` gives the replayed
  rows themselves, ``trace_pass_s`` how long one pass lasts;
* closed (offline): every request at once.

``plan_arrivals`` applies a spec: warm-up first, then the measured window.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from workloads.spec import (
    ArrivalSpec,
    ClosedArrival,
    DiurnalArrival,
    GammaArrival,
    PoissonArrival,
    RampArrival,
    TraceArrival,
    WarmupSpec,
    WorkloadError,
)
from workloads.traces import TraceRecord, recorded_pass_s

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
RateFunction = Callable[[FloatArray], FloatArray]
_CHUNK = 4096  # gaps drawn per call: a stream's prefix does not depend on its horizon
_MAX_HORIZON_S = 1e8


def _renewal(draw: Callable[[int], FloatArray], horizon_s: float) -> FloatArray:
    """Arrival times below horizon_s from cumulated gaps, drawn in fixed-size chunks."""
    times: list[FloatArray] = []
    last = 0.0
    while last < horizon_s:
        chunk = last + np.cumsum(draw(_CHUNK))
        times.append(chunk)
        last = float(chunk[-1])
    out = np.concatenate(times) if times else np.empty(0)
    return out[out < horizon_s]


def poisson_arrivals(*, rate_per_s: float, duration_s: float, seed: int) -> FloatArray:
    """Poisson process on [0, duration_s)."""
    rng = np.random.default_rng(seed)
    return _renewal(lambda n: rng.exponential(1.0 / rate_per_s, n), duration_s)


def gamma_arrivals(
    *, rate_per_s: float, burstiness: float, duration_s: float, seed: int
) -> FloatArray:
    """Gamma renewal process on [0, duration_s): gap mean 1/rate, gap CV = burstiness."""
    rng = np.random.default_rng(seed)
    shape = 1.0 / burstiness**2
    scale = 1.0 / (rate_per_s * shape)
    return _renewal(lambda n: rng.gamma(shape, scale, n), duration_s)


def thinned_arrivals(
    rate_at: RateFunction, *, max_rate_per_s: float, duration_s: float, seed: int
) -> FloatArray:
    """Non-homogeneous Poisson process on [0, duration_s) with rate rate_at(t) ≤ max_rate."""
    if max_rate_per_s <= 0:
        return np.empty(0)
    rng = np.random.default_rng(seed)
    candidates = _renewal(lambda n: rng.exponential(1.0 / max_rate_per_s, n), duration_s)
    keep = rng.random(len(candidates)) * max_rate_per_s < rate_at(candidates)
    return candidates[keep]


def ramp_rate(start_rate_per_s: float, end_rate_per_s: float, duration_s: float) -> RateFunction:
    """Rate function of a linear ramp over [0, duration_s)."""

    def rate(t: FloatArray) -> FloatArray:
        return start_rate_per_s + (end_rate_per_s - start_rate_per_s) * np.clip(
            t / duration_s, 0, 1
        )

    return rate


def diurnal_rate(
    peak_rate_per_s: float, trough_rate_per_s: float, periods: float, duration_s: float
) -> RateFunction:
    """Rate function of a day compressed to the run: trough at the start, peak half a period on."""

    def rate(t: FloatArray) -> FloatArray:
        phase = 2 * math.pi * periods * t / duration_s
        return trough_rate_per_s + (peak_rate_per_s - trough_rate_per_s) * (1 - np.cos(phase)) / 2

    return rate


def ramp_arrivals(
    *, start_rate_per_s: float, end_rate_per_s: float, duration_s: float, seed: int
) -> FloatArray:
    return thinned_arrivals(
        ramp_rate(start_rate_per_s, end_rate_per_s, duration_s),
        max_rate_per_s=max(start_rate_per_s, end_rate_per_s),
        duration_s=duration_s,
        seed=seed,
    )


def diurnal_arrivals(
    *,
    peak_rate_per_s: float,
    trough_rate_per_s: float,
    periods: float,
    duration_s: float,
    seed: int,
) -> FloatArray:
    return thinned_arrivals(
        diurnal_rate(peak_rate_per_s, trough_rate_per_s, periods, duration_s),
        max_rate_per_s=peak_rate_per_s,
        duration_s=duration_s,
        seed=seed,
    )


def trace_arrivals(
    records: Sequence[TraceRecord],
    *,
    rate_per_s: float | None,
    duration_s: float | None,
    max_requests: int | None = None,
    start_share: float = 0.0,
) -> tuple[FloatArray, IntArray]:
    """A trace's replay: its arrival times and the index of each one's row.

    The one rule of every replay (``tuner bench``/``trial``/``tune`` through
    ``plan_arrivals``, ``tuner simulate`` directly): first scale, then cut.

    * Scale: without ``rate_per_s`` the trace keeps its recorded times. With it, every
      time is multiplied by one factor chosen so that the trace, looped, averages
      rate_per_s requests a second: one pass of its n requests lasts n / rate_per_s
      seconds (its span and one mean gap before it starts again). The rate is the
      trace's own at every length of run, so a run shorter than a pass replays that
      part of the trace at the trace's own pace, bursts and quiet stretches included
      (a bursty trace's short run offers more or less than the rate), and a run of
      whole passes offers exactly the rate.
    * Start: ``start_share`` of a pass into the trace (0: at its first request); what
      lies before it is replayed at the end of the pass.
    * Cut: the arrivals before ``duration_s`` (the trace looping when the replay
      outlasts it), then at most the first ``max_requests`` of them. With neither, one
      pass of the trace.
    """
    if not records:
        raise WorkloadError("the trace has no requests")
    base = np.array([r.arrival_s for r in records], dtype=np.float64)
    base -= base[0]
    n = len(base)
    period = trace_pass_s(records, None)
    count = max_requests if max_requests is not None else (n if duration_s is None else None)
    if rate_per_s is not None:
        factor = (n / rate_per_s) / period
        base *= factor
        period *= factor
    shift = (start_share % 1.0) * period
    if duration_s is not None:
        loops = max(1, math.ceil(duration_s / period) + 1)
    else:
        assert count is not None
        loops = max(1, math.ceil(count / n))
    loops += 1 if shift > 0 else 0
    times = np.concatenate([base + k * period for k in range(loops)]) - shift
    rows = np.tile(np.arange(n, dtype=np.int64), loops)
    if shift > 0:
        keep = times >= 0.0
        times, rows = times[keep], rows[keep]
    if duration_s is not None:
        keep = times < duration_s
        times, rows = times[keep], rows[keep]
    if count is not None:
        times, rows = times[:count], rows[:count]
    return times, rows


def trace_pass_s(records: Sequence[TraceRecord], rate_per_s: float | None) -> float:
    """How long one pass of a trace's replay lasts at ``rate_per_s`` (as recorded without)."""
    if not records:
        raise WorkloadError("the trace has no requests")
    if rate_per_s is not None:
        return len(records) / rate_per_s
    return recorded_pass_s(records)


def busiest_start_share(
    records: Sequence[TraceRecord],
    *,
    rate_per_s: float | None,
    length_s: float,
    lead_s: float = 0.0,
) -> float:
    """The ``start_share`` at which a replay's stretch ``[lead_s, lead_s + length_s)``
    holds the most of the trace's requests: where a window shorter than a pass sees the
    trace's busiest stretch (the bursts that decide whether its SLOs hold)."""
    period = trace_pass_s(records, rate_per_s)
    times, _ = trace_arrivals(records, rate_per_s=rate_per_s, duration_s=2.0 * period)
    one_pass = times[times < period]
    ends = np.searchsorted(times, one_pass + length_s, side="left")
    best = int(np.argmax(ends - np.arange(len(one_pass))))
    return float(((one_pass[best] - lead_s) % period) / period)


def replay_trace(
    records: Sequence[TraceRecord],
    *,
    rate_per_s: float | None,
    duration_s: float | None,
    max_requests: int | None = None,
) -> list[TraceRecord]:
    """The rows of a replay (``trace_arrivals``' rule), each at its replayed arrival time."""
    times, rows = trace_arrivals(
        records, rate_per_s=rate_per_s, duration_s=duration_s, max_requests=max_requests
    )
    return [
        dataclasses.replace(records[int(row)], arrival_s=float(t))
        for t, row in zip(times, rows, strict=True)
    ]


@dataclass(frozen=True, kw_only=True)
class ArrivalPlan:
    """The arrival times of one run, warm-up included, sorted."""

    send_s: FloatArray
    warmup: npt.NDArray[np.bool_]  # True for warm-up arrivals
    measured_start_s: float  # warm-up ends and the measured window starts here
    measured_end_s: float | None  # None for a closed workload (no window)
    trace_rows: IntArray | None = None  # each arrival's row, for trace arrivals

    def __len__(self) -> int:
        return len(self.send_s)


def _seed(seed: int, stream: int) -> int:
    return int(np.random.SeedSequence([seed, stream]).generate_state(1)[0])


def plan_arrivals(
    arrival: ArrivalSpec,
    *,
    duration_s: float,
    warmup: WarmupSpec,
    seed: int,
    trace: Sequence[TraceRecord] | None = None,
) -> ArrivalPlan:
    """Warm-up, then a measured window of duration_s, for any arrival kind.

    Warm-up lasts ``warmup.duration_s`` and at least until ``warmup.requests`` were
    sent. Stationary processes (Poisson, gamma, trace) run on through it; ramp and
    diurnal warm up at their starting rate and begin their shape when the measured
    window does. Closed: the warm-up requests at 0, the measured batch at
    ``warmup.duration_s`` (at 0 with no warm-up requests).
    """
    if isinstance(arrival, ClosedArrival):
        n_warm = warmup.requests
        start = warmup.duration_s if n_warm else 0.0
        send = np.concatenate([np.zeros(n_warm), np.full(arrival.requests, start)])
        flags = np.arange(len(send)) < n_warm
        return ArrivalPlan(send_s=send, warmup=flags, measured_start_s=start, measured_end_s=None)

    stream: Callable[[float], tuple[FloatArray, IntArray | None]]
    shaped = isinstance(arrival, RampArrival | DiurnalArrival)
    if isinstance(arrival, PoissonArrival):
        rate = arrival.rate_per_s

        def stream(h: float) -> tuple[FloatArray, IntArray | None]:
            return poisson_arrivals(rate_per_s=rate, duration_s=h, seed=_seed(seed, 1)), None

    elif isinstance(arrival, GammaArrival):
        rate, cv = arrival.rate_per_s, arrival.burstiness

        def stream(h: float) -> tuple[FloatArray, IntArray | None]:
            times = gamma_arrivals(
                rate_per_s=rate, burstiness=cv, duration_s=h, seed=_seed(seed, 1)
            )
            return times, None

    elif isinstance(arrival, TraceArrival):
        if not trace:
            raise WorkloadError(f"trace {arrival.path!r} has no requests")
        records, target = trace, arrival.rate_per_s

        start_share = arrival.start_share

        def stream(h: float) -> tuple[FloatArray, IntArray | None]:
            return trace_arrivals(records, rate_per_s=target, duration_s=h, start_share=start_share)

    else:
        # Ramp and diurnal warm up as Poisson at their starting rate (the mean if that is 0).
        initial = (
            arrival.start_rate_per_s
            if isinstance(arrival, RampArrival)
            else arrival.trough_rate_per_s
        )
        warm_rate = initial if initial > 0 else arrival.mean_rate_per_s or 1.0

        def stream(h: float) -> tuple[FloatArray, IntArray | None]:
            return poisson_arrivals(rate_per_s=warm_rate, duration_s=h, seed=_seed(seed, 2)), None

    # Warm-up: the stream until warmup.duration_s, and on until warmup.requests were sent.
    start = warmup.duration_s
    horizon = start + duration_s
    times, _ = stream(horizon)
    if warmup.requests:
        while len(times) < warmup.requests:
            horizon *= 2
            if horizon > _MAX_HORIZON_S:
                raise WorkloadError(
                    f"warmup.requests {warmup.requests} are never reached by the arrivals"
                )
            times, _ = stream(horizon)
        start = max(start, float(times[warmup.requests - 1]))
    end = start + duration_s
    n_warm = max(int(np.searchsorted(times, warmup.duration_s, side="left")), warmup.requests)

    if not shaped:
        times, rows = stream(end)
        flags = np.arange(len(times)) < n_warm
        return ArrivalPlan(
            send_s=times,
            warmup=flags,
            measured_start_s=start,
            measured_end_s=end,
            trace_rows=rows,
        )

    if isinstance(arrival, RampArrival):
        measured = ramp_arrivals(
            start_rate_per_s=arrival.start_rate_per_s,
            end_rate_per_s=arrival.end_rate_per_s,
            duration_s=duration_s,
            seed=_seed(seed, 3),
        )
    else:
        assert isinstance(arrival, DiurnalArrival)
        measured = diurnal_arrivals(
            peak_rate_per_s=arrival.peak_rate_per_s,
            trough_rate_per_s=arrival.trough_rate_per_s,
            periods=arrival.periods,
            duration_s=duration_s,
            seed=_seed(seed, 3),
        )
    warm = times[:n_warm]
    send = np.concatenate([warm, start + measured])
    flags = np.arange(len(send)) < n_warm
    return ArrivalPlan(send_s=send, warmup=flags, measured_start_s=start, measured_end_s=end)
