"""``recommendation/recommendation.json``: the recommended settings, their variants, the
edge, the headroom and the capacity, as ``tuner.search.recommend`` chose and confirmed them.

``Recommendation`` holds the recommended ``Variant`` and the others (each with what its
confirmation runs measured, ``ConfirmationResult``) and the replicas for the target peak
(``Capacity``).
"""

from __future__ import annotations

import statistics

from pydantic import BaseModel, ConfigDict

from tuner.run.cold_boot import ColdBootCheck
from tuner.run.edge import EdgeResult
from tuner.run.evaluation import Verdict
from tuner.run.goodput import (
    CapacityGain,
    CapacityInterval,
    Goodput,
    GoodputBound,
    GoodputUnit,
    gains_text,
)
from tuner.run.offloading import OffloadingVerdict
from tuner.run.quality import QualityRejection, QualityResult
from tuner.run.ties import TieBreak
from tuner.serving.eviction_scrape import EvictionEvidence
from tuner.serving.server import Backend
from tuner.vllm.memory import Calibration
from tuner.vllm.space import TrialParams
from workloads.load_result import Percentiles
from workloads.slo import SloAsTexts


class ConfirmationResult(BaseModel):
    """What one variant's confirmation run measured (emulated time on the simulator)."""

    model_config = ConfigDict(frozen=True)

    verdict: Verdict
    goodput: float  # requests/s at the highest rate meeting the SLOs (mean over repeats)
    goodput_runs: list[float]  # each repeat's goodput, for the run-to-run noise
    # LOWER_BOUND when a run found no breaking rate: the variant holds at least goodput
    goodput_bound: GoodputBound = GoodputBound.NONE
    rate_per_s: float | None = None  # the offered rate goodput was measured at (last run)
    rates_per_s: list[float] = []  # every offered rate the last run measured
    throughput: float  # output tokens/s there
    # goodput stated whole (mean over repeats): the workload's unit, req/s, output tok/s
    goodput_figures: Goodput | None = None
    ttft_ms: Percentiles | None  # at rate_per_s; at the last rate measured when none met the SLOs
    itl_ms: Percentiles | None
    tpot_ms: Percentiles | None
    e2e_ms: Percentiles | None
    peak_used_bytes: int | None
    total_bytes: int | None
    kv_cache_tokens: int | None
    dir: str
    # Where the capacity lies, from the runs' levels pooled (tuner.search.capacity_interval)
    capacity_interval: CapacityInterval | None = None
    # Eviction evidence at the level goodput was decided at (last run): --kv-cache-metrics'
    # histograms and, on the simulated engine, the share of later turns' missed tokens
    # that were their history evicted while under way; and the twin's share on the same
    # schedule (tuner.twin.eviction_share). None: not exported, not replayable.
    eviction: EvictionEvidence | None = None
    twin_evicted_under_way_share: float | None = None

    @property
    def offered_rate_per_s(self) -> float | None:
        """The offered rate behind goodput and the latencies: rate_per_s, or the last rate
        measured when none met the SLOs (None when nothing was measured)."""
        return self.rate_per_s or (self.rates_per_s[-1] if self.rates_per_s else None)

    @property
    def stated_goodput(self) -> Goodput:
        """The goodput in the workload's unit and in requests/s and output tokens/s (from
        the requests/s figures alone in a recommendation.json written before units were)."""
        if self.goodput_figures is not None:
            return self.goodput_figures
        return Goodput(
            arrival_rate_per_s=self.goodput, requests_per_s=self.goodput,
            output_tokens_per_s=self.throughput, bound=self.goodput_bound,
        )  # fmt: skip

    @property
    def goodput_spread(self) -> float:
        """Relative run-to-run spread of goodput (max-min over mean; 0 with one run)."""
        runs = [g for g in self.goodput_runs if g > 0]
        if len(runs) < 2:
            return 0.0
        return (max(runs) - min(runs)) / statistics.fmean(runs)


class Variant(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    flags: dict[str, object]
    params: TrialParams
    utilization_headroom: float | None  # utilization kept below the edge
    measured: ConfirmationResult | None
    command: str
    config_hash: str


class Capacity(BaseModel):
    """Replicas for the target peak. The peak and ``goodput_per_replica`` are in the
    workload's own unit (``unit``: conversations/s where it has sessions, else requests/s).
    From a goodput that is only a lower bound (no rate broke the SLOs), ``replicas`` is an
    upper bound: the peak may need fewer."""

    model_config = ConfigDict(frozen=True)

    target_peak_rate: float  # in ``unit``
    headroom: float
    goodput_per_replica: float  # in ``unit``
    replicas: int
    gpus_per_replica: int = 1  # the recommendation's tensor-parallel size
    replicas_is_upper_bound: bool = False
    unit: GoodputUnit = GoodputUnit.REQUESTS_PER_S
    goodput: Goodput | None = None  # one replica's goodput stated whole
    peak_requests_per_s: float | None = None  # the peak in requests/s, at the goodput's ratio

    def text(self) -> str:
        """E.g. "3 replica(s) for a peak of 120 conversations/s (about 415 req/s), 20%
        headroom"; "at most ..." when goodput is a lower bound."""
        at_most = "at most " if self.replicas_is_upper_bound else ""
        requests = (
            f" (about {self.peak_requests_per_s:,.0f} req/s)"
            if self.peak_requests_per_s is not None and self.unit is not GoodputUnit.REQUESTS_PER_S
            else ""
        )
        gpus = (
            f" of {self.gpus_per_replica} GPUs ({self.replicas * self.gpus_per_replica} GPUs)"
            if self.gpus_per_replica > 1
            else ""
        )
        return (
            f"{at_most}{self.replicas} replica(s){gpus} for a peak of {self.target_peak_rate:g} "
            f"{self.unit.label}{requests}, {self.headroom:.0%} headroom"
        )


class Recommendation(BaseModel):
    model_config = ConfigDict(frozen=True)

    study: str
    model: str
    gpu: str | None
    backend: Backend
    simulated: bool
    vllm_version: str
    workload: str
    slo: SloAsTexts  # recorded as its objectives' texts, e.g. "ttft p99 <= 2000 ms"
    objective: str
    best_trial: int
    recommended: Variant
    variants: list[Variant]
    default: Variant | None
    edge: EdgeResult | None
    # Confirmation runs not launched because they would not have finished in the time
    # budget, each with why (tuner.search.budget)
    skipped: list[str] = []
    calibration: Calibration | None
    # The recommended settings on a cold boot on a new node (empty compile cache), and
    # the utilization raised for it where needed (None: no GPU, or written before it was)
    cold_boot: ColdBootCheck | None = None
    capacity: Capacity | None
    # The recommendation's capacity against vLLM's defaults', with their noise (None:
    # either was not measured, or written before it was)
    capacity_gain: CapacityGain | None = None
    # The quality gate's result for the recommended settings where they change the model's
    # numerics (None: they keep them, or written before the gate); and the best trial,
    # where it changed them and was passed over for its result (tuner.run.quality)
    quality: QualityResult | None = None
    quality_rejected: QualityRejection | None = None
    # Where other trials tied with the best within the noise: which was recommended and why,
    # after measuring the two again where the budget left the time (tuner.run.ties)
    tie_break: TieBreak | None = None
    # Where kv-offloading-size was searched: the best trial with a CPU tier against the
    # best without (tuner.run.offloading); None: not searched, or written before it was
    offloading: OffloadingVerdict | None = None
    time_scale: float
    harness_version: str
    version_hash: str

    def quality_lines(self) -> list[str]:
        """The quality gate in words: the recommended settings' result ("quality not
        measured: ..." where it could not be measured), the setting passed over for its
        result, or that the settings keep the model's own numerics."""
        lines: list[str] = []
        if self.quality_rejected is not None:
            lines.append(self.quality_rejected.text())
        if self.quality is not None:
            lines.append(self.quality.text())
        elif self.quality_rejected is None:
            lines.append(
                "quality: the recommended settings keep the model's own numerics "
                "(no setting that changes them, such as --kv-cache-dtype fp8)"
            )
        return lines

    def units_text(self) -> str | None:
        """The recommendation's gain over vLLM's defaults in each unit, and why they differ
        where they do (``tuner.run.goodput.gains_text``); None where either was not measured."""
        measured = self.recommended.measured
        default = self.default.measured if self.default is not None else None
        if measured is None or default is None:
            return None
        return gains_text(measured.stated_goodput, default.stated_goodput)
