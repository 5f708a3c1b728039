"""A goodput as a run's files state it: its unit, whether it is bracketed, its figures.

``Goodput`` is written inside ``evaluation.json``, ``recommendation.json``, ``summary.json``
and ``parallelism.json``; the rate search (``tuner.search.rate_search``) finds it. A
workload's arrival rate is in its own unit (``GoodputUnit``: conversations/s where it has
sessions, else requests/s); a search that found no breaking rate knows only a lower
bound (``GoodputBound``).

Its requests/s and output tokens/s count the same population as its arrival rate: the
declared workload at that rate (``Goodput.stated``: the rate times the workload's requests
per arrival and output tokens per request, ``workloads.stationary.ArrivalMeans``), so a
gain is the same in every unit unless the workload itself makes it differ (the model
ending its answers, ``UnitsBasis.MEASURED_OUTPUT``); ``gains_text`` says which, in words.
A best level's window holds a draw of that workload over tens of seconds: its arrivals
are a Poisson count (±10% at a hundred conversations), the turns of the conversations
under way are that draw's, and the requests still running when the run is cut after the
window have only part of their output; what it counted stays in the level's evidence
(``LoadResult``), and in runs written before (``UnitsBasis.WINDOW``).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from workloads.spec import WorkloadSpec
from workloads.stationary import arrival_means

UNITS_AGREE = 0.05  # gains in two units within 5% of each other agree


class GoodputBound(StrEnum):
    """What a search's goodput is: the goodput, or only a lower bound on it."""

    BRACKETED = "bracketed"  # a rate above the best one that held broke the SLOs (or the engine)
    LOWER_BOUND = "lower_bound"  # no measured rate broke: the server holds at least this
    NONE = "none"  # no level met the SLOs

    @property
    def is_lower_bound(self) -> bool:
        return self is GoodputBound.LOWER_BOUND


class GoodputUnit(StrEnum):
    """The unit of a workload's arrival rate, the unit its goodput and peak are stated in."""

    CONVERSATIONS_PER_S = "conversations_per_s"  # a multi-turn workload: new sessions/s
    REQUESTS_PER_S = "requests_per_s"

    @property
    def label(self) -> str:
        return "conversations/s" if self is GoodputUnit.CONVERSATIONS_PER_S else "req/s"

    @classmethod
    def of(cls, spec: WorkloadSpec) -> GoodputUnit:
        """Conversations/s for an open-loop workload with sessions, else requests/s (a
        closed-loop one has no arrival rate of its own: its requests are what it sends)."""
        if spec.sessions is not None and spec.mean_rate_per_s is not None:
            return cls.CONVERSATIONS_PER_S
        return cls.REQUESTS_PER_S


class UnitsBasis(StrEnum):
    """What a goodput's requests/s and output tokens/s count."""

    # Its arrival rate times the declared workload's requests per arrival and output
    # tokens per request (``workloads.stationary.ArrivalMeans``): the same population as
    # the arrival rate, so every unit shows the same gain.
    DECLARED = "declared"
    # As DECLARED, with the output tokens per request measured (the workload lets the
    # model end its answers, ``ignore_eos: false``): the best level's completed requests'.
    MEASURED_OUTPUT = "measured_output"
    # What the best level's window counted: its requests per second and the tokens of
    # those it served (the ones cut at the run's end as far as they got) per second of
    # the window and its drain. Runs written before goodputs were stated whole.
    WINDOW = "window"


class CapacityInterval(BaseModel):
    """Where a trial's capacity lies (the arrival rate up to which its SLO holds), from
    its levels' own statistics (``tuner.search.capacity_interval``), in the workload's
    unit: the rates at which the estimated probability of holding the SLO falls through
    ``1 - (1 - confidence) / 2`` (``low_per_s``) and ``(1 - confidence) / 2``
    (``high_per_s``; None where no measured rate fell that far: no upper end). The
    goodput, the highest measured rate that held, may lie below it: the capacity is
    somewhere between that rate and the next, which broke. ``hold_at_goodput``: the
    probability of holding at the goodput's own level."""

    model_config = ConfigDict(frozen=True)

    low_per_s: float
    high_per_s: float | None
    confidence: float = 0.9
    hold_at_goodput: float | None = None

    def overlaps(self, other: CapacityInterval) -> bool:
        """Whether the two intervals share a rate: the capacities are within each other's
        noise, a tie the measurement cannot rank (no upper end: open upwards)."""
        below = self.high_per_s is not None and self.high_per_s < other.low_per_s
        above = other.high_per_s is not None and other.high_per_s < self.low_per_s
        return not (below or above)

    def per_gpu(self, gpus: int) -> CapacityInterval:
        """The interval divided over ``gpus`` (a server of several GPUs, ranked per GPU)."""
        if gpus <= 1:
            return self
        high = self.high_per_s / gpus if self.high_per_s is not None else None
        return self.model_copy(update={"low_per_s": self.low_per_s / gpus, "high_per_s": high})

    def bracket(self) -> str:
        """``capacity 90% in [5.40, 6.90]``; ``capacity 90% in [5.40, -]`` with no upper end."""
        high = f"{self.high_per_s:.2f}" if self.high_per_s is not None else "-"
        return f"capacity {self.confidence:.0%} in [{self.low_per_s:.2f}, {high}]"


class CapacityGain(BaseModel):
    """The recommendation's capacity against vLLM's defaults', from their intervals
    (``tuner.search.capacity_interval.capacity_gain``): the ratio's bounds (the
    recommendation's low end over the defaults' high end, and the other way round; None:
    no upper end) and its middle. ``measurable``: the intervals do not overlap (the lower
    bound above 1: a gain; the upper one below 1: a loss); otherwise the settings tie
    within the measurement's noise."""

    model_config = ConfigDict(frozen=True)

    ratio: float  # middle over middle
    low_ratio: float
    high_ratio: float | None
    measurable: bool

    def text(self) -> str:
        """ "capacity +29% [+4%, +61%] over vLLM's defaults", or "no measurable gain ..."."""
        high = f"{self.high_ratio - 1:+.0%}" if self.high_ratio is not None else "-"
        bracket = f"[{self.low_ratio - 1:+.0%}, {high}]"
        if self.measurable:
            against = "over" if self.low_ratio > 1.0 else "against"
            return f"capacity {self.ratio - 1:+.0%} {bracket} {against} vLLM's defaults"
        return (
            f"no measurable gain over vLLM's defaults: capacity {self.ratio - 1:+.0%} "
            f"{bracket}, the intervals overlap"
        )


class Goodput(BaseModel):
    """A goodput, stated whole: the arrival rate in the workload's own unit at the best
    level that met the SLOs, in requests/s (the figure the regression gate compares) and
    in output tokens/s, and whether it is the goodput or only a lower bound on it. Zero
    everywhere when no level met the SLOs. ``basis``: what its requests/s and output
    tokens/s count (``UnitsBasis``; WINDOW in files written before it was recorded)."""

    model_config = ConfigDict(frozen=True)

    arrival_rate_per_s: float = 0.0  # in ``unit``
    unit: GoodputUnit = GoodputUnit.REQUESTS_PER_S
    requests_per_s: float = 0.0
    output_tokens_per_s: float = 0.0
    bound: GoodputBound = GoodputBound.NONE
    basis: UnitsBasis = UnitsBasis.WINDOW

    @classmethod
    def stated(
        cls,
        spec: WorkloadSpec,
        *,
        arrival_rate_per_s: float,
        bound: GoodputBound,
        measured_output_tokens_per_request: float | None = None,
    ) -> Goodput:
        """The goodput of ``spec`` (the declared workload) at ``arrival_rate_per_s`` (its
        unit's: conversations/s where it has sessions, else requests/s) in every unit:
        requests/s the rate times its requests per arrival, output tokens/s those times
        its output tokens per request (``workloads.stationary.arrival_means``). Where the
        model ends its answers (``ignore_eos: false``) the output tokens per request are
        ``measured_output_tokens_per_request`` (0 tokens/s without it)."""
        unit = GoodputUnit.of(spec)
        means = arrival_means(spec)
        per_arrival = means.requests_per_arrival if unit is GoodputUnit.CONVERSATIONS_PER_S else 1.0
        requests = arrival_rate_per_s * per_arrival
        basis = UnitsBasis.DECLARED
        per_request = means.output_tokens_per_request
        if per_request is None:
            basis = UnitsBasis.MEASURED_OUTPUT
            per_request = measured_output_tokens_per_request or 0.0
        return cls(
            arrival_rate_per_s=arrival_rate_per_s, unit=unit, requests_per_s=requests,
            output_tokens_per_s=requests * per_request, bound=bound, basis=basis,
        )  # fmt: skip

    @property
    def requests_per_arrival(self) -> float | None:
        """Requests/s per unit of the arrival rate (a conversation's requests; 1 for
        requests/s); None at zero."""
        return self.requests_per_s / self.arrival_rate_per_s if self.arrival_rate_per_s else None

    @property
    def output_tokens_per_request(self) -> float | None:
        return self.output_tokens_per_s / self.requests_per_s if self.requests_per_s else None

    def text(self) -> str:
        """As every printer says it: "12.00 conversations/s (41.50 req/s, 9,800 output
        tok/s)", "41.50 req/s (9,800 output tok/s)" for a single-turn workload, "at least
        ..., no breaking rate found" when no rate above it broke."""
        figures = [f"{self.arrival_rate_per_s:.2f} {self.unit.label}"]
        if self.unit is not GoodputUnit.REQUESTS_PER_S:
            figures.append(f"{self.requests_per_s:.2f} req/s")
        tokens = f"{self.output_tokens_per_s:,.0f} output tok/s"
        text = f"{figures[0]} ({', '.join([*figures[1:], tokens])})"
        if self.bound.is_lower_bound:
            return f"at least {text}, no breaking rate found"
        return text

    def per_arrival_text(self) -> str:
        """What the requests/s and output tokens/s are per unit of the arrival rate, in
        words: "3.50 requests a conversation and 297 output tokens a request"."""
        parts = []
        if self.unit is GoodputUnit.CONVERSATIONS_PER_S:
            parts.append(f"{self.requests_per_arrival or 0.0:.2f} requests a conversation")
        parts.append(f"{self.output_tokens_per_request or 0.0:,.0f} output tokens a request")
        return " and ".join(parts)

    @classmethod
    def mean(cls, goodputs: list[Goodput]) -> Goodput:
        """The mean over repeats (a lower bound when any repeat's was one)."""
        if not goodputs:
            return cls()
        bounds = {g.bound for g in goodputs}
        bound = next(
            (b for b in (GoodputBound.LOWER_BOUND, GoodputBound.BRACKETED) if b in bounds),
            GoodputBound.NONE,
        )
        # a repeat where nothing held has no units to count (nor a basis of its own)
        bases = {g.basis for g in goodputs if g.arrival_rate_per_s > 0} or {goodputs[-1].basis}
        n = len(goodputs)
        return cls(
            arrival_rate_per_s=sum(g.arrival_rate_per_s for g in goodputs) / n,
            unit=goodputs[-1].unit,
            requests_per_s=sum(g.requests_per_s for g in goodputs) / n,
            output_tokens_per_s=sum(g.output_tokens_per_s for g in goodputs) / n,
            bound=bound,
            basis=bases.pop() if len(bases) == 1 else UnitsBasis.WINDOW,
        )


class UnitGains(BaseModel):
    """One goodput's gain over another in each unit (ratios, 1.0: the same; None where
    the other is zero)."""

    model_config = ConfigDict(frozen=True)

    unit: GoodputUnit
    arrivals: float | None
    requests: float | None
    output_tokens: float | None

    @classmethod
    def of(cls, new: Goodput, old: Goodput) -> UnitGains:
        def ratio(a: float, b: float) -> float | None:
            return a / b if b > 0 else None

        return cls(
            unit=new.unit,
            arrivals=ratio(new.arrival_rate_per_s, old.arrival_rate_per_s),
            requests=ratio(new.requests_per_s, old.requests_per_s),
            output_tokens=ratio(new.output_tokens_per_s, old.output_tokens_per_s),
        )

    def ratios(self) -> list[tuple[str, float]]:
        """(unit label, ratio) for each unit with a ratio, the workload's own first."""
        named = [(self.unit.label, self.arrivals)]
        if self.unit is not GoodputUnit.REQUESTS_PER_S:
            named.append(("req/s", self.requests))
        named.append(("output tok/s", self.output_tokens))
        return [(label, r) for label, r in named if r is not None]

    @property
    def spread(self) -> float | None:
        """The largest gain over the smallest, less 1 (0: they agree exactly)."""
        values = [r for _, r in self.ratios()]
        return max(values) / min(values) - 1.0 if len(values) > 1 and min(values) > 0 else None

    @property
    def agree(self) -> bool:
        """Whether the gains are within ``UNITS_AGREE`` of each other."""
        spread = self.spread
        return spread is not None and spread <= UNITS_AGREE


def gains_text(new: Goodput, old: Goodput, *, old_name: str = "vLLM's defaults") -> str | None:
    """The gain of ``new`` over ``old`` in each unit, in words, and why they differ where
    they do; None where either is zero. E.g. "the same gain in every unit, +29% in
    conversations/s, req/s and output tok/s: each is the conversation rate that held times
    the workload's 3.50 requests a conversation and 297 output tokens a request"."""
    gains = UnitGains.of(new, old)
    ratios = gains.ratios()
    if gains.arrivals is None or len(ratios) < 2:
        return None
    listed = ", ".join(f"{r - 1:+.0%} in {label}" for label, r in ratios)
    bases = {new.basis, old.basis}
    if gains.agree:
        if bases == {UnitsBasis.DECLARED}:
            labels = [label for label, _ in ratios]
            every = ", ".join(labels[:-1]) + f" and {labels[-1]}"
            return (
                f"the same gain over {old_name} in every unit, {gains.arrivals - 1:+.0%} in "
                f"{every}: each is the {new.unit.label} that held times the workload's "
                f"{new.per_arrival_text()}"
            )
        return f"{listed} over {old_name}: the same gain in every unit, within {UNITS_AGREE:.0%}"
    if UnitsBasis.WINDOW in bases:
        return (
            f"{listed} over {old_name}: these req/s and output tok/s are what the best "
            f"level's window counted ({new.per_arrival_text()}, against "
            f"{old.per_arrival_text()}), a draw of the workload over that window (its "
            "arrivals, the turns of the conversations under way, the requests cut at its end "
            f"with part of their output), not what the settings serve; the {new.unit.label} "
            "is the rate that held"
        )
    if UnitsBasis.MEASURED_OUTPUT in bases:
        return (
            f"{listed} over {old_name}: the model ends its answers (the workload does not "
            f"ask for exactly max_tokens), and they were "
            f"{new.output_tokens_per_request or 0.0:,.0f} output tokens a request here against "
            f"{old.output_tokens_per_request or 0.0:,.0f} with {old_name}: settings that "
            "change the numerics change what the model writes"
        )
    return (
        f"{listed} over {old_name}: stated for different workloads ({new.per_arrival_text()}, "
        f"against {old.per_arrival_text()})"
    )
