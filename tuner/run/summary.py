"""``summary.json``: what a tune came to, for scripts (``tuner.search.tune`` writes it)."""

from __future__ import annotations

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from tuner.run.goodput import CapacityInterval, Goodput, GoodputBound, GoodputUnit
from tuner.run.parallelism import ParallelismComparison
from tuner.run.quality import QualityRejection, QualityResult
from tuner.run.ties import TieBreak
from tuner.run.twin_record import TrialFit


class TuneSummary(BaseModel):
    model_config = ConfigDict(frozen=True)

    study: str
    run_dir: str
    backend: str
    trials: int
    feasible: int
    best_trial: int | None
    # The best trial's goodput, each figure named with its unit: the requests/s it offered
    # at its best rate (what the sampler ranks), that rate in the workload's own unit
    # (best_goodput_arrival_unit: conversations/s where it has sessions) and its output
    # tokens/s. Runs written before these names said `best_goodput` (requests/s) and
    # `best_goodput_unit`; both still read.
    best_goodput_requests_per_s: float | None = Field(
        default=None,
        validation_alias=AliasChoices("best_goodput_requests_per_s", "best_goodput"),
    )
    best_goodput_arrival_rate_per_s: float | None = None
    best_goodput_arrival_unit: GoodputUnit | None = Field(
        default=None,
        validation_alias=AliasChoices("best_goodput_arrival_unit", "best_goodput_unit"),
    )
    best_goodput_output_tokens_per_s: float | None = None
    # BRACKETED: a higher rate broke the SLOs; LOWER_BOUND: none did within the level
    # budget, so the best trial holds at least this (None: no feasible trial)
    best_goodput_bound: GoodputBound | None = None
    best_goodput_is_lower_bound: bool = False
    # Where the best trial's capacity lies, from its levels' own statistics, in
    # best_goodput_arrival_unit (tuner.search.capacity_interval)
    best_capacity_interval: CapacityInterval | None = None
    # Feasible trials whose capacity intervals overlap the best's: within the noise of
    # it, a tie the measurement cannot rank (tuner.search.study.records.ties_with_best)
    ties_with_best: list[int] = []
    # How the recommended trial was chosen of those tied with the best: the two measured
    # again where the time was left, the outcome and why (tuner.run.ties; None: no tie)
    tie_break: TieBreak | None = None
    best_goodput_figures: Goodput | None = None
    finalized_here: bool
    # The twin's step costs fitted after each trial (twin.json): its error on each
    # trial's levels before and after the fit, and its goodput prediction.
    twin_fits: list[TrialFit] = []
    # Where the tensor-parallel size was searched: each size's best server, per GPU
    parallelism: ParallelismComparison | None = None
    recommendation: str | None
    # The quality gate (tuner.search.quality_gate): the recommended settings' result where
    # they change the model's numerics (outcome passed / not_measured, with the figures and
    # thresholds), else the last gated setting's; and the setting passed over for its
    # result. None where no setting that changes numerics was gated.
    quality: QualityResult | None = None
    quality_rejected: QualityRejection | None = None
    report: str | None
    wall_s: float
