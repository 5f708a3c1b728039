"""The backlog guard: does a level's queue, KV usage or TTFT trend up through its window?

A goodput is the rate a server sustains in the steady state, not how fast it absorbs
a short burst from empty: a level that builds a backlog has failed, whatever its
percentiles say (a few seconds above capacity still meet a generous TTFT objective
while the queue grows without bound). This module decides it from what a level left
behind, and nothing else (pure: no processes, no I/O):

- the /metrics timeline (``tuner.serving.prometheus_scrape.MetricsSample``): ``waiting`` requests and
  ``kv_usage`` (fraction of the KV cache in use) against time;
- the request records (``workloads.schedule.RequestRecord``): each streamed request's
  TTFT, from its intended send time, against that send time. A request cut off before
  its first token counts with the wait it had (a lower bound).

Only the measured window counts (the schedule's span, not the drain after its last
send); times are converted to the emulated GPU's seconds (``time_scale``).

**The test.** For each signal, over the points it is judged on: the least-squares
slope per second, its t-statistic (slope over its standard error) and the growth
(slope times the span judged). A signal is ``GROWING`` when all of these hold:

1. significant: the slope's t-statistic is at least ``T_MIN`` (3) (an exact line, with
   no residual, when its slope is positive);
2. material: the growth exceeds the signal's margin:
   waiting: ``max(2 requests, 25 % of the mean running batch)``;
   KV usage: 10 points of the cache (0.10);
   TTFT: 25 % of the workload's loosest TTFT limit (250 ms when it has none);
3. sustained: split the judged span into thirds by time; the mean of each third
   exceeds the one before by at least a sixth of the margin (linear growth by the
   margin rises by a third of it per third). A burst at the end of a steady window,
   or a ramp from an idle server that levels off, is not a backlog.

KV usage is judged otherwise, because growth within a window does not tell a cache
still filling towards its level from one that fills until vLLM preempts: a window
(often 15 to 30 s) is shorter than the time a chat workload's population of
conversations takes to renew. KV usage is ``GROWING`` when its slope is significant
(1.), its last third is above its first by a third of its margin (3.3 points), and
the fit, continued from the judged span's end for a horizon, reaches a full cache
(``KV_FULL``, 1.0: where vLLM starts preempting); its growth within the window need
not reach the margin (2.). The horizon is the longer of the judged span and
``kv_horizon_s``: the workload's longest conversation (``workloads.stationary.lookback_s``,
2 to 3 minutes for ``chat``), the longest the cache can keep filling before the
conversations under way have all been replaced. A cache that rises a little through
a short window without heading for full (a population still settling) is not a
backlog; one that heads for full within a conversation is, however little it rose.

A signal with fewer than ``MIN_POINTS`` (10) points, or a third without any, is
``TOO_SHORT``; otherwise ``STEADY``. KV usage and TTFT are judged only from one
median request lifetime after the window opens (first token to last, from the
records): that long the batch still turns over from whatever load came before, so
KV usage and TTFT ramp up from an idle server even at a sustainable rate. The queue
is judged over the whole window.

The level: ``GROWING`` when any signal grows; else ``STEADY`` when any signal could be
judged; else ``TOO_SHORT``. Only ``GROWING`` is a miss. A level whose queue already
grew by ``EARLY_FACTOR`` (2) times its margin, under the same test, after a third of
its window is overloaded clearly enough to stop early (``clearly_growing``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from enum import StrEnum

import numpy as np
from pydantic import BaseModel, ConfigDict

from tuner.serving.prometheus_scrape import MetricsSample
from workloads.load_errors import ABORTED
from workloads.schedule import RequestRecord

T_MIN = 3.0
MIN_POINTS = 10
WAITING_MIN_REQUESTS = 2.0
WAITING_RUNNING_FRACTION = 0.25
KV_MARGIN = 0.10
KV_FULL = 1.0
TTFT_SLO_FRACTION = 0.25
TTFT_DEFAULT_MARGIN_MS = 250.0
EARLY_FACTOR = 2.0


class BacklogVerdict(StrEnum):
    STEADY = "steady"
    GROWING = "growing"
    TOO_SHORT = "too_short"  # too few points to decide


class Signal(StrEnum):
    WAITING = "waiting"  # requests waiting (vllm:num_requests_waiting)
    KV_USAGE = "kv_usage"  # fraction of the KV cache in use (vllm:kv_cache_usage_perc)
    TTFT = "ttft"  # ms, by intended send time
    RUNNING = "running"  # requests running (vllm:num_requests_running): the window's opening


class SignalTrend(BaseModel):
    """One signal's trend through the judged part of the window (emulated seconds)."""

    model_config = ConfigDict(frozen=True)

    signal: Signal
    verdict: BacklogVerdict
    points: int
    span_s: float  # from the first point judged to the last
    slope_per_s: float | None = None  # least squares, signal units per second
    t_stat: float | None = None  # the slope over its standard error; None: an exact line
    growth: float | None = None  # slope_per_s * span_s
    margin: float  # the growth that is material, in signal units
    thirds: tuple[float, float, float] | None = None  # mean of each third of the span
    projected: float | None = None  # KV usage: the fit's value a horizon after the span
    horizon_s: float | None = None  # KV usage: that horizon (emulated seconds)
    # KV usage: the probability that the cache fills within the horizon, from the fit's
    # standard error at the horizon (normal): how sure the verdict is
    p_full: float | None = None

    def describe(self) -> str:
        """E.g. ``waiting +35 over 8 s``, ``KV usage +12 points over 8 s``."""
        growth = self.growth or 0.0
        span = f"over {self.span_s:.0f} s"
        if self.signal is Signal.KV_USAGE:
            return f"KV usage {100 * growth:+.0f} points {span}"
        if self.signal is Signal.TTFT:
            return f"TTFT {growth:+,.0f} ms {span}"
        return f"{self.signal.value} {growth:+.0f} {span}"


class BacklogCheck(BaseModel):
    """The backlog guard's verdict on one level, with each signal's trend."""

    model_config = ConfigDict(frozen=True)

    verdict: BacklogVerdict
    window_s: float  # the measured window judged (emulated seconds)
    settle_s: float  # KV usage and TTFT are judged from this long after the window opens
    waiting: SignalTrend
    kv_usage: SignalTrend
    ttft: SignalTrend

    @property
    def signals(self) -> tuple[SignalTrend, SignalTrend, SignalTrend]:
        return (self.waiting, self.kv_usage, self.ttft)

    @property
    def growing(self) -> bool:
        return self.verdict is BacklogVerdict.GROWING

    @property
    def growing_queue(self) -> bool:
        """A backlog of the queue or of TTFT, not of KV usage alone: one that is certain."""
        return any(s.verdict is BacklogVerdict.GROWING for s in (self.waiting, self.ttft))

    @property
    def kv_stays(self) -> float:
        """The probability that KV usage does not fill the cache within its horizon
        (``kv_trend``'s ``p_full``; 1 where not estimated)."""
        p_full = self.kv_usage.p_full
        return 1.0 if p_full is None else 1.0 - p_full

    def summary(self) -> str:
        """E.g. ``backlog: waiting +35 over 8 s; TTFT +2,100 ms over 7 s``, or the verdict."""
        grown = [s.describe() for s in self.signals if s.verdict is BacklogVerdict.GROWING]
        if grown:
            return "backlog: " + "; ".join(grown)
        return f"backlog: {self.verdict.value.replace('_', ' ')}"


def check_backlog(
    samples: Sequence[MetricsSample],
    records: Iterable[RequestRecord],
    *,
    window_start_unix_s: float,
    window_end_unix_s: float,
    time_scale: float = 1.0,
    ttft_limit_ms: float | None = None,
    kv_horizon_s: float = 0.0,
) -> BacklogCheck:
    """The guard over ``[window_start_unix_s, window_end_unix_s]`` (wall clock, Unix s).

    ``time_scale`` K: the simulator ran K times slower than the emulated GPU; times and
    TTFTs are divided by K. ``ttft_limit_ms``: the workload's loosest TTFT limit.
    ``kv_horizon_s``: how far KV usage's growth is projected (``kv_trend``; emulated s).
    """
    k = time_scale
    start, end = window_start_unix_s, window_end_unix_s
    inside = [s for s in samples if start <= s.unix_s <= end]
    lifetimes: list[float] = []
    ttft_points: list[tuple[float, float]] = []
    for r in records:
        if r.warmup or not r.streamed or not (start <= r.scheduled_s <= end):
            continue
        x = (r.scheduled_s - start) / k
        if r.first_token_s is not None:
            ttft_points.append((x, 1000.0 * (r.first_token_s - r.scheduled_s) / k))
            if r.ok and r.end_s is not None:
                lifetimes.append((r.end_s - r.first_token_s) / k)
        elif r.error == ABORTED and r.end_s is not None:  # still waiting when cut off
            ttft_points.append((x, 1000.0 * (r.end_s - r.scheduled_s) / k))
    settle_s = float(np.median(lifetimes)) if lifetimes else 0.0

    waiting = [((s.unix_s - start) / k, s.waiting) for s in inside if s.waiting is not None]
    running = [s.running for s in inside if s.running is not None]
    mean_running = sum(running) / len(running) if running else 0.0
    kv = [((s.unix_s - start) / k, s.kv_cache_usage) for s in inside]
    ttft_margin = (
        TTFT_SLO_FRACTION * ttft_limit_ms if ttft_limit_ms is not None else TTFT_DEFAULT_MARGIN_MS
    )
    trends = (
        trend(
            Signal.WAITING,
            waiting,
            margin=max(WAITING_MIN_REQUESTS, WAITING_RUNNING_FRACTION * mean_running),
        ),
        kv_trend([p for p in kv if p[0] >= settle_s], kv_horizon_s),
        trend(Signal.TTFT, [p for p in ttft_points if p[0] >= settle_s], margin=ttft_margin),
    )
    verdicts = {t.verdict for t in trends}
    if BacklogVerdict.GROWING in verdicts:
        verdict = BacklogVerdict.GROWING
    elif BacklogVerdict.STEADY in verdicts:
        verdict = BacklogVerdict.STEADY
    else:
        verdict = BacklogVerdict.TOO_SHORT
    return BacklogCheck(
        verdict=verdict,
        window_s=max(0.0, (end - start) / k),
        settle_s=settle_s,
        waiting=trends[0],
        kv_usage=trends[1],
        ttft=trends[2],
    )


def trend(signal: Signal, points: Sequence[tuple[float, float]], *, margin: float) -> SignalTrend:
    """One signal's slope, t-statistic, growth and verdict (the test in the module's docstring)."""
    n = len(points)
    x = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    span = float(x.max() - x.min()) if n else 0.0
    short = SignalTrend(signal=signal, verdict=BacklogVerdict.TOO_SHORT, points=n, span_s=span,
                        margin=margin)  # fmt: skip
    if n < MIN_POINTS or span <= 0.0:
        return short
    dx = x - x.mean()
    sxx = float(dx @ dx)
    slope = float(dx @ (y - y.mean())) / sxx
    residuals = y - y.mean() - slope * dx
    se = math.sqrt(float(residuals @ residuals) / (n - 2) / sxx)
    t_stat = slope / se if se > 0.0 else None  # None: an exact line, no noise to weigh
    significant = slope > 0.0 if t_stat is None else t_stat >= T_MIN
    growth = slope * span
    edges = x.min() + span * np.array([1.0 / 3.0, 2.0 / 3.0])
    parts = (y[x < edges[0]], y[(x >= edges[0]) & (x < edges[1])], y[x >= edges[1]])
    fitted = {"slope_per_s": slope, "t_stat": t_stat, "growth": growth}
    if any(part.size == 0 for part in parts):
        return short.model_copy(update=fitted)
    thirds = (float(parts[0].mean()), float(parts[1].mean()), float(parts[2].mean()))
    step = margin / 6.0
    growing = (
        significant
        and growth > margin
        and thirds[1] - thirds[0] >= step
        and thirds[2] - thirds[1] >= step
    )
    return SignalTrend(
        signal=signal,
        verdict=BacklogVerdict.GROWING if growing else BacklogVerdict.STEADY,
        points=n,
        span_s=span,
        margin=margin,
        thirds=thirds,
        **fitted,
    )


def kv_trend(points: Sequence[tuple[float, float]], horizon_s: float = 0.0) -> SignalTrend:
    """KV usage's trend (the module's docstring): growing when its slope is significant,
    its last third is above its first by a third of the margin, and the fit, continued
    from the span's end for the longer of the span and ``horizon_s``, reaches a full
    cache. Its growth within the window need not reach the margin: a window can be
    shorter than the time the cache takes to fill. ``p_full``: the probability that it
    does fill, from the fit's standard error at the horizon (widened for the samples'
    autocorrelation: ``_autocorrelation_inflation``); 0 where the slope is not
    significantly positive (a flat cache's fit, projected minutes ahead, is mostly its
    noise)."""
    base = trend(Signal.KV_USAGE, points, margin=KV_MARGIN)
    if base.slope_per_s is None or base.thirds is None:
        return base
    x = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    horizon = max(base.span_s, horizon_s)
    at_s = float(x.max()) + horizon
    dx = x - x.mean()
    sxx = float(dx @ dx)
    residuals = y - y.mean() - base.slope_per_s * dx
    sigma2 = float(residuals @ residuals) / (len(points) - 2)
    at_horizon = float(y.mean()) + base.slope_per_s * (at_s - float(x.mean()))
    se = math.sqrt(sigma2 * (1.0 / len(points) + (at_s - float(x.mean())) ** 2 / sxx))
    se *= math.sqrt(_autocorrelation_inflation(residuals))
    significant = base.t_stat is None or base.t_stat >= T_MIN
    if not (significant and base.slope_per_s > 0.0):
        p_full = 0.0  # no evidence that it rises: a flat fit's noise is not a fill
    elif se > 0.0:
        p_full = 0.5 * math.erfc((KV_FULL - at_horizon) / (se * math.sqrt(2.0)))
    else:
        p_full = 1.0 if at_horizon >= KV_FULL else 0.0
    rose = base.thirds[2] - base.thirds[0] >= KV_MARGIN / 3.0
    growing = base.slope_per_s > 0.0 and significant and rose and at_horizon >= KV_FULL
    return base.model_copy(
        update={
            "projected": at_horizon,
            "horizon_s": horizon,
            "p_full": p_full,
            "verdict": BacklogVerdict.GROWING if growing else BacklogVerdict.STEADY,
        }
    )


def _autocorrelation_inflation(residuals: np.ndarray) -> float:
    """How much an ordinary least-squares variance understates the fit's: samples a
    quarter of a second apart are far from independent, so the residuals' lag-1
    autocorrelation rho inflates it by (1 + rho) / (1 - rho) (an AR(1) process; rho
    clipped to [0, 0.95])."""
    if residuals.size < 3:
        return 1.0
    denominator = float(residuals @ residuals)
    if denominator <= 0.0:
        return 1.0
    rho = float(residuals[1:] @ residuals[:-1]) / denominator
    rho = min(max(rho, 0.0), 0.95)
    return (1.0 + rho) / (1.0 - rho)


def clearly_growing(check: BacklogCheck, *, elapsed_s: float, window_s: float) -> bool:
    """Whether a level may stop now: a third of its window has passed and its queue grows
    by ``EARLY_FACTOR`` times its margin under the guard's test (emulated seconds)."""
    w = check.waiting
    return (
        elapsed_s >= window_s / 3.0
        and w.verdict is BacklogVerdict.GROWING
        and (w.growth or 0.0) >= EARLY_FACTOR * w.margin
    )
