"""Whether KV offloading to CPU memory paid in a tune: the best trial with a CPU tier
(``--kv-offloading-size`` > 0) against the best without, by their capacity intervals.

A tune that searches ``kv-offloading-size`` says this in its recommendation
(``Recommendation.offloading``), its printed summary and its report, so a recommendation
that offloads says what it gained, and one that does not says that offloading did not pay
for this workload, with the figures of both trials (built by
``tuner.search.offloading_verdict``).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from tuner.run.goodput import CapacityGain, CapacityInterval, Goodput


class OffloadingOutcome(StrEnum):
    PAYS = "pays"  # the best with a CPU tier serves more beyond the noise
    NO_GAIN = "no_gain"  # the two capacities overlap
    COSTS = "costs"  # the best with a CPU tier serves less beyond the noise
    NOT_COMPARED = "not_compared"  # one side has no trial that met the SLOs


class OffloadingSide(BaseModel):
    """One side of the comparison: its best trial, its settings, what it served."""

    model_config = ConfigDict(frozen=True)

    trial: int
    settings: str  # TrialParams.short()
    goodput: Goodput
    capacity_interval: CapacityInterval | None

    def text(self) -> str:
        bracket = f", {self.capacity_interval.bracket()}" if self.capacity_interval else ""
        return f"trial {self.trial} ({self.settings}) {self.goodput.text()}{bracket}"


class TwinOffloading(BaseModel):
    """The twin's screen of the space (``landscape.json``): its best goodput with a CPU tier
    and without, in the workload's unit, and its ladder's step (what it can tell apart)."""

    model_config = ConfigDict(frozen=True)

    with_per_s: float
    with_settings: str
    without_per_s: float
    without_settings: str
    ladder_step: float  # one rung's ratio

    @property
    def gains(self) -> bool:
        """The best with a CPU tier a rung or more above the best without."""
        return self.with_per_s >= self.without_per_s * self.ladder_step * (1 - 1e-9) > 0

    def text(self, unit: str) -> str:
        return (
            f"twin: best with it {self.with_per_s:.2f} {unit} ({self.with_settings}), "
            f"without it {self.without_per_s:.2f} {unit} ({self.without_settings}), "
            f"its rungs {self.ladder_step - 1:.0%} apart"
        )


class OffloadingVerdict(BaseModel):
    model_config = ConfigDict(frozen=True)

    outcome: OffloadingOutcome
    sizes_gib: list[float]  # the CPU tier sizes the tune measured (> 0)
    with_offloading: OffloadingSide | None
    without_offloading: OffloadingSide | None
    gain: CapacityGain | None = None
    note: str = ""  # why it was not compared
    twin: TwinOffloading | None = None  # the twin's screen, where it ran
    unit: str = "req/s"  # the workload's unit, for the twin's figures

    def text(self) -> str:
        """One line: "offloading: no measurable gain at 16/64 GiB: ...", or "offloading
        pays: capacity +20% [+5%, +40%] at ...", or why it was not compared."""
        sizes = "/".join(f"{s:g}" for s in self.sizes_gib) or "no size"
        twin = f"; {self.twin.text(self.unit)}" if self.twin is not None else ""
        if self.outcome is OffloadingOutcome.NOT_COMPARED:
            if self.twin is not None:
                said = "pays on the twin" if self.twin.gains else "no gain the twin can see"
                return f"offloading: {said}, not measured: {self.note}{twin}"
            return f"offloading: not compared at {sizes} GiB: {self.note}"
        assert self.with_offloading is not None and self.without_offloading is not None
        sides = (
            f"best with it {self.with_offloading.text()}; "
            f"best without it {self.without_offloading.text()}"
        )
        gain = self.gain
        change = ""
        if gain is not None:
            high = f"{gain.high_ratio - 1:+.0%}" if gain.high_ratio is not None else "-"
            change = f"capacity {gain.ratio - 1:+.0%} [{gain.low_ratio - 1:+.0%}, {high}]"
        match self.outcome:
            case OffloadingOutcome.PAYS:
                return f"offloading pays: {change} at {sizes} GiB ({sides}{twin})"
            case OffloadingOutcome.COSTS:
                return f"offloading costs capacity: {change} at {sizes} GiB ({sides}{twin})"
            case _:
                said = f"{change}, the intervals overlap" if change else "the goodputs tie"
                return (
                    f"offloading: no measurable gain at {sizes} GiB, it does not pay for this "
                    f"workload: {said} ({sides}{twin})"
                )
