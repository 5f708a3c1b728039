"""Goodput of one server: the highest request rate at which the workload's SLOs hold.

On a live server (``tuner.serving.live_server.LiveServer``) the workload is sent at a first rate, then:

* while every rate held, at a higher one, by a step the last level's evidence sets
  (``climb_step``): up to x2 while the latencies are far below their limits and the
  KV cache far from full, down to ``growth`` as they come close (or once the engine
  preempts);
* while every rate broke, at a lower one, by a step how far the lowest one missed
  sets (``descent_step``: its percentiles past their limits, the share of its requests
  that failed): x1/2 when it missed by far or stopped early, down to 1/``growth`` when
  it barely missed (a first rate the twin placed just above the edge);
* once a rate held and a higher one broke, at the geometric middle of that bracket,
  until it is narrower than ``precision`` or the level budget is spent.

When the twin placed the first rate (``predicted_rate_per_s``: the simulator's
sustained rate for these settings), the first level is just below the prediction and
the next, if it held, just above it (``precision`` apart), so a right prediction is
bracketed in two levels; the evidence-led steps take over where it was wrong, except
that a first level the twin placed that broke steps down by at most ``TWIN_MISS_STEP``
(the twin's own error), not by half (a halving leaves the last levels far below the
edge), and where both of the twin's levels held the next climbs by at most as much;
once a trial of the tune was measured, by as much as the twin was off it (``twin_step``:
at least two ``precision`` steps, so one more level closes the bracket).

Once the levels are spent or the bracket closed, its two ends are measured again with
other draws of the workload (``EDGE_DRAWS`` in all, ``draw_seed``): where the edge falls
moves with the draw (arrivals, conversations' lengths) by more than one window's
resamples see. A rate measured with several draws holds when their mean P(hold) does
(``pooled_verdicts``); where another draw broke the rate that held, the bracket moves
down and is measured between its new ends with every draw (``next_edge_draw``).

Each level is one schedule at its own rate: a warm-up, then its window, which opens
only once the server is steady at that rate and lasts long enough for the SLO's
percentiles (``tuner.serving.window``; multi-turn sessions are already under way from its
first second, ``workloads.stationary``). A level whose SLO is already clearly broken
stops early (``tuner.serving.live_server.StopRule``). A level that builds a backlog (its queue, KV usage
or TTFT trends up through its window, ``tuner.serving.backlog``) is a miss whatever its
percentiles say, and stops early once its queue clearly grows (``tuner.serving.live_server.WindowRule``).
Every level keeps its own directory with the load run's evidence (``window.json``,
``backlog.json``, ``turn_mix.json``, ``prompt_lengths.json``, ``metrics.csv``, ``client.json``).
A level whose load generator lagged past its bounds is measured again on its own with
more room for it (``tuner.search.client_retry``); one still lagging is unmeasurable:
neither a hold nor a break, and the search measures only below it (``client_ceiling``).

A level holds when it holds surely enough: its estimated probability of holding is at
least ``HOLD_MIN`` (0.9): the share of the resamples of its window's requests that meet
the SLO (``workloads.slo_bootstrap``) times the probability that its KV usage does not
fill the cache within a conversation (``tuner.serving.backlog.kv_trend``). A p99 that
passed by luck, at its limit, or a cache filling towards preemption that a short window
did not see reach it, does not make a goodput (``holds_surely``).

Rates are the workload's arrival rate (requests/s, or sessions/s for a multi-turn
workload); ``goodput`` is the request rate the best level offered, as measured, and
``goodput_of`` states it whole (``tuner.run.goodput.Goodput``): in the workload's own unit (conversations/s
where it has sessions), in requests/s and in output tokens/s, each the declared workload
at that rate (``Goodput.stated``: the same population in every unit). It is
the goodput only when a higher rate broke (``GoodputBound.BRACKETED``); a search that
never found a breaking rate within its budget knows only that the server holds at
least that much (``GoodputBound.LOWER_BOUND``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from tuner.run.evaluation import LevelRecord, level_hold_probability
from tuner.run.goodput import Goodput, GoodputBound, GoodputUnit
from tuner.search.client_retry import measure_with_honest_client
from tuner.search.level_evidence import write_level_evidence
from tuner.serving.bracket import RateBracket
from tuner.serving.level_schedule import CarryOn, drain_s, plan_level_schedule
from tuner.serving.live_server import LevelChain, LoadMeasurement, StopFactory, StopRule
from tuner.serving.load import SloVerdict, percentile_shares
from tuner.serving.server import LaunchSpec, TrialOutcome
from tuner.serving.window import LevelPlan, WindowOpening, held_until
from workloads.chain import LoadChain
from workloads.prompts import prompt_builder_for
from workloads.replay import pass_s
from workloads.schedule import ScheduledRequest
from workloads.slo import SloMetric
from workloads.spec import WorkloadSpec
from workloads.stationary import AnswerTimes, nearest_in_rate

log = logging.getLogger(__name__)

# The goodput's rule: a rate holds when its estimated probability of holding is at
# least this (``hold_probability``), not when one window did.
HOLD_MIN = 0.9
MAX_STEP = 2.0  # the largest climb from one level to the next (and the descent: halving)
# The largest step down from a first level the twin placed that broke: the twin's sustained
# rate has been 10 to 25% above what a trial measured where it missed
# (benchmarks/repeatability.md), so a miss of its rate is a near miss whatever a stopped
# level's few requests say; a second break steps by its own evidence (``descent_step``).
# Likewise the largest climb from both sides of the twin's rate where both held.
TWIN_MISS_STEP = 1.25
TWIN_STEP_LEVELS = 4  # the fewest levels a search steps by TWIN_MISS_STEP with
BRACKET_LEVELS = 2  # the levels that bracket a rate the twin placed right


def twin_step(off_share: float | None, precision: float) -> float:
    """The step from the twin's rate where the first level it placed broke, or where both
    of its levels held: as far as its goodput prediction for the tune's last measured
    trial was off what that trial measured (``off_share``: predicted / measured - 1),
    at least a bracket of two ``precision`` steps (one level more closes it), at most
    ``TWIN_MISS_STEP``; ``TWIN_MISS_STEP`` before any trial was measured. A twin fitted
    to this tune's trials misses by 5 to 9% (the default tune's 10-minute runs), and a
    bracket of 25% took two levels more to close than one of 10%."""
    if off_share is None:
        return TWIN_MISS_STEP
    return min(TWIN_MISS_STEP, max((1.0 + precision) ** 2, 1.0 + abs(off_share)))


# How many draws of the workload the bracket's ends are measured with (the edge draws):
# where the capacity falls moves with the draw (arrivals, conversation lengths) by more
# than one window's resamples see, so its ends are measured again with other draws and
# their P(hold) pooled (``pooled_hold``). 1: no edge draws. Four: a trial's own draws
# say how far its edge moves only with the prior of ``tuner.search.edge_posterior``, and
# its interval is within 8% for the repeatability runs' settings from four draws, not two
# (``benchmarks/repeatability.md``). A confirmation measures as many of them as fit.
EDGE_DRAWS = 4
# The draws a short budget keeps time for (``tuner.search.tune.edge_deadline_s``): the
# least that say how far the edge moves; the confirmation measures more where they fit.
LEAST_EDGE_DRAWS = 2
# Draw k of a workload is planned with its seed plus k times this: far from the seeds a
# user numbers repeats with (1, 2, 3...), so no two repeats share a draw.
DRAW_SEED_STRIDE = 1_000_003
# Where another draw broke the rate that held (the bracket moved down), how many rates
# more are measured with every draw: between its new ends, and below the lowest rate
# that broke where no rate measured holds over the draws.
EDGE_MIDDLES = 1
EDGE_STEPS_DOWN = 2
# On a chained run a level's schedule goes on this long past its longest window and
# drain (emulated seconds), so the server stays loaded at its rate while the next level
# is decided and planned, until that one takes over.
BRIDGE_S = 60.0


class RateLevel(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int
    rate_per_s: float  # the workload's arrival rate at this level
    met: bool
    measurement: LoadMeasurement
    wall_s: float | None = None  # from planning it to its evidence written, attempts included
    # The draw of the workload it measured: 0 the search's own, k > 0 an edge draw
    # (``EDGE_DRAWS``), planned with ``seed`` (None: the workload's own, not recorded).
    draw: int = 0
    seed: int | None = None

    @property
    def hold(self) -> float:
        """Its estimated P(hold), as its record states it (``level_hold_probability``)."""
        m = self.measurement
        return level_hold_probability(
            met=self.met, window_met=m.slo.met, stopped_early=m.stopped_early,
            stopped_by_backlog=m.stopped_by_backlog, backlog=m.backlog,
            hold_share=m.slo.hold_share,
        )  # fmt: skip

    @property
    def unmeasurable(self) -> bool:
        """Its client lagged in every attempt (``tuner.search.client_retry``): neither a
        hold nor a break; the search treats it as missing."""
        client = self.measurement.client
        return client is not None and client.unmeasurable

    @classmethod
    def of_record(cls, record: LevelRecord, index: int) -> RateLevel:
        """A level measured on an earlier launch of the same settings, from its record (a
        confirmation's ``prior``): what the search's verdicts, pooling and interval read of
        it (its rate, draw, verdict, P(hold), how it ended, its client and load, its window's
        opening where its ``window.json`` reads). No wall seconds: a level's length on this
        launch is estimated from this launch's own."""
        m = LoadMeasurement(
            out_dir=record.dir, outcome=TrialOutcome.READY, load=record.load,
            slo=SloVerdict(
                met=record.met if record.window_met is None else record.window_met,
                violations=list(record.violations), hold_share=record.hold_share,
            ),
            client=record.client, stopped_early=record.stopped_early, backlog=record.backlog,
            stopped_by_backlog=record.stopped_by_backlog, window=WindowOpening.read(Path(record.dir)),
        )  # fmt: skip
        return cls(
            index=index, rate_per_s=record.rate_per_s, met=record.met, measurement=m,
            draw=record.draw, seed=record.seed,
        )  # fmt: skip


class RateSearch(BaseModel):
    """The levels measured on one server, and what they come to."""

    model_config = ConfigDict(frozen=True)

    levels: tuple[RateLevel, ...]
    best: RateLevel | None  # the highest rate whose SLOs held
    broken_rate_per_s: float | None  # the lowest rate whose SLOs broke
    died: bool  # the engine died under load

    @property
    def goodput(self) -> float:
        """Requests/s the best level offered (0 when no level met the SLOs); for a trace
        replay measured on its busiest stretch, the trace's mean rate at that level (the
        stretch offered more: the rate is what a pass of the trace averages)."""
        if self.best is None:
            return 0.0
        load = self.best.measurement.load
        offered = load.offered_rate or load.request_throughput
        return offered * self._stretch_share()

    @property
    def throughput(self) -> float:
        """Output tokens/s the best level's window counted (over a pass for a trace
        replay's stretch): its served requests' tokens, those cut at the run's end as far as
        they got, per second of the window and its drain (the goodput's: ``goodput_of``)."""
        if self.best is None:
            return 0.0
        return self.best.measurement.load.output_token_throughput * self._stretch_share()

    def _stretch_share(self) -> float:
        """The trace's mean rate over what its window offered: 1 unless the best level's
        window held only a trace replay's busiest stretch (``workloads.replay``)."""
        assert self.best is not None
        window = self.best.measurement.window
        offered = self.best.measurement.load.offered_rate
        if window is None or window.trace_pass_s is None or not offered:
            return 1.0
        if window.window_s >= window.trace_pass_s - 1e-6:
            return 1.0
        return self.best.rate_per_s / offered

    def goodput_of(self, spec: WorkloadSpec) -> Goodput:
        """The goodput in ``spec``'s unit: for sessions the best level's arrival rate (the
        records hold requests, not sessions, so the sessions/s the level was sent at),
        else the requests/s it offered, as measured; in requests/s and output tokens/s the
        declared workload's at that rate (``Goodput.stated``), not the window's draw of it
        (``goodput``, ``throughput``): the same population in every unit."""
        unit = GoodputUnit.of(spec)
        if self.best is None:
            return Goodput(unit=unit)
        arrivals = self.best.rate_per_s if unit is GoodputUnit.CONVERSATIONS_PER_S else self.goodput
        return Goodput.stated(
            spec, arrival_rate_per_s=arrivals, bound=self.bound,
            measured_output_tokens_per_request=self.best.measurement.load.output_tokens_per_completed,
        )  # fmt: skip

    @property
    def bound(self) -> GoodputBound:
        """BRACKETED when a level above the best one broke, LOWER_BOUND when none did."""
        best = self.best
        if best is None:
            return GoodputBound.NONE
        broke_above = any(
            not held and rate > best.rate_per_s for rate, held in pooled_verdicts(self.levels)
        )
        return GoodputBound.BRACKETED if broke_above else GoodputBound.LOWER_BOUND


def goodput_text(goodput: float, bound: GoodputBound, unit: str = "req/s") -> str:
    """A goodput as the terminal says it: "12.50 req/s", or "at least 12.50 req/s (no
    breaking rate found)" when the search found no rate above it that broke."""
    if bound.is_lower_bound:
        return f"at least {goodput:.2f} {unit} (no breaking rate found)"
    return f"{goodput:.2f} {unit}"


def measured_answer_times(m: LoadMeasurement) -> AnswerTimes | None:
    """The mean TTFT and TPOT a level measured (the schedule's seconds)."""
    return AnswerTimes.of_means(m.load.ttft_ms.mean, m.load.tpot_ms.mean)


def nearest_answer_times(
    levels: list[RateLevel], rate_per_s: float | None, fallback: AnswerTimes | None
) -> AnswerTimes | None:
    """The answer times to plan a level at ``rate_per_s`` with: those of the level that
    held nearest to it in rate (a level that broke measured a backlog's latencies), else
    ``fallback`` (the twin's)."""
    held = {
        lv.rate_per_s: t for lv in levels if lv.met and (t := measured_answer_times(lv.measurement))
    }
    if not rate_per_s:
        return fallback
    return nearest_in_rate(held, rate_per_s) or fallback


def stop_rule(spec: WorkloadSpec, expected_requests: int, time_scale: float) -> StopRule | None:
    """Stop a level once more requests missed the TTFT objective than twice its allowance."""
    ttft = [o for o in spec.slo.objectives() if o.metric is SloMetric.TTFT]
    if not ttft:
        return None
    tightest = min(ttft, key=lambda o: o.limit_ms)
    allowance = (100 - tightest.percentile) / 100.0
    max_bad = math.ceil(2 * allowance * expected_requests) + 2
    return StopRule(
        tightest.limit_ms, time_scale=time_scale, max_bad=max_bad, bad_fraction=2 * allowance
    )


def correlation_floor(levels: list[RateLevel], rate_per_s: float | None) -> float | None:
    """The longest correlation time of the server's state that a level which held at or
    below ``rate_per_s`` measured over its window (None: none has). Toward capacity the
    server's memory lengthens (its excursions grow and last), so a level above one that
    held needs at least as long a memory's worth of window; a short window of its own
    reads it short."""
    if rate_per_s is None:
        return None
    times = [
        lv.measurement.window.correlation_s
        for lv in levels
        if lv.met
        and lv.rate_per_s <= rate_per_s
        and lv.measurement.window is not None
        and lv.measurement.window.correlation_s is not None
    ]
    return max(times) if times else None


def planned_requests(plan: LevelPlan, schedule: list[ScheduledRequest]) -> int:
    """The requests a level sends by the end of its longest warm-up and shortest window
    (its schedule runs on to the longest window, ``tuner.serving.window``); a level
    carried on from the one before also serves the conversations carried into it, which
    its own schedule does not hold: then its planned request rate over that time."""
    until_s = plan.warmup_max_s + plan.window_s
    own = sum(1 for r in schedule if r.send_s < until_s)
    if plan.carried_on is None:
        return own
    return max(own, math.ceil(plan.requests_per_s * until_s))


def ends_clean(m: LoadMeasurement) -> bool:
    """Whether a level leaves its server in the steady state of its rate, so the next
    level can carry on from it: not stopped early (a queue, the SLO clearly broken), no
    backlog built, the engine alive. Otherwise the next level starts a fresh run on a
    server its load generator's stop has drained."""
    growing = m.backlog is not None and m.backlog.growing
    return not (m.stopped_early or m.stopped_by_backlog or growing) and (
        m.outcome is TrialOutcome.READY
    )


def hold_probability(m: LoadMeasurement) -> float | None:
    """The level's estimated probability of holding: the share of the resamples of its
    window that meet the SLO (``workloads.slo_bootstrap``) times the probability that KV
    usage does not fill the cache within its horizon (``tuner.serving.backlog.kv_trend``).
    None without the share."""
    if m.slo.hold_share is None:
        return None
    kv = m.backlog.kv_stays if m.backlog is not None else 1.0
    return m.slo.hold_share * kv


def holds_surely(m: LoadMeasurement) -> bool:
    """The goodput's rule: the level's estimated probability of holding
    (``hold_probability``) is at least ``HOLD_MIN``; a level without it holds by its
    verdict alone."""
    p = hold_probability(m)
    return p is None or p >= HOLD_MIN


def hold_rule_miss(m: LoadMeasurement) -> str | None:
    """Why a window that met the SLO, with no backlog, does not count as holding; or None."""
    p = hold_probability(m)
    if not m.slo.met or p is None or p >= HOLD_MIN:
        return None
    share = m.slo.hold_share or 0.0
    why = f"the SLO held in {share:.0%} of the window's resamples"
    if m.backlog is not None and m.backlog.kv_usage.p_full is not None:
        kv = m.backlog.kv_usage
        why += f", KV usage fills the cache within {kv.horizon_s or 0:.0f} s with {kv.p_full:.0%}"
    return f"P(hold) {p:.2f} ({why}); the rule: at least {HOLD_MIN:.2f}"


def level_met(m: LoadMeasurement) -> bool:
    """The SLOs held over the whole window surely enough (``holds_surely``), and the
    level ended clean (``ends_clean``: the engine lived and no backlog built up)."""
    return m.slo.met and holds_surely(m) and ends_clean(m)


def pooled_hold(levels: Sequence[RateLevel]) -> float:
    """The P(hold) of one rate over its draws (``RateLevel.hold``): their mean, the
    probability that a draw of the declared workload holds there (its steady state
    includes its randomness). Each draw measured more than once counts as its mean."""
    by_draw: dict[int, list[float]] = {}
    for lv in levels:
        by_draw.setdefault(lv.draw, []).append(lv.hold)
    return sum(sum(p) / len(p) for p in by_draw.values()) / len(by_draw)


def pooled_verdicts(levels: Sequence[RateLevel]) -> list[tuple[float, bool]]:
    """(rate, held) of every rate measured, in the order first measured, of the levels that
    count (an unmeasurable level is missing): a rate measured with one draw holds as its
    level did (``level_met``); one measured with several, when their pooled P(hold)
    (``pooled_hold``) is at least ``HOLD_MIN`` and no draw ended with a backlog."""
    by_rate: dict[float, list[RateLevel]] = {}
    for lv in levels:
        if not lv.unmeasurable:
            by_rate.setdefault(lv.rate_per_s, []).append(lv)
    verdicts = []
    for rate, at in by_rate.items():
        if len({lv.draw for lv in at}) == 1:
            held = all(lv.met for lv in at)
        else:
            held = pooled_hold(at) >= HOLD_MIN and all(ends_clean(lv.measurement) for lv in at)
        verdicts.append((rate, held))
    return verdicts


def bracket(levels: list[RateLevel]) -> tuple[RateLevel | None, RateLevel | None]:
    """The best level that held, and the lowest level above it that broke (or killed the
    engine); with no level held, the lowest level that broke (``RateBracket``'s ends),
    each rate as its draws pooled say (``pooled_verdicts``): of a rate's levels, the
    first measured that held (the best) or broke (the lowest above it)."""
    rates = _rates(levels, 0.0)
    counted = [lv for lv in levels if not lv.unmeasurable]
    at_low = [lv for lv in counted if lv.rate_per_s == rates.low]
    low = next((lv for lv in at_low if lv.met), at_low[0] if at_low else None)
    at_high = [lv for lv in counted if lv.rate_per_s == rates.high]
    high = next((lv for lv in at_high if not lv.met), at_high[0] if at_high else None)
    return low, high


def _rates(levels: list[RateLevel], precision: float) -> RateBracket:
    """The bracket of the levels that count (an unmeasurable level is missing), each rate
    held or broken over its draws (``pooled_verdicts``)."""
    return RateBracket(precision, pooled_verdicts(levels))


def edge_levels(edge_draws: int, max_levels: int) -> int:
    """The levels the edge draws usually add to a search of ``max_levels``: the bracket's
    two ends once more per draw beyond the first (a bracket needs two levels; where another
    draw broke the rate that held, up to ``EDGE_MIDDLES`` and ``EDGE_STEPS_DOWN`` rates
    more with every draw)."""
    return 2 * (edge_draws - 1) if max_levels > 1 else 0


def draw_seed(spec: WorkloadSpec, draw: int) -> int:
    """The seed draw ``draw`` of ``spec`` is planned with (draw 0: the spec's own)."""
    return spec.seed + draw * DRAW_SEED_STRIDE


def next_edge_draw(
    levels: list[RateLevel], draws: int, precision: float, *, moved: bool
) -> tuple[float, int] | None:
    """The next edge draw to measure, (rate, draw), or None: each end of the bracket
    (the best rate that held, the lowest above it that broke) with ``draws`` draws, one
    draw at both ends (the lower first) before the next draw (a deadline that cuts the
    draws short leaves each measured draw at both ends); then, where another draw broke
    the rate that held (``moved``: the bracket moved down, a new rate may be measured),
    the geometric middle of the new bracket with all of them while it is wider than
    ``precision``, or where no rate measured below holds over the draws, a rate
    ``1 + 2 * precision`` below the lowest that broke. Nothing where the search's own
    levels had no bracket (a lower bound, or no rate held: no edge to measure again)."""
    rates = _rates(levels, precision)
    low, high = rates.low, rates.high
    if high is None or draws < 2:
        return None
    for draw in range(draws):  # a draw at both ends before the next: a cut leaves pairs
        for rate in (low, high):
            have = {lv.draw for lv in levels if lv.rate_per_s == rate and not lv.unmeasurable}
            if rate is not None and draw not in have:
                return rate, draw
    if not moved:
        return None
    if low is None:
        return high / (1.0 + 2.0 * precision), 0
    return None if rates.closed else (math.sqrt(low * high), 0)


def client_ceiling(levels: list[RateLevel]) -> float | None:
    """The lowest rate its client could not keep up with (None: it kept up everywhere): a
    higher rate asks more of it, so the search measures only below it."""
    return min((lv.rate_per_s for lv in levels if lv.unmeasurable), default=None)


def _next_rate(
    levels: list[RateLevel], precision: float, *, up: float, down: float
) -> float | None:
    """The bracket's next rate over the levels that count (``RateBracket.next_rate``), kept
    below the lowest rate the client could not keep up with (``client_ceiling``): None
    where it would reach it; with no level counted yet, a step down from it."""
    rates = _rates(levels, precision)
    ceiling = client_ceiling(levels)
    if not rates.tried:
        return None if ceiling is None else ceiling / MAX_STEP
    rate = rates.next_rate(up=up, down=down)
    if rate is None or (ceiling is not None and rate >= ceiling):
        return None
    return rate


def climb_step(spec: WorkloadSpec, m: LoadMeasurement, growth: float) -> float:
    """The factor from a level that held to the next rate while none has broken: what its
    evidence allows, between ``growth`` and ``max(MAX_STEP, growth)``.

    * an SLO percentile at a share f of its limit allows 1/sqrt(f) (x2 at a quarter of
      the limit, x1.41 at half, ``growth`` past about three quarters): latency stays flat
      below the knee and climbs steeply near it, so its headroom is read cautiously;
    * a peak KV-cache usage u allows 1/u: below the knee the cache holds about rate x
      time in flight, linear in the rate; so does the KV usage the backlog guard
      projects a conversation ahead (``tuner.serving.backlog.kv_trend``), where a chat
      server's cache is still filling when a window closes;
    * a level that preempted is at the edge of its memory: ``growth``.
    """
    top = max(MAX_STEP, growth)
    server = m.server
    if server is not None and server.num_preemptions > 0:
        return growth
    allowed = min([top, *(1.0 / math.sqrt(share) for share in percentile_shares(spec, m.load))])
    if server is not None and server.max_kv_cache_usage:
        allowed = min(allowed, 1.0 / server.max_kv_cache_usage)
    projected = m.backlog.kv_usage.projected if m.backlog is not None else None
    if projected is not None and projected > 0.0:
        allowed = min(allowed, 1.0 / projected)
    return min(top, max(growth, allowed))


def descent_step(spec: WorkloadSpec, m: LoadMeasurement, growth: float) -> float:
    """The factor down from a level that broke while none has held, between ``growth``
    (it barely missed) and ``max(MAX_STEP, growth)`` (halving):

    * sqrt of how far its worst percentile went past its limit (x1/2 at four times it);
    * 1/(1 - e) when a share e of its requests failed: an overloaded server serves about
      its capacity and the excess queues until it times out, so capacity ~ rate x (1 - e);
    * halving when the level stopped early: how far it would have missed is unknown.
    """
    top = max(MAX_STEP, growth)
    if m.stopped_early:
        return top
    load = m.load
    failed = load.num_errors / load.num_requests if load.num_requests else 0.0
    needed = [math.sqrt(share) for share in percentile_shares(spec, m.load)]
    needed.append(1.0 / (1.0 - failed) if failed < 1.0 else top)
    return min(top, max(growth, *needed))


class LevelServer(Protocol):
    """What the search measures on: ``tuner.serving.live_server.LiveServer``, or a stand-in in tests."""

    launch: LaunchSpec
    time_scale: float

    def measure(
        self,
        workload: WorkloadSpec,
        schedule: list[ScheduledRequest],
        *,
        out_dir: Path,
        stop_when: StopFactory | None = None,
        drain_s: float | None = None,
        level: LevelPlan | None = None,
        chain: LevelChain | None = None,
    ) -> LoadMeasurement: ...


def search_rate(
    live: LevelServer,
    spec: WorkloadSpec,
    *,
    start_rate_per_s: float | None,
    out_dir: Path,
    level_duration_s: float | None = None,
    level_max_duration_s: float | None = None,
    max_levels: int = 4,
    growth: float = 1.15,
    precision: float = 0.05,
    model_dir: Path | None = None,
    predicted_rate_per_s: float | None = None,
    warmup_s: float | None = None,
    predicted_answer_times: AnswerTimes | None = None,
    chain: Callable[[Path], LoadChain | None] | None = None,
    start_held: bool = False,
    edge_draws: int = EDGE_DRAWS,
    deadline: float | None = None,
    twin_off_share: float | None = None,
    extra_deadline: float | None = None,
    prior: Sequence[LevelRecord] = (),
) -> RateSearch:
    """Measure levels on a READY server until the goodput is bracketed to ``precision``
    or ``max_levels`` are spent (then ``RateSearch.bound`` says what it found).

    ``level_max_duration_s``: the longest a sized window is held on (``plan_level``).
    ``level_duration_s``, ``warmup_s``: a fixed window and warm-up per level instead of
    a window sized for the SLO's percentiles opening once the server is steady
    (``tuner.serving.window.plan_level``). ``growth`` is the smallest step from one
    level to the next (``climb_step`` up from a level that held, ``descent_step`` down
    from a first one that broke: at most x2). ``predicted_rate_per_s``: the twin's
    sustained rate; the first two levels straddle it (the module's docstring).
    ``predicted_answer_times``: the twin's answer times near that rate, which plan the
    session population a level opens on until a level has held (``nearest_answer_times``).
    ``chain``: makes a chained run on the server (``LiveServer.chain``): each level after
    the first carries on from the one before on it (``CarryOn``), without draining the
    server to empty, unless that one ended unclean (``ends_clean``); then the next level
    starts a fresh run. None: every level is a run of its own. ``start_held``: these
    settings held at ``start_rate_per_s`` or above before (a confirmation of a trial), so
    a first level that breaks there steps down by ``growth`` only: the earlier hold puts
    the capacity near, and a collapse's share of failed requests (``descent_step``)
    would overstate how far below it lies. A first level the twin placed that breaks steps
    down by at most ``TWIN_MISS_STEP`` (its prediction's error) where ``max_levels`` leaves
    the levels to come back from a far miss (``TWIN_STEP_LEVELS``; with fewer, it halves).
    A second break steps by its own evidence. ``twin_off_share``: how far the twin's
    goodput prediction for the tune's last measured trial was off (``twin_step``: the
    step from its rate is that error, not ``TWIN_MISS_STEP``, where it is smaller).

    ``edge_draws``: once the level budget is spent or the bracket closed, its two ends are
    measured again with other draws of the workload (``draw_seed``) up to this many in all,
    beyond ``max_levels``, and every rate measured with several draws holds by their pooled
    P(hold) (``pooled_verdicts``); where another draw broke the rate that held, the new
    bracket's middle is measured with every draw (``next_edge_draw``). Not for a replayed
    trace (its arrivals are the trace's, whatever the seed) or a closed-loop workload.

    ``deadline`` (``time.monotonic()``): no level after the first starts unless it ends
    before it, taken to last as long as the longest so far (``_ends_in_time``): a plan's
    level count rests on the levels' expected seconds, which a slower clock after a lag
    or a level measured again outgrows. ``extra_deadline``: levels past the first
    ``BRACKET_LEVELS`` (and the edge draws) end before it too (a tune's budget that holds
    fewer trials than asked: ``TrialLoop._extra_deadline_s``).

    ``prior``: the levels a trial of the same settings measured on its own launch (a
    confirmation that pools its trial's draws, ``tuner.search.recommend``). The search
    then measures no levels of its own draw: it measures the edge draws its trial had not
    (``edge_draws`` in all) at the trial's bracket, and where another draw breaks the rate
    that held, the new bracket with every draw, on this launch; its verdicts, goodput and
    interval pool the trial's levels with them. Its own levels are numbered from 0, and
    of a rate held with several draws its best is its own level there where one held."""
    levels: list[RateLevel] = [RateLevel.of_record(r, i) for i, r in enumerate(prior)]
    later = deadline if extra_deadline is None else min(deadline or math.inf, extra_deadline)
    closed = spec.mean_rate_per_s is None
    rate: float | None = None
    if not closed:
        rate = start_rate_per_s or spec.mean_rate_per_s
        if predicted_rate_per_s:
            rate = predicted_rate_per_s / math.sqrt(1.0 + precision)
    died = False
    # The twin's rate is taken as near (its error the step) only with the levels to come
    # back from a far miss: with fewer, a miss halves, so the trial ends on a rate that held.
    # A confirmation (``start_held``) starts where its trial held: its rate is near too.
    near = bool(predicted_rate_per_s) and (max_levels >= TWIN_STEP_LEVELS or start_held)
    step = TWIN_MISS_STEP if start_held else twin_step(twin_off_share, precision)
    runs = _ChainedRuns(chain, out_dir)
    knobs = _LevelKnobs(
        window_s=level_duration_s, warmup_s=warmup_s, window_max_s=level_max_duration_s,
        model_dir=model_dir, answer_times=predicted_answer_times,
    )  # fmt: skip
    try:
        for index in range(0 if prior else 1 if closed else max_levels):
            ends_by = deadline if index < BRACKET_LEVELS else later
            if not _ends_in_time(levels, ends_by):
                break
            began = time.monotonic()
            one = _OneLevel(
                live, spec, rate, index=index, levels=levels, runs=runs, knobs=knobs,
                deadline=ends_by,
            )  # fmt: skip
            m = measure_with_honest_client(live, one.measure, out_dir / f"level-{index}")
            level_spec, schedule = one.level_spec, one.schedule
            runs.sent(schedule, clean=ends_clean(m))
            level = _record_level(index, rate, m, runs.requests(schedule), level_spec, model_dir)
            wall_s = time.monotonic() - began
            levels.append(level.model_copy(update={"seed": spec.seed, "wall_s": wall_s}))
            if m.outcome is not TrialOutcome.READY:
                died = True
                break
            if rate is None:
                break
            low, high = bracket(levels)
            if low is not None and high is None and predicted_rate_per_s and index == 0:
                rate = low.rate_per_s * (1.0 + precision)  # the twin's other side
                continue
            # up from a level that held by what it allows; down from the lowest that broke
            # by how far it missed; else the bracket's middle, until it closes
            up = climb_step(spec, low.measurement, growth) if low is not None else 1.0
            down = descent_step(spec, high.measurement, growth) if high is not None else 1.0
            if start_held and index == 0 and low is None:
                down = growth  # the next break steps down by its own evidence
            elif near and index == 0 and low is None:
                down = min(down, step)  # a near miss of the twin's rate
            elif near and index == 1 and high is None:
                up = min(up, step)  # both sides of the twin's rate held: near

            rate = _next_rate(levels, precision, up=up, down=down)
            if rate is None:
                break
        if not died and not closed and pass_s(spec) is None:
            died = _measure_edge_draws(
                live, spec, levels, runs, knobs, edge_draws, precision, later,
                numbered_from=len(prior),
            )  # fmt: skip
    finally:
        runs.close()
    low, high = bracket(levels)
    if low is not None and prior:
        own = [lv for lv in levels[len(prior) :] if lv.rate_per_s == low.rate_per_s and lv.met]
        low = own[0] if own else low
    return RateSearch(
        levels=tuple(levels), best=low, broken_rate_per_s=high.rate_per_s if high else None,
        died=died,
    )  # fmt: skip


def _measure_edge_draws(
    live: LevelServer,
    spec: WorkloadSpec,
    levels: list[RateLevel],
    runs: _ChainedRuns,
    knobs: _LevelKnobs,
    draws: int,
    precision: float,
    deadline: float | None = None,
    *,
    numbered_from: int = 0,
) -> bool:
    """Measure the edge draws (``next_edge_draw``) after the search's levels, each a level
    of its own (numbered on from them, less ``numbered_from``: the levels measured on an
    earlier launch, ``search_rate``'s ``prior``) planned with its draw's seed; True when
    the engine died under one. The two ends' other draws; where the bracket moved, the new lower
    end's, and with every draw at most ``EDGE_MIDDLES`` rates between its new ends and
    ``EDGE_STEPS_DOWN`` below them (where no rate measured holds over the draws)."""
    held_before = _rates(levels, precision).low
    if held_before is None:
        return False  # no edge: nothing held
    middles = steps = 0
    while True:
        low = _rates(levels, precision).low
        more = middles < EDGE_MIDDLES if low is not None else steps < EDGE_STEPS_DOWN
        edge = next_edge_draw(levels, draws, precision, moved=low != held_before and more)
        if edge is None:
            return False
        rate, draw = edge
        if not _ends_in_time(levels, deadline):
            return False
        if draw == 0 and low is None:
            steps += 1
        elif draw == 0:
            middles += 1
        drawn = spec.model_copy(update={"seed": draw_seed(spec, draw)})
        index = len(levels) - numbered_from
        began = time.monotonic()
        one = _OneLevel(
            live, drawn, rate, index=index, levels=levels, runs=runs, knobs=knobs,
            deadline=deadline,
        )  # fmt: skip
        m = measure_with_honest_client(live, one.measure, runs.out_dir / f"level-{index}")
        runs.sent(one.schedule, clean=ends_clean(m))
        level = _record_level(
            index, rate, m, runs.requests(one.schedule), one.level_spec, knobs.model_dir
        )
        wall_s = time.monotonic() - began
        levels.append(level.model_copy(update={"draw": draw, "seed": drawn.seed, "wall_s": wall_s}))
        if m.outcome is not TrialOutcome.READY:
            return True
    return False


def _own_wall_s(level: RateLevel) -> float:
    """A level's wall seconds less its attempts set aside because its client lagged (the
    next level runs with what changed after them: a slower clock, more load processes)."""
    client = level.measurement.client
    return max(0.0, (level.wall_s or 0.0) - (client.set_aside_s if client is not None else 0.0))


def _ends_in_time(levels: Sequence[RateLevel], deadline: float | None) -> bool:
    """Whether another level, as long as the longest of ``levels`` (``_own_wall_s``), ends before
    ``deadline`` (``time.monotonic()``; None, or no level yet: it does)."""
    if deadline is None or not levels:
        return True
    longest_s = max(_own_wall_s(level) for level in levels)
    if time.monotonic() + longest_s <= deadline:
        return True
    log.info(
        "no further level: one takes ~%.0f s and %.0f s are left before its deadline",
        longest_s, max(0.0, deadline - time.monotonic()),
    )  # fmt: skip
    return False


@dataclasses.dataclass(frozen=True)
class _LevelKnobs:
    """What plans every level of a search alike (``search_rate``'s arguments)."""

    window_s: float | None
    warmup_s: float | None
    window_max_s: float | None
    model_dir: Path | None
    answer_times: AnswerTimes | None


class _OneLevel:
    """Plans and measures level ``index`` of a search at ``rate``; ``measure(again=True)``
    measures it again as a run of its own, from an empty server (its client lagged,
    ``tuner.search.client_retry``): the chained run, if any, is closed and the level
    planned without carrying on from the one before."""

    def __init__(
        self, live: LevelServer, spec: WorkloadSpec, rate: float | None, *, index: int,
        levels: list[RateLevel], runs: _ChainedRuns, knobs: _LevelKnobs,
        deadline: float | None = None,
    ) -> None:  # fmt: skip
        self.live, self.spec, self.rate, self.index = live, spec, rate, index
        self.levels, self.runs, self.knobs = levels, runs, knobs
        self.deadline = deadline  # its window is held on no later (``held_until``)
        self.level_spec = spec
        self.schedule: list[ScheduledRequest] = []

    def measure(self, again: bool) -> LoadMeasurement:
        live, spec, rate, levels, k = self.live, self.spec, self.rate, self.levels, self.knobs
        if again:
            self.runs.close()
        level_chain, carry_on = self.runs.for_level(self.index, levels, rate, fresh=again)
        level_spec, plan, schedule = plan_level_schedule(
            spec, rate, window_s=k.window_s, warmup_s=k.warmup_s, window_max_s=k.window_max_s,
            correlation_floor_s=correlation_floor(levels, rate),
            max_model_len=live.launch.params.max_model_len, model_dir=k.model_dir,
            answer_times=nearest_answer_times(levels, rate, k.answer_times),
            carry_on=carry_on,
            bridge_s=drain_s(spec) + BRIDGE_S if level_chain is not None else 0.0,
        )  # fmt: skip
        if level_chain is not None and carry_on is not None and rate:
            level_chain.keep_under_way = carry_on.keep_under_way(rate)
        if self.deadline is not None and not getattr(live, "virtual_clock", False):
            left_s = self.deadline - time.monotonic()
            plan = held_until(plan, left_s, live.time_scale, drain_s(level_spec))
        self.level_spec, self.schedule = level_spec, schedule
        return live.measure(
            level_spec, schedule, out_dir=self.runs.out_dir / f"level-{self.index}",
            stop_when=stop_rule(level_spec, planned_requests(plan, schedule), live.time_scale),
            drain_s=drain_s(level_spec), level=plan, chain=level_chain,
        )  # fmt: skip


class _ChainedRuns:
    """The chained runs of one search (``search_rate``'s ``chain``): the run the next level
    joins, a fresh one after a level that ended unclean, and every request sent on the
    current run (a level's window also measures the conversations carried into it)."""

    def __init__(self, make: Callable[[Path], LoadChain | None] | None, out_dir: Path) -> None:
        self.make = make
        self.out_dir = out_dir
        self.current: LevelChain | None = None
        self.runs = 0
        self.carry = False  # the last level ended clean on the current run
        self.sent_on_run: dict[str, ScheduledRequest] = {}

    def for_level(
        self, index: int, levels: list[RateLevel], rate: float | None, *, fresh: bool = False
    ) -> tuple[LevelChain | None, CarryOn | None]:
        """The run level ``index`` goes on, and how it carries on from the level before
        (None: it opens the run, from an empty server); ``fresh``: a run of its own, not
        chained (a level measured again because its client lagged)."""
        if self.make is None or rate is None or fresh:
            return None, None
        if self.current is not None and self.carry and levels:
            return self.current, CarryOn(
                from_rate_per_s=levels[-1].rate_per_s, id_prefix=f"L{index}."
            )
        self.close()
        load = self.make(self.out_dir / f"chain-{self.runs}")
        self.runs += 1
        self.current = LevelChain(load) if load is not None else None
        return self.current, None

    def sent(self, schedule: list[ScheduledRequest], *, clean: bool) -> None:
        """A level was sent on the current run (kept without its texts: a later window's
        evidence needs only the turns and prompt lengths); ``clean``: ``ends_clean``."""
        if self.current is not None:
            self.sent_on_run.update(
                (r.request_id, dataclasses.replace(r, messages=None, prompt=None)) for r in schedule
            )
        self.carry = clean

    def requests(self, schedule: list[ScheduledRequest]) -> list[ScheduledRequest]:
        """Every request the level's window could have measured: its own, and on a chained
        run those of the levels before it on that run (without their texts)."""
        return list(self.sent_on_run.values()) if self.current is not None else schedule

    def close(self) -> None:
        if self.current is not None:
            self.current.load.close(raise_error=False)
        self.current = None
        self.carry = False
        self.sent_on_run = {}


def _record_level(
    index: int,
    rate: float | None,
    m: LoadMeasurement,
    schedule: list[ScheduledRequest],
    level_spec: WorkloadSpec,
    model_dir: Path | None,
) -> RateLevel:
    """A measured level, its evidence written to its directory: the requests its window
    measured (``schedule``: those it could have) against the workload's stationary mix."""
    measured = schedule
    if m.measured_ids:  # what was sent in it (a later turn goes at its answer's time)
        ids = set(m.measured_ids)
        measured = [r for r in schedule if r.request_id in ids]
    elif m.window is not None:  # a stand-in server: what was planned in it
        opened, until = m.window.opened_at_s, m.window.opened_at_s + m.window.window_s
        measured = [r for r in schedule if opened <= r.send_s < until]
    write_level_evidence(
        Path(m.out_dir), measured, level_spec, prompt_builder=prompt_builder_for(model_dir)
    )
    # A level its client could not keep up with counts neither way (``RateLevel.unmeasurable``).
    met = level_met(m) and not (m.client is not None and m.client.unmeasurable)
    return RateLevel(index=index, rate_per_s=rate or 0.0, met=met, measurement=m)
