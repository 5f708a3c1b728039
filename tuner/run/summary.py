"""``summary.json``: what a tune came to, for scripts (``tuner.search.tune`` writes it)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from tuner.run.goodput import Goodput, GoodputBound, GoodputUnit
from tuner.run.parallelism import ParallelismComparison
from tuner.run.twin_record import TrialFit


class TuneSummary(BaseModel):
    model_config = ConfigDict(frozen=True)

    study: str
    run_dir: str
    backend: str
    trials: int
    feasible: int
    best_trial: int | None
    best_goodput: float | None  # requests/s the best trial offered at its best rate
    # BRACKETED: a higher rate broke the SLOs; LOWER_BOUND: none did within the level
    # budget, so the best trial holds at least best_goodput (None: no feasible trial)
    best_goodput_bound: GoodputBound | None = None
    best_goodput_is_lower_bound: bool = False
    # the best trial's goodput stated whole: arrival_rate_per_s in the workload's unit
    # (conversations/s where it has sessions), requests_per_s (= best_goodput) and
    # output_tokens_per_s; best_goodput_unit repeats its unit
    best_goodput_unit: GoodputUnit | None = None
    best_goodput_figures: Goodput | None = None
    finalized_here: bool
    # The twin's step costs fitted after each trial (twin.json): its error on each
    # trial's levels before and after the fit, and its goodput prediction.
    twin_fits: list[TrialFit] = []
    # Where the tensor-parallel size was searched: each size's best server, per GPU
    parallelism: ParallelismComparison | None = None
    recommendation: str | None
    report: str | None
    wall_s: float
