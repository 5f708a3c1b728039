"""When a level's measured window opens, and how long it lasts.

A level measures the rate a server sustains, so its window must hold the server's
steady state at that rate, and enough of it for the percentiles its SLO names. Each
level is sent as one schedule at its own rate (multi-turn sessions already under way
from offset 0, ``workloads.stationary``): a warm-up, then the window.

**How long** (`plan_level`, emulated seconds):

- the warm-up lasts at least ``warmup_min_s``: with sessions, one turn gap (the
  expected answer and the think time: the prefix cache and the turn mix settle within
  it); without, two expected request lifetimes (the batch turns over twice); at least
  ``MIN_WARMUP_S``. It lasts at most ``warmup_max_s``: with sessions, the most turns a
  session has, one turn gap each (the sessions under way were planned with expected
  answer times; on a slower server more of them are under way at once, and their
  number, with the KV cache their histories hold, settles within a session's
  length); without, twice the minimum, at least ``MIN_EXTRA_WARMUP_S`` more.
- the window lasts the longest of: ``MIN_WINDOW_S``, enough requests for the tightest
  SLO percentile (``needed``: ``2 / (1 - p)``, 200 for a p99, so at least two requests
  lie beyond it; at least ``MIN_REQUESTS``), and ``LIFETIMES`` expected request
  lifetimes (median planned answer); at most ``MAX_WINDOW_S`` (10 minutes: below a third
  of a request a second a p99 is estimated from fewer requests than it needs, and
  ``window.json`` says how many). ``--level-duration``
  fixes it instead (and ``--level-warmup`` the warm-up).
- a trace replay's window is one pass of the trace (``workloads.replay``: its steady
  state is the trace, looped), at most the longest window, then on the pass's busiest
  stretch of that length; it is never held longer (more of the quiet part of a pass
  would dilute the stretch that decides).
- that is the window's shortest length; it goes on (`window_closes`) until it holds
  ``WINDOW_CORRELATIONS`` (20) correlation times of the running batch and of KV usage
  (``tuner.serving.correlation``: 10 independent stretches of the server's state; 5
  where the percentiles so far are far from their limits, below half of them or past
  twice, `correlations_wanted`) and
  KV usage's projection over the workload's longest conversation says clearly whether
  the cache fills (``kv_verdict_clear``: a chat server near capacity may fill it over
  minutes, which a short window cannot tell from a cache still settling) and
  the SLO's verdict over it is clear: every percentile below ``1 / (1 + band)`` of its
  limit, or one past ``1 + band`` times it, where the band is ``VERDICT_BAND`` (40 %) at
  the shortest window and narrows as the square root of its length (22 % at three
  times it, 10 % at 16 times); at most ``MAX_WINDOW_S``. A correlation time estimated
  from a stretch shorter than it reads short (a stretch cannot show a memory longer
  than itself), so the verdict's band is what holds on a level near its SLO, the
  levels the goodput is decided by, and the correlation time counted is at least the
  longest one a level that held at a lower rate measured (``correlation_floor_s``:
  the server's memory lengthens toward capacity). The longest window holds at most
  ``MAX_WINDOW_REQUESTS`` (20,000: a hundred times what a p99 needs), so a fast level's
  schedule stays cheap to plan. Near capacity the batch swings through excursions tens of
  seconds long (``mixed-long-short`` on an H100 at 34 req/s: a correlation time of
  10 s, against 2.6 s at 20 req/s), so a window of three request lifetimes holds one
  excursion or none, and its p99 says which: the level is held as long as the
  server's state needs to show its percentiles, and no longer where it is quick to
  forget (a level far below capacity closes at its shortest). The schedule is
  planned to the longest window; what is planned after the window closes is never
  sent.

**When it opens** (`steady_opening`): the first moment past ``warmup_min_s`` at which,
over the trailing ``steady_span_s`` (half the minimum warm-up, at least 5 s), none of
running requests, waiting requests and KV-cache usage moves at a rate that, kept up
through the window, would be material to the backlog guard: a least-squares slope
with |t| >= 3 whose change over ``window_s`` exceeds the guard's margin (running and
waiting ``max(2, 25 % of the mean running batch)``, KV usage 10 points), up or down.
A server still filling up or building a queue fails it, and so does one whose
population of conversations is still settling from above (the sessions under way
were planned with expected answer times; a faster server finishes them sooner). At ``warmup_max_s``
the window opens anyway, marked not steady at open; the backlog guard then judges the
window (a level whose queue still grows fails).

The window's requests are those whose intended send time falls in
``[opened_at_s, opened_at_s + window_s)``; everything before is warm-up, and requests
planned after it are never sent (the run is cut a drain after the window closes).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from tuner.run.layout import WINDOW_JSON
from tuner.serving.backlog import (
    KV_MARGIN,
    MIN_POINTS,
    T_MIN,
    WAITING_MIN_REQUESTS,
    WAITING_RUNNING_FRACTION,
    Signal,
    SignalTrend,
    kv_trend,
    trend,
)
from tuner.serving.correlation import correlation_time_s
from tuner.serving.prometheus_scrape import MetricsSample
from workloads.replay import pass_s, window_in_pass_s
from workloads.schedule import ScheduledRequest
from workloads.spec import WorkloadSpec
from workloads.stationary import expected_turns, largest_turns, lookback_s, turn_gap_s

WINDOW_FILE = WINDOW_JSON
MIN_WARMUP_S = 3.0
MIN_EXTRA_WARMUP_S = 10.0
MIN_STEADY_SPAN_S = 5.0
MIN_REQUESTS = 50
MIN_WINDOW_S = 8.0
# A session workload's shortest window: at least this, and at least one mean conversation's
# planned lifetime (its expected turns, each a turn gap). Where a level holds depends on
# the conversations under way, which a window shorter than one of them draws few of: the
# default chat tune's goodput spread 18.5% over five draws of the workload with its 18-s
# windows, 5% with 60-s ones (benchmarks/repeatability.md).
MIN_SESSION_WINDOW_S = 60.0
LIFETIMES = 3.0
MAX_WINDOW_S = 600.0  # 10 minutes: 200 requests for a p99 down to 0.33 req/s
WINDOW_CORRELATIONS = 20.0  # correlation times of the server's state a window holds
FAR_CORRELATIONS = 5.0  # ... where its SLO percentiles are far from their limits
FAR_SHARE = 0.5  # far: every one below half its limit, or one past twice it
MAX_WINDOW_REQUESTS = 20_000  # the longest window's, where fewer than MAX_WINDOW_S hold them
VERDICT_BAND = 0.4  # a percentile within 40 % of its limit at the shortest window holds it on
# KV usage's verdict is clear when the probability that the cache fills within a
# conversation (tuner.serving.backlog.kv_trend) is at most this, or at least 1 - this.
KV_CLEAR = 0.1
# Planned service of a request without a session's own expectations (SessionSpec's defaults).
EXPECTED_TTFT_S = 0.5
EXPECTED_TPOT_S = 0.03
TEST = (
    "over the trailing {span:g} s, none of running and waiting requests and KV-cache "
    "usage moves (least-squares slope with |t| >= 3) by more than its margin, up or "
    "down, if kept up through the {window:g} s window"
)


class WindowClose(StrEnum):
    """Why a level's window closed when it did."""

    SHORTEST = "shortest"  # its shortest length already held enough correlation times
    HELD = "held"  # held on until it did, and its verdict was clear of the SLO's limits
    LONGEST = "longest"  # the longest window was spent first: fewer than wanted
    DEADLINE = "deadline"  # held on to the search's deadline, which came first (``held_until``)
    FIXED = "fixed"  # --level-duration
    TRACE = "trace"  # a trace replay's pass, or its busiest stretch (workloads.replay)
    STOPPED = "stopped"  # the level stopped early (a backlog, the SLO already broken)


class LevelPlan(BaseModel):
    """How one level spends its time (emulated seconds)."""

    model_config = ConfigDict(frozen=True)

    warmup_min_s: float
    warmup_max_s: float
    window_s: float  # the shortest window
    needed_requests: int  # for the tightest SLO percentile
    requests_per_s: float  # the schedule's planned request rate
    window_max_s: float | None = None  # the longest (None: fixed at ``window_s``)
    # The longest correlation time a level that held at a lower rate measured: near
    # capacity the server's memory only lengthens with the load, and a short stretch
    # reads it short, so this level's window holds at least as many of those.
    correlation_floor_s: float | None = None
    # Carried on from the level before on a chained run, adding this share of its
    # conversations under way (None: opened on an empty server).
    carried_on: float | None = None
    # A trace replay's pass (``workloads.replay``): the window is one pass, or its
    # busiest stretch where a pass is longer (None: not a trace replay).
    trace_pass_s: float | None = None
    # How far KV usage's growth is projected (the workload's longest conversation,
    # ``workloads.stationary.lookback_s``); a held window goes on until that projection's
    # verdict is clear (``kv_verdict_clear``). 0: not projected (no sessions).
    kv_horizon_s: float = 0.0
    # The longest window was cut so that the level ends before its search's deadline
    # (``held_until``): a window closed there says so (``WindowClose.DEADLINE``).
    cut_to_deadline: bool = False

    @property
    def longest_window_s(self) -> float:
        return self.window_max_s if self.window_max_s is not None else self.window_s

    @property
    def total_s(self) -> float:
        """The schedule's length: the longest warm-up and the longest window."""
        return self.warmup_max_s + self.longest_window_s

    @property
    def steady_span_s(self) -> float:
        return max(MIN_STEADY_SPAN_S, self.warmup_min_s / 2.0)

    def test(self) -> str:
        return TEST.format(span=round(self.steady_span_s, 1), window=round(self.window_s))


class WindowOpening(BaseModel):
    """When a level's window opened, and the steadiness test's evidence at that moment."""

    model_config = ConfigDict(frozen=True)

    warmup_min_s: float
    warmup_max_s: float
    opened_at_s: float  # emulated seconds from the level's offset 0
    steady_at_open: bool
    test: str
    signals: tuple[SignalTrend, ...] = ()
    window_s: float  # the planned shortest, until the window closes; then its length
    requests: int = 0  # measured in the window (set once the level is over)
    needed_requests: int
    window_min_s: float | None = None
    window_max_s: float | None = None
    closed: WindowClose | None = None
    correlation_s: float | None = None  # the server state's, over the window, at its close
    correlation_floor_s: float | None = None  # at least this: a lower rate's that held
    correlations_wanted: float = WINDOW_CORRELATIONS
    slo_share: float | None = None  # the worst percentile's share of its limit, at the close
    band: float | None = None  # how clear of 1 it had to be then (``verdict_band``)
    # Carried on from the level before on a chained run, adding this share of the
    # conversations under way (None: opened on an empty server).
    carried_on: float | None = None
    trace_pass_s: float | None = None  # a trace replay's pass (LevelPlan.trace_pass_s)

    def summary(self) -> str:
        state = "steady" if self.steady_at_open else "NOT steady (longest warm-up spent)"
        if self.carried_on is not None:
            state += f", carried on from the rate before ({100 * self.carried_on:.0f} % new)"
        held = ""
        if self.correlation_s is not None:
            held = f", {self.correlation_s:.1f} s correlation time"
            if self.closed in (WindowClose.LONGEST, WindowClose.DEADLINE):
                held += f" (held {self.window_s / max(self.correlation_s, 1e-9):.0f} of "
                held += f"{self.correlations_wanted:.0f} wanted"
                held += ", cut to end by its search's deadline)" if self.cut else ")"
        if self.slo_share is not None and self.closed is not WindowClose.FIXED:
            held += f", worst percentile {100 * self.slo_share:.0f} % of its limit"
        if self.trace_pass_s is not None:
            held += f", {trace_part(self.window_s, self.trace_pass_s)}"
        return (
            f"window opened {self.opened_at_s:.1f} s in, {state}; {self.window_s:.0f} s"
            f"{held}, {self.requests} requests (needed {self.needed_requests})"
        )

    @property
    def cut(self) -> bool:
        """Closed at its search's deadline before its verdict was clear (``held_until``)."""
        return self.closed is WindowClose.DEADLINE

    def closed_at(
        self, window_s: float, closed: WindowClose, correlation_s: float | None,
        slo_share: float | None = None, band: float | None = None,
        correlations_wanted: float = WINDOW_CORRELATIONS,
    ) -> WindowOpening:  # fmt: skip
        """This opening with its window closed ``window_s`` in."""
        return self.model_copy(
            update={
                "window_min_s": self.window_min_s if self.window_min_s is not None else self.window_s,
                "window_s": window_s, "closed": closed, "correlation_s": correlation_s,
                "slo_share": slo_share, "band": band, "correlations_wanted": correlations_wanted,
            }
        )  # fmt: skip

    def write(self, level_dir: Path) -> None:
        path = level_dir / WINDOW_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)

    @classmethod
    def read(cls, level_dir: Path) -> WindowOpening | None:
        """The opening ``write`` left in ``level_dir`` (None: none, or unreadable: a level
        that stopped before its window opened, a half-written or foreign file)."""
        try:
            return cls.model_validate_json((level_dir / WINDOW_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None


def trace_part(window_s: float, pass_s: float) -> str:
    """What of a trace replay's pass a window holds, in words."""
    if window_s >= pass_s - 1e-6:
        return f"one whole pass of the trace ({pass_s:.0f} s)"
    return f"the busiest {window_s:.0f} s of the trace's {pass_s:.0f}-s pass"


def needed_requests(spec: WorkloadSpec) -> int:
    """Requests a window needs for its tightest SLO percentile: two beyond it."""
    tightest = max((o.percentile for o in spec.slo.objectives()), default=50)
    return max(MIN_REQUESTS, math.ceil(2.0 / (1.0 - tightest / 100.0)))


def session_window_s(spec: WorkloadSpec, schedule: Sequence[ScheduledRequest]) -> float:
    """A session workload's shortest window (``MIN_SESSION_WINDOW_S``, or one mean
    conversation's planned lifetime where that is longer); 0 without sessions."""
    if spec.sessions is None:
        return 0.0
    median = statistics.median(r.max_tokens for r in schedule) if schedule else 0
    lifetime = expected_turns(spec) * turn_gap_s(spec.sessions, median)
    return max(MIN_SESSION_WINDOW_S, lifetime)


def expected_lifetime_s(spec: WorkloadSpec, schedule: Sequence[ScheduledRequest]) -> float:
    """The planned lifetime of the median request: first token, then its answer."""
    sessions = spec.sessions
    ttft = sessions.expected_ttft_s if sessions is not None else EXPECTED_TTFT_S
    tpot = sessions.expected_tpot_s if sessions is not None else EXPECTED_TPOT_S
    tokens = statistics.median(r.max_tokens for r in schedule) if schedule else 0
    return ttft + tokens * tpot


def plan_level(
    spec: WorkloadSpec,
    schedule: Sequence[ScheduledRequest],
    *,
    window_s: float | None = None,
    warmup_s: float | None = None,
    window_max_s: float | None = None,
    correlation_floor_s: float | None = None,
    carried_on: float | None = None,
) -> LevelPlan:
    """The plan of a level whose provisional ``schedule`` was built for ``spec`` (its
    request rate is read from it). ``window_s``, ``warmup_s``: fixed (the warm-up's min =
    max), else automatic. ``window_max_s``: the longest an automatic window is held
    (default ``MAX_WINDOW_S``, at most ``MAX_WINDOW_REQUESTS``); its shortest is cut to it.
    ``carried_on``: the level carries on from the one before on a chained run, adding
    this share of its conversations under way (``tuner.serving.level_schedule.CarryOn``); its
    shortest warm-up is then that share of a turn gap (the carried ones' history is in
    the server's cache already), or one request lifetime without sessions (the batch
    turns over once to the new rate), and the steadiness test decides the rest."""
    lifetime = expected_lifetime_s(spec, schedule)
    if warmup_s is not None:
        warm_min = warm_max = warmup_s
    else:
        if spec.sessions is not None:
            median = statistics.median(r.max_tokens for r in schedule) if schedule else 0
            gap = turn_gap_s(spec.sessions, median)
            warm_min = max(MIN_WARMUP_S, gap)
            longest = largest_turns(spec.sessions) * warm_min
            warm_max = max(warm_min + MIN_EXTRA_WARMUP_S, longest)
            if carried_on is not None:
                warm_min = max(MIN_WARMUP_S, carried_on * gap)
        else:
            warm_min = max(MIN_WARMUP_S, 2.0 * lifetime)
            warm_max = warm_min + max(MIN_EXTRA_WARMUP_S, warm_min)
            if carried_on is not None:
                warm_min = max(MIN_WARMUP_S, lifetime)
    span = spec.duration_s
    rate = sum(1 for r in schedule if 0.0 <= r.send_s < span) / span if span > 0 else 0.0
    needed = needed_requests(spec)
    held_max_s: float | None = None
    if window_s is None:
        cap = window_max_s if window_max_s is not None else MAX_WINDOW_S
        enough_s = needed / rate if rate > 0 else cap  # none planned: as long as allowed
        shortest = max(MIN_WINDOW_S, LIFETIMES * lifetime, session_window_s(spec, schedule))
        window_s = min(max(shortest, enough_s), cap, MAX_WINDOW_S)
        by_requests = MAX_WINDOW_REQUESTS / rate if rate > 0 else cap
        held_max_s = max(window_s, min(cap, by_requests))
        in_pass = window_in_pass_s(spec, min(cap, MAX_WINDOW_S))
        if in_pass is not None:  # a trace replay: one pass, or its busiest stretch
            window_s = held_max_s = max(MIN_WINDOW_S, in_pass)
    one_pass = pass_s(spec)
    return LevelPlan(
        warmup_min_s=warm_min,
        warmup_max_s=warm_max,
        window_s=window_s,
        needed_requests=needed,
        requests_per_s=rate,
        window_max_s=held_max_s,
        correlation_floor_s=correlation_floor_s if held_max_s is not None else None,
        carried_on=carried_on,
        trace_pass_s=one_pass,
        kv_horizon_s=lookback_s(spec),
    )


def moving(signal: SignalTrend, window_s: float) -> bool:
    """Whether a signal's slope, kept up through ``window_s``, is a material change, up
    (a server filling up or queueing) or down (a population still settling from above)."""
    if signal.points < MIN_POINTS or signal.slope_per_s is None:
        return True  # too few points to say it is flat
    slope = signal.slope_per_s
    significant = slope != 0 if signal.t_stat is None else abs(signal.t_stat) >= T_MIN
    return significant and abs(slope) * window_s > signal.margin


def steady_signals(
    samples: Sequence[MetricsSample], *, start_unix_s: float, now_unix_s: float,
    span_s: float, time_scale: float,
) -> tuple[SignalTrend, ...]:  # fmt: skip
    """Running, waiting and KV usage over the trailing ``span_s`` (emulated) before now."""
    k = time_scale
    since = now_unix_s - span_s * k
    inside = [s for s in samples if since <= s.unix_s <= now_unix_s and s.unix_s >= start_unix_s]
    running = [s.running for s in inside if s.running is not None]
    mean_running = sum(running) / len(running) if running else 0.0
    margin = max(WAITING_MIN_REQUESTS, WAITING_RUNNING_FRACTION * mean_running)

    def points(values: list[tuple[float, float | None]]) -> list[tuple[float, float]]:
        return [((t - start_unix_s) / k, v) for t, v in values if v is not None]

    return (
        trend(Signal.RUNNING, points([(s.unix_s, s.running) for s in inside]), margin=margin),
        trend(Signal.WAITING, points([(s.unix_s, s.waiting) for s in inside]), margin=margin),
        trend(
            Signal.KV_USAGE,
            points([(s.unix_s, s.kv_cache_usage) for s in inside]),
            margin=KV_MARGIN,
        ),
    )


def steady_opening(
    plan: LevelPlan,
    samples: Sequence[MetricsSample],
    *,
    start_unix_s: float,
    now_unix_s: float,
    time_scale: float,
) -> WindowOpening | None:
    """The window's opening if it opens now (steady, or the longest warm-up spent), else None."""
    elapsed_s = (now_unix_s - start_unix_s) / time_scale
    if elapsed_s < plan.warmup_min_s:
        return None
    signals = steady_signals(
        samples, start_unix_s=start_unix_s, now_unix_s=now_unix_s,
        span_s=min(plan.steady_span_s, elapsed_s), time_scale=time_scale,
    )  # fmt: skip
    steady = not any(moving(s, plan.window_s) for s in signals)
    if not steady and elapsed_s < plan.warmup_max_s:
        return None
    return WindowOpening(
        warmup_min_s=plan.warmup_min_s,
        warmup_max_s=plan.warmup_max_s,
        opened_at_s=min(elapsed_s, plan.warmup_max_s) if not steady else elapsed_s,
        steady_at_open=steady,
        test=plan.test(),
        signals=signals,
        window_s=plan.window_s,
        needed_requests=plan.needed_requests,
        window_max_s=plan.window_max_s,
        correlation_floor_s=plan.correlation_floor_s,
        carried_on=plan.carried_on,
        trace_pass_s=plan.trace_pass_s,
    )


def state_correlation_s(
    samples: Sequence[MetricsSample], *, start_unix_s: float, now_unix_s: float,
    time_scale: float,
) -> float | None:  # fmt: skip
    """The longest correlation time (emulated seconds) of the running batch and KV usage
    between ``start_unix_s`` and ``now_unix_s`` (None: too few samples to say)."""
    inside = [s for s in samples if start_unix_s <= s.unix_s <= now_unix_s]
    k = time_scale
    times: list[float] = []
    for values in (
        [((s.unix_s - start_unix_s) / k, s.running) for s in inside],
        [((s.unix_s - start_unix_s) / k, s.kv_cache_usage) for s in inside],
    ):
        tau = correlation_time_s([(t, float(v)) for t, v in values if v is not None])
        if tau is not None:
            times.append(tau)
    return max(times) if times else None


def verdict_band(plan: LevelPlan, elapsed_s: float) -> float:
    """How far clear of its limit a percentile must be for the window to close now: a
    share of the limit, ``VERDICT_BAND`` at the shortest window, narrowing as the square
    root of the window's length (a percentile's noise shrinks so)."""
    return VERDICT_BAND * math.sqrt(plan.window_s / max(elapsed_s, plan.window_s))


def verdict_clear(shares: Sequence[float], band: float) -> bool:
    """Whether the SLO's verdict is clear: some percentile past ``(1 + band)`` times its
    limit (missed), or every one below ``1 / (1 + band)`` of it (met). No share: not clear."""
    if not shares:
        return False
    return max(shares) >= 1.0 + band or max(shares) <= 1.0 / (1.0 + band)


def window_closes(
    plan: LevelPlan, opening: WindowOpening, samples: Sequence[MetricsSample], *,
    opened_unix_s: float, now_unix_s: float, time_scale: float,
    shares: Sequence[float] | None = None,
) -> WindowOpening | None:  # fmt: skip
    """The opening closed now, if its window is long enough, else None: it has held
    ``correlations_wanted`` correlation times of the server's state and, where the
    window's SLO percentiles so far are given (``shares``: each one's share of its
    limit), their verdict is clear (``verdict_clear`` within ``verdict_band``); or the
    longest window is spent."""
    elapsed_s = (now_unix_s - opened_unix_s) / time_scale
    if elapsed_s < plan.window_s:
        return None
    tau = state_correlation_s(
        samples, start_unix_s=opened_unix_s, now_unix_s=now_unix_s, time_scale=time_scale
    )
    if plan.correlation_floor_s is not None:
        tau = max(tau or 0.0, plan.correlation_floor_s)
    worst = max(shares) if shares else None
    if plan.window_max_s is None:
        return opening.closed_at(plan.window_s, WindowClose.FIXED, tau, worst, None)
    if plan.trace_pass_s is not None:  # the stretch is the measurement: never held longer
        return opening.closed_at(plan.window_s, WindowClose.TRACE, tau, worst, None)
    band = verdict_band(plan, elapsed_s)
    wanted = correlations_wanted(shares)
    enough = tau is not None and elapsed_s >= wanted * tau
    if shares is not None:
        enough = enough and verdict_clear(shares, band)
    enough = enough and kv_verdict_clear(
        plan, samples, opened_unix_s=opened_unix_s, now_unix_s=now_unix_s, time_scale=time_scale
    )
    if not enough and elapsed_s >= plan.window_max_s:
        cut = WindowClose.DEADLINE if plan.cut_to_deadline else WindowClose.LONGEST
        return opening.closed_at(plan.window_max_s, cut, tau, worst, band, wanted)
    if not enough:
        return None
    length_s = min(elapsed_s, plan.window_max_s)
    kind = WindowClose.SHORTEST if elapsed_s < plan.window_s + 1.0 else WindowClose.HELD
    return opening.closed_at(length_s, kind, tau, worst, band, wanted)


# Wall seconds a level spends outside its schedule (planning it, starting the load
# generator, writing its evidence: "other" in a trial's line, 2 to 6 s on the default tune).
LEVEL_OVERHEAD_S = 6.0


def held_until(plan: LevelPlan, left_s: float, time_scale: float, drain_s: float) -> LevelPlan:
    """``plan`` with its window held on no longer than ends the level within ``left_s``
    wall seconds (its search's deadline, ``time_scale`` wall seconds an emulated one): its
    longest warm-up, the window, ``drain_s`` (emulated) and ``LEVEL_OVERHEAD_S``. Never
    shorter than its shortest window (the search starts no level that cannot end in time,
    as long as its longest so far), and unchanged where the deadline allows the longest.
    A level near its limit is held on until its verdict is clear, up to ``MAX_WINDOW_S``:
    uncut, a 10-minute tune's confirmation held its last level on 135 s at 4x and ended
    73 s past the budget."""
    if plan.window_max_s is None or plan.trace_pass_s is not None:
        return plan
    room_s = (left_s - LEVEL_OVERHEAD_S) / (time_scale or 1.0) - plan.warmup_max_s - drain_s
    if room_s >= plan.window_max_s:
        return plan
    return plan.model_copy(
        update={"window_max_s": max(plan.window_s, room_s), "cut_to_deadline": True}
    )


def kv_verdict_clear(
    plan: LevelPlan, samples: Sequence[MetricsSample], *,
    opened_unix_s: float, now_unix_s: float, time_scale: float,
) -> bool:  # fmt: skip
    """Whether KV usage's projection over the window so far says clearly whether the
    cache fills within a conversation (``kv_trend``'s ``p_full`` at most ``KV_CLEAR`` or
    at least ``1 - KV_CLEAR``); True where it is not projected or not yet estimable.
    Near capacity a chat server's cache may fill over minutes, which a window of 15 s
    cannot tell from a cache still settling: it is held on until the slope decides."""
    if plan.kv_horizon_s <= 0.0:
        return True
    k = time_scale
    points = [
        ((s.unix_s - opened_unix_s) / k, s.kv_cache_usage)
        for s in samples
        if opened_unix_s <= s.unix_s <= now_unix_s
    ]
    p_full = kv_trend(points, plan.kv_horizon_s).p_full
    return p_full is None or p_full <= KV_CLEAR or p_full >= 1.0 - KV_CLEAR


def correlations_wanted(shares: Sequence[float] | None) -> float:
    """How many correlation times of the server's state a window holds: ``FAR_CORRELATIONS``
    where the SLO's percentiles so far are far from their limits (every one below
    ``FAR_SHARE`` of its limit, or one past its inverse), else ``WINDOW_CORRELATIONS``.
    Far from the limit only a backlog or a tipping state would change the verdict, and
    the backlog guard watches for those; near it, the percentile's own noise decides."""
    if not shares:
        return WINDOW_CORRELATIONS
    worst = max(shares)
    if worst <= FAR_SHARE or worst >= 1.0 / FAR_SHARE:
        return FAR_CORRELATIONS
    return WINDOW_CORRELATIONS
