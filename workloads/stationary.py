"""The stationary population of multi-turn sessions, and the turn mix a window holds.

A window that opens on an empty server sees only first turns for as long as a
conversation lasts (a minute for the built-in ``chat``): no later turns, no history,
no prefix reuse. With ``sessions.start: stationary`` (what rate-search levels use)
``workloads.build.build_schedule`` opens the schedule on the conversations a server
sees after hours of that traffic:

* sessions arrive before offset 0 as a Poisson process at the rate in effect at
  offset 0 (``lead_rate_per_s``), over a look-back of the longest session's planned
  length (``lookback_s``: most turns, each after the longest expected service and
  the think time, the same expected times the builder spaces turns with), so no
  session that could still be under way is missed;
* each is planned exactly as an arrival in the window is (its own random streams,
  ids ``<name>-lead-<n>-<turn>``, ``turn`` its true turn number); its turns planned
  before offset 0 are not sent, those at or after it are, each prompt carrying the
  whole history of the earlier (unsent) turns, as a later turn always does.

The window's turns and history lengths then have their stationary distribution
from its first second: for arrivals at a constant rate, turn k (0 first) is
``P(N > k) / E[N]`` of the requests, N a session's number of turns
(``stationary_turn_mix``). Sessions cut short by ``max_context_tokens`` shift that
mix slightly towards early turns; it is exact without the cut.

The population's size depends on the server's speed: a session under way at offset 0
is one whose remaining turns, each an answer and a think time apart, reach past it, so
a fast server holds fewer of them than a slow one (Little's law: sessions under way =
arrival rate x mean session length). The builder spaces turns by the spec's
``expected_ttft_s`` and ``expected_tpot_s``; planned with answers slower than the
server's, the window opens on more sessions than that server holds, and since their
later turns follow the server's (faster) answers, the surplus loads the window until
those sessions end, up to a session's length. ``AnswerTimes`` replaces them with the
answer times of the server measured (the rate search: its nearest level that held; the
twin: its own run at a nearby rate).

What the server sees: the history of a session under way is sent in full, but the
server never saw its earlier turns, so their prefix is not in its cache when the
window opens. The first in-window turn of each such session is a cache miss on its
history (the prefill a server does after a restart or a cache eviction); its next
turn, one answer and think time later, hits. The cache reaches its stationary state
within about one turn gap (``think_time_s`` plus an answer); a warm-up of that
length (``WarmupSpec.duration_s``), when a spec has one, covers it.

``turn_mix`` measures it for a schedule: its measured requests' share per turn
number against the stationary mix, with a chi-square goodness-of-fit test
(``chi2_sf``, closed form), and the share of later turns.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from workloads.lengths import TraceColumn, mean_length, trace_column
from workloads.schedule import ScheduledRequest
from workloads.spec import (
    ClosedArrival,
    DiurnalArrival,
    FixedLength,
    GammaArrival,
    LengthSpec,
    LognormalLength,
    MixtureLength,
    PoissonArrival,
    RampArrival,
    SessionSpec,
    TraceArrival,
    TraceLength,
    TurnsSpec,
    UniformLength,
    WorkloadSpec,
    read_trace_ref,
)
from workloads.think import longest_think_s, mean_think_s
from workloads.traces import TraceRecord

TURN_MIX_FILE = "turn_mix.json"  # written beside each level's evidence
_TAIL_Z = 6.0  # an unbounded lognormal is taken to end here (P(beyond) ~ 1e-9)
_MIN_EXPECTED = 5.0  # chi-square bins hold at least this many expected requests


# --- the population before the window ---------------------------------------------------


class AnswerTimes(BaseModel):
    """A server's mean time to first token and time per output token at some rate, in
    the schedule's seconds: what a session's turn gaps are planned with
    (``SessionSpec.expected_ttft_s`` and ``expected_tpot_s``)."""

    model_config = ConfigDict(frozen=True)

    ttft_s: float
    tpot_s: float

    @classmethod
    def of_means(cls, ttft_ms: float | None, tpot_ms: float | None) -> AnswerTimes | None:
        """From measured means in ms; None when either is missing or not positive (no
        request streamed, a one-token workload)."""
        if not ttft_ms or not tpot_ms or ttft_ms <= 0 or tpot_ms <= 0:
            return None
        return cls(ttft_s=ttft_ms / 1000.0, tpot_s=tpot_ms / 1000.0)

    def applied(self, sessions: SessionSpec) -> SessionSpec:
        """``sessions`` with its turns planned at these answer times."""
        return sessions.model_copy(
            update={"expected_ttft_s": self.ttft_s, "expected_tpot_s": self.tpot_s}
        )


def _largest(length: LengthSpec | TurnsSpec) -> int:
    """The largest value a length distribution gives (an unbounded lognormal: its
    1 - 1e-9 quantile)."""
    if isinstance(length, FixedLength):
        return length.value
    if isinstance(length, UniformLength):
        return length.high
    if isinstance(length, LognormalLength):
        if length.high is not None:
            return length.high
        return max(length.low, math.ceil(length.median * math.exp(_TAIL_Z * length.sigma)))
    if isinstance(length, TraceLength):
        if length.path is None:
            return 0  # lengths of each trace row: not combined with sessions
        # Only output lengths set a look-back: the output column.
        return int(trace_column(read_trace_ref(length.path), TraceColumn.OUTPUT).max())
    assert isinstance(length, MixtureLength)
    return max(_largest(c.length) for c in length.components)


def largest_turns(sessions: SessionSpec) -> int:
    """The most turns a session of ``sessions`` has."""
    return _largest(sessions.turns)


def turn_gap_s(sessions: SessionSpec, max_tokens: float, *, think_s: float | None = None) -> float:
    """The planned time from one turn to the next: expected service of an answer of
    ``max_tokens``, then the think time (the builder's spacing; ``think_s``, else the
    mean think time)."""
    think = mean_think_s(sessions) if think_s is None else think_s
    return sessions.expected_ttft_s + max_tokens * sessions.expected_tpot_s + think


def lookback_s(spec: WorkloadSpec) -> float:
    """How far before offset 0 a session may have arrived and still have turns to send:
    the most turns, each after the longest answer's gap and the longest think time (0
    without sessions)."""
    if spec.sessions is None:
        return 0.0
    most_turns = _largest(spec.sessions.turns)
    longest = turn_gap_s(
        spec.sessions, _largest(spec.output_tokens), think_s=longest_think_s(spec.sessions)
    )
    return (most_turns - 1) * longest


def lead_rate_per_s(spec: WorkloadSpec, trace: Sequence[TraceRecord] | None = None) -> float:
    """Sessions per second arriving before offset 0: the arrival rate in effect there
    (ramp and diurnal: their warm-up rate with a warm-up, else their starting rate; a
    trace at its recorded rate: its mean rate; closed: 0, it has no window)."""
    arrival = spec.arrival
    if isinstance(arrival, PoissonArrival | GammaArrival):
        return arrival.rate_per_s
    if isinstance(arrival, TraceArrival):
        if arrival.rate_per_s is not None:
            return arrival.rate_per_s
        if not trace or len(trace) < 2:
            return 0.0
        span = max(r.arrival_s for r in trace) - min(r.arrival_s for r in trace)
        return (len(trace) - 1) / span if span > 0 else 0.0
    if isinstance(arrival, ClosedArrival):
        return 0.0
    initial = (
        arrival.start_rate_per_s if isinstance(arrival, RampArrival) else arrival.trough_rate_per_s
    )
    assert isinstance(arrival, RampArrival | DiurnalArrival)
    warmed = spec.warmup.duration_s > 0 or spec.warmup.requests > 0
    if warmed and initial <= 0:
        return arrival.mean_rate_per_s or 0.0
    return initial


def nearest_in_rate(held: Mapping[float, AnswerTimes], rate_per_s: float) -> AnswerTimes | None:
    """The answer times measured at the rate nearest ``rate_per_s`` (by ratio) among those
    that held; None when none has."""
    nearest = min(held, key=lambda r: abs(math.log(r / rate_per_s)), default=None)
    return held[nearest] if nearest is not None else None


# --- the stationary turn mix ------------------------------------------------------------


def _lognormal_cdf(x: float, median: float, sigma: float) -> float:
    if x <= 0:
        return 0.0
    return 0.5 * math.erfc(-(math.log(x) - math.log(median)) / (sigma * math.sqrt(2.0)))


def turns_pmf(turns: TurnsSpec) -> tuple[float, ...]:
    """P(N = n) for n = 1, 2, ...: a session's number of turns (index 0 is n = 1)."""
    if isinstance(turns, FixedLength):
        probs = [0.0] * turns.value
        probs[-1] = 1.0
        return tuple(probs)
    if isinstance(turns, UniformLength):
        width = turns.high - turns.low + 1
        return tuple(0.0 if n < turns.low else 1.0 / width for n in range(1, turns.high + 1))
    low, high = turns.low, _largest(turns)
    if turns.sigma == 0 or low == high:
        value = min(max(round(turns.median), low), high)
        return tuple(1.0 if n == value else 0.0 for n in range(1, value + 1))
    probs = []
    for n in range(1, high + 1):
        if n < low:
            probs.append(0.0)
            continue
        below = 0.0 if n == low else _lognormal_cdf(n - 0.5, turns.median, turns.sigma)
        above = 1.0 if n == high else _lognormal_cdf(n + 0.5, turns.median, turns.sigma)
        probs.append(above - below)
    return tuple(probs)


def expected_turns(spec: WorkloadSpec) -> float:
    """Requests per arrival: a session's expected number of turns (1 without sessions)."""
    if spec.sessions is None:
        return 1.0
    return sum(n * p for n, p in enumerate(turns_pmf(spec.sessions.turns), start=1))


class ArrivalMeans(BaseModel):
    """What one arrival of a declared workload sends, on average: its requests (a
    session's expected turns, 1 without sessions) and each request's output tokens (the
    declared lengths' mean where the server is asked for exactly ``max_tokens``, the
    spec's ``ignore_eos``; None where the model ends its answers). A goodput's requests/s
    and output tokens/s are its arrival rate times these (``tuner.run.goodput``): the same
    population in every unit, whatever share of it one window happened to hold.

    Sessions cut short by ``max_context_tokens`` (a conversation that outgrew the
    context) are counted at their declared turns: the cut needs a context near the
    limit, which the built-in ``chat`` never reaches."""

    model_config = ConfigDict(frozen=True)

    requests_per_arrival: float
    output_tokens_per_request: float | None


def arrival_means(spec: WorkloadSpec) -> ArrivalMeans:
    """``spec``'s requests per arrival and output tokens per request (``ArrivalMeans``);
    a trace arrival's lengths without a path of their own are its rows', over one pass."""
    output: float | None = None
    if spec.ignore_eos:
        rows = read_trace_ref(spec.arrival.path) if isinstance(spec.arrival, TraceArrival) else None
        output = mean_length(spec.output_tokens, column=TraceColumn.OUTPUT, rows=rows)
    return ArrivalMeans(requests_per_arrival=expected_turns(spec), output_tokens_per_request=output)


def stationary_turn_mix(turns: TurnsSpec) -> tuple[float, ...]:
    """The share of requests that are turn k (0 first) among sessions arriving at a
    constant rate: ``P(N > k) / E[N]``; a session of n turns sends one at each k < n."""
    pmf = turns_pmf(turns)
    survival = [sum(pmf[k:]) for k in range(len(pmf))]  # P(N > k) = P(N >= k + 1)
    mean = sum(survival)
    return tuple(s / mean for s in survival)


# --- the measurement --------------------------------------------------------------------


def chi2_sf(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X chi-square with ``dof`` degrees of freedom (closed form
    for integer dof: a Poisson sum for even dof, erfc and a half-integer sum for odd)."""
    if dof < 1:
        raise ValueError(f"degrees of freedom {dof} are not accepted; accepted: an integer >= 1")
    if statistic <= 0:
        return 1.0
    half = statistic / 2.0
    if dof % 2 == 0:
        terms = (math.exp(j * math.log(half) - half - math.lgamma(j + 1)) for j in range(dof // 2))
        return min(1.0, sum(terms))
    head = math.erfc(math.sqrt(half))
    tail = (
        math.exp((j - 0.5) * math.log(half) - half - math.lgamma(j + 0.5))
        for j in range(1, (dof - 1) // 2 + 1)
    )
    return min(1.0, head + sum(tail))


class TurnMix(BaseModel):
    """The turns a window's measured requests are, against the workload's stationary mix.

    ``shares[k]`` and ``stationary_shares[k]`` are turn k's share (0 first). The test is
    Pearson's chi-square goodness of fit of the counts to the stationary shares, tail
    turns pooled so that every bin expects at least 5 requests (``bins``: each bin's
    first turn); ``p_value`` is None with fewer than two bins."""

    model_config = ConfigDict(frozen=True)

    requests: int
    later_turn_share: float  # measured requests that are not a session's first turn
    stationary_later_turn_share: float  # 1 - 1/E[N]
    shares: tuple[float, ...]
    stationary_shares: tuple[float, ...]
    test: str = "chi-square goodness of fit"
    bins: tuple[int, ...]
    chi_square: float
    dof: int
    p_value: float | None
    # The answer times the session population was planned with (``AnswerTimes``);
    # None in files written before they were recorded.
    planned_ttft_s: float | None = None
    planned_tpot_s: float | None = None


def turn_mix(schedule: Iterable[ScheduledRequest], sessions: SessionSpec) -> TurnMix:
    """The turn mix of a schedule's measured requests (warm-up left out)."""
    expected = stationary_turn_mix(sessions.turns)
    width = len(expected)
    counts = [0] * width
    for request in schedule:
        if not request.warmup:
            counts[min(request.turn, width - 1)] += 1
    total = sum(counts)
    shares = tuple(c / total for c in counts) if total else tuple(0.0 for _ in counts)
    # Bins from the first turn on, each closed once it expects enough; the rest pooled.
    bins: list[int] = []
    observed: list[float] = []
    wanted: list[float] = []
    open_bin = False
    for k in range(width):
        if not open_bin:
            bins.append(k)
            observed.append(0.0)
            wanted.append(0.0)
            open_bin = True
        observed[-1] += counts[k]
        wanted[-1] += expected[k] * total
        if wanted[-1] >= _MIN_EXPECTED and sum(expected[k + 1 :]) * total >= _MIN_EXPECTED:
            open_bin = False
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, wanted, strict=True) if e > 0)
    dof = len(bins) - 1
    return TurnMix(
        requests=total,
        later_turn_share=(total - counts[0]) / total if total else 0.0,
        stationary_later_turn_share=1.0 - expected[0],
        shares=shares,
        stationary_shares=expected,
        bins=tuple(bins),
        chi_square=statistic,
        dof=dof,
        p_value=chi2_sf(statistic, dof) if dof >= 1 and total else None,
        planned_ttft_s=sessions.expected_ttft_s,
        planned_tpot_s=sessions.expected_tpot_s,
    )


def write_turn_mix(path: Path, mix: TurnMix) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(mix.model_dump_json(indent=2) + "\n", encoding="utf-8")
