"""``budget.json``: the tune's time budget, every launch's seconds, every launch skipped.

``tuner.search.budget.TimeBudget`` counts the launches and writes its ``BudgetRecord``;
the report and a resumed run read it back.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class LaunchKind(StrEnum):
    """What a launch was for."""

    TRIAL = "trial"
    EDGE_PROBE = "edge_probe"
    CONFIRMATION = "confirmation"
    QUALITY_GATE = "quality_gate"  # a server the quality gate compared (tuner.search.quality_gate)
    TIE_BREAK = "tie_break"  # a tied setting measured again (tuner.search.ties)


class LaunchRecord(BaseModel):
    """One launch: when it began (seconds since the tune began) and what its parts took
    (wall seconds)."""

    model_config = ConfigDict(frozen=True)

    kind: LaunchKind
    name: str
    began_s: float
    launch_s: float | None  # spawn to ready, or to its failure
    measure_s: float | None  # warm-up, levels or the worst case's hold
    stop_s: float | None  # stop and the device memory's release
    ready: bool  # the server became ready
    deadline_s: float  # the deadline it was started against (seconds since the tune began)

    @property
    def overhead_s(self) -> float:
        return (self.launch_s or 0.0) + (self.stop_s or 0.0)

    @property
    def ended_s(self) -> float:
        return self.began_s + self.overhead_s + (self.measure_s or 0.0)


class SkippedLaunch(BaseModel):
    """A launch not started because it would not have finished before its deadline."""

    model_config = ConfigDict(frozen=True)

    kind: LaunchKind
    name: str
    at_s: float  # seconds since the tune began
    need_s: float  # what it was estimated to take
    left_s: float  # what was left before its deadline
    reason: str

    def text(self) -> str:
        return f"{self.name} not started: {self.reason}"


class BudgetRecord(BaseModel):
    """``budget.json``: the budget, the prior, every launch and every launch skipped."""

    model_config = ConfigDict(frozen=True)

    budget_s: float
    launch_prior_s: float
    launches: list[LaunchRecord] = []
    skipped: list[SkippedLaunch] = []
    # Launches of earlier runs of this study in this directory (a run resumed with
    # --resume), each timed from its own run's start: measured launches all the same.
    earlier: list[LaunchRecord] = []
