"""A goodput as a run's files state it: its unit, whether it is bracketed, its figures.

``Goodput`` is written inside ``evaluation.json``, ``recommendation.json``, ``summary.json``
and ``parallelism.json``; the rate search (``tuner.search.rate_search``) finds it. A
workload's arrival rate is in its own unit (``GoodputUnit``: conversations/s where it has
sessions, else requests/s); a search that found no breaking rate knows only a lower
bound (``GoodputBound``).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from workloads.spec import WorkloadSpec


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
    level that met the SLOs, what that level offered in requests/s (the figure the
    sampler and the regression gate compare) and its output tokens/s, and whether it is
    the goodput or only a lower bound on it. Zero everywhere when no level met the SLOs."""

    model_config = ConfigDict(frozen=True)

    arrival_rate_per_s: float = 0.0  # in ``unit``
    unit: GoodputUnit = GoodputUnit.REQUESTS_PER_S
    requests_per_s: float = 0.0
    output_tokens_per_s: float = 0.0
    bound: GoodputBound = GoodputBound.NONE

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
        n = len(goodputs)
        return cls(
            arrival_rate_per_s=sum(g.arrival_rate_per_s for g in goodputs) / n,
            unit=goodputs[-1].unit,
            requests_per_s=sum(g.requests_per_s for g in goodputs) / n,
            output_tokens_per_s=sum(g.output_tokens_per_s for g in goodputs) / n,
            bound=bound,
        )
