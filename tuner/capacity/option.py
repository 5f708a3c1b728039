"""One option of a capacity plan: a GPU type at a tensor-parallel size, with the memory
settings the twin picks and one replica's steady-state goodput at the SLO.

The settings, as a serving engineer would set them for a fleet:

* ``--gpu-memory-utilization``: the highest the memory plan (vLLM's own startup
  accounting, ``tuner.vllm.memory.plan``) says starts, less the safety margin;
* ``--max-model-len``: the one given, else the model's own where its KV cache fits, else
  the smallest power of two that holds the workload's longest request and half again;
* ``--max-num-seqs`` and ``--block-size``: vLLM's defaults for the GPU;
* ``--kv-cache-dtype``: auto, and fp8 where the GPU supports it, each screened; fp8 is
  kept only when it serves at least ``FP8_GAIN`` more (it costs some accuracy).

Each candidate's goodput is the highest arrival rate whose steady-state run on the twin
(``tuner.twin.prediction.steady_run``: the session population of that rate, a level's
warm-up and window, the backlog guard) meets the SLO, bracketed and bisected to
``SCREEN_PRECISION`` (the plan's chosen option and runner-up again to
``FINAL_PRECISION``). fp8 is searched from ``FP8_GAIN`` times auto's goodput up: where
it breaks there it would not be chosen, and one run says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from tuner.run.goodput import Goodput, GoodputBound
from tuner.serving.bracket import FLOOR_PER_S, search
from tuner.serving.window import needed_requests
from tuner.sim.timing import TimingFactors
from tuner.twin.prediction import Prediction, RunTexts, Setup, answer_times_of, steady_run
from tuner.vllm.gpus import GpuSpec
from tuner.vllm.memory import ServingParams, default_limits, plan
from tuner.vllm.models import ModelSpec
from tuner.vllm.space import TrialParams
from tuner.vllm.versions import VllmVersion
from workloads.spec import WorkloadSpec
from workloads.stationary import AnswerTimes, expected_turns, nearest_in_rate

FP8_GAIN = 1.05  # an fp8 KV cache must serve 5 % more than auto to be chosen
SCREEN_PRECISION = 0.10  # every option's goodput bracket, relative (the range is wider)
FINAL_PRECISION = 0.05  # the chosen option's and the runner-up's
MAX_RUNS = 12  # twin runs for one candidate's goodput at most (a start 50x off: 11)
STEP = 1.25  # up or down from the start until the bracket closes on both sides
WARMUP_S = 8.0  # each run's warm-up, virtual seconds (the run opens on its rate's sessions)
WINDOW_S = 30.0  # each run's window, virtual seconds: at most this ...
MIN_WINDOW_S = 8.0  # ... at least this, and otherwise long enough for
WINDOW_REQUESTS = 800  # this many requests (a p99 of 8, the backlog guard's trend);
# and never shorter than the SLO's tightest percentile needs (``needed_requests``: 200
# for a p99), however long that takes at a low rate: a window of a few requests, or none,
# met every percentile and held any rate low enough.
UTILIZATION_STEP = 0.01


class OptionStatus(StrEnum):
    SERVES = "serves"  # a goodput at the SLO
    DOES_NOT_START = "does-not-start"  # vLLM would not start with any setting tried
    MISSES_SLO = "misses-slo"  # it starts, but no rate meets the SLO


class ReplicaRun(BaseModel):
    """One replica at its goodput, as the twin ran it (or a run measured it)."""

    model_config = ConfigDict(frozen=True)

    goodput: Goodput
    ttft_ms_p99: float | None
    tpot_ms_mean: float | None
    tpot_ms_p99: float | None
    e2e_ms_p99: float | None
    kv_cache_tokens: int | None = None

    @property
    def output_tokens_per_s_per_user(self) -> float | None:
        """How fast one user sees tokens: 1000 / the mean time per output token."""
        return 1000.0 / self.tpot_ms_mean if self.tpot_ms_mean else None

    @property
    def output_tokens_per_unit(self) -> float:
        """Output tokens one unit of the workload makes (a conversation's or a request's)."""
        rate = self.goodput.arrival_rate_per_s
        return self.goodput.output_tokens_per_s / rate if rate > 0 else 0.0


class Screened(BaseModel):
    """One option screened on the twin."""

    model_config = ConfigDict(frozen=True)

    status: OptionStatus
    params: TrialParams | None  # the chosen settings (None: nothing starts)
    max_model_len: int | None  # the --max-model-len the option deploys with (None: the model's)
    replica: ReplicaRun | None  # at its goodput (None: no rate met the SLO)
    failure: str | None = None  # why it does not start, or how it missed the SLO
    candidates: int = 0  # settings screened
    runs: int = 0  # twin runs made


@dataclass(frozen=True)
class OptionSpace:
    """What every option of one plan shares."""

    model: ModelSpec
    version: VllmVersion
    workload: WorkloadSpec
    max_model_len: int | None  # given; None: the model's, or the workload's where that fails
    workload_context: int  # the context the workload needs (``workload_context``)
    safety_margin: float
    # the prompt texts and token ids every twin run of the plan shares (the same runs, faster)
    texts: RunTexts = field(default_factory=RunTexts, compare=False, repr=False)


def highest_utilization(
    model: ModelSpec, gpu: GpuSpec, base: ServingParams, version: VllmVersion
) -> tuple[float | None, str | None]:
    """The highest --gpu-memory-utilization that starts by the memory plan (None with
    the failure at vLLM's default utilization when none does)."""
    util = 1.0
    while util >= 0.3:
        if plan(model, gpu, base.model_copy(update={"gpu_memory_utilization": util}), version).fits:  # fmt: skip
            return round(util, 2), None
        util = round(util - UTILIZATION_STEP, 2)
    failed = plan(model, gpu, base, version).failure
    return None, failed.message if failed is not None else "no utilization starts"


def _settings(
    space: OptionSpace, gpu: GpuSpec, tp: int
) -> tuple[ServingParams | None, float | None, str | None]:
    """The base settings and the utilization to deploy with, or why none starts."""
    base = ServingParams(tensor_parallel_size=tp, max_model_len=space.max_model_len)
    edge, failure = highest_utilization(space.model, gpu, base, space.version)
    if edge is None and space.max_model_len is None:
        base = base.model_copy(update={"max_model_len": space.workload_context})
        edge, failure = highest_utilization(space.model, gpu, base, space.version)
    if edge is None:
        return None, None, failure
    util = round(max(edge - space.safety_margin, UTILIZATION_STEP), 2)
    fits = plan(space.model, gpu, base.model_copy(update={"gpu_memory_utilization": util}), space.version).fits  # fmt: skip
    return base, util if fits else edge, None


@dataclass
class _Search:
    """One candidate's goodput search on the twin, keeping the run at each rate that held."""

    setup: Setup
    workload: WorkloadSpec
    texts: RunTexts | None = None
    held: dict[float, Prediction] = field(default_factory=dict)
    times: dict[float, AnswerTimes] = field(default_factory=dict)
    runs: int = 0

    def met(self, rate: float) -> bool:
        self.runs += 1
        requests_per_s = max(rate * expected_turns(self.workload), 1e-9)
        window = max(
            min(WINDOW_S, max(MIN_WINDOW_S, WINDOW_REQUESTS / requests_per_s)),
            needed_requests(self.workload) / requests_per_s,
        )
        run = steady_run(
            self.setup, self.workload, rate, warmup_s=WARMUP_S, window_s=window,
            answer_times=nearest_in_rate(self.times, rate), texts=self.texts,
        )  # fmt: skip
        # Held: the SLO met by requests measured in the window (none measured says nothing).
        held = run.met and run.result is not None and run.result.num_requests > 0
        measured = answer_times_of(run.result)
        if held:
            self.held[rate] = run
            if measured is not None:
                self.times[rate] = measured
        return held


def replica_at(
    setup: Setup,
    workload: WorkloadSpec,
    start_rate_per_s: float,
    *,
    precision: float,
    first_step: float | None = None,
    floor_per_s: float = FLOOR_PER_S,
    texts: RunTexts | None = None,
) -> tuple[ReplicaRun | None, int]:
    """One candidate's goodput on the twin to ``precision`` and the run at it (None: no
    rate held, or none at ``floor_per_s`` or above), and the number of twin runs it took.
    ``first_step``, ``floor_per_s``: ``tuner.serving.bracket.search``'s; ``texts``:
    ``steady_run``'s."""
    finder = _Search(setup, workload, texts)
    best = search(
        finder.met, start_rate_per_s, precision=precision, max_runs=MAX_RUNS, step=STEP,
        first_step=first_step, floor_per_s=floor_per_s,
    )  # fmt: skip
    run = finder.held.get(best)
    if best <= 0 or run is None or run.result is None:
        return None, finder.runs
    result = run.result
    return (
        ReplicaRun(
            goodput=Goodput.stated(  # every unit the declared workload at that rate
                workload, arrival_rate_per_s=best, bound=GoodputBound.BRACKETED,
                measured_output_tokens_per_request=(  # the finished requests' own
                    result.output_token_throughput / result.request_throughput
                    if result.request_throughput > 0 else None
                ),
            ),
            ttft_ms_p99=result.ttft_ms.p99, tpot_ms_mean=result.tpot_ms.mean,
            tpot_ms_p99=result.tpot_ms.p99, e2e_ms_p99=result.e2e_ms.p99,
            kv_cache_tokens=run.plan.kv_cache_tokens,
        ),
        finder.runs,
    )  # fmt: skip


def screen_option(
    space: OptionSpace,
    gpu: GpuSpec,
    tensor_parallel_size: int,
    factors: TimingFactors,
    *,
    start_rate_per_s: float,
    params: TrialParams | None = None,
    precision: float = SCREEN_PRECISION,
    first_step: float | None = None,
) -> Screened:
    """The option's settings and goodput on the twin (the module's docstring), searched
    from ``start_rate_per_s`` (``first_step``: the search's first move from it, ``STEP``
    by default; ``1 + precision`` where the start is an estimate that may be that close).
    ``params``: screen these settings only (a measured recommendation's, or a screened
    option's again to ``precision``), not the candidates.

    A candidate after the first that served (fp8 after auto) only has to show whether it
    serves ``FP8_GAIN`` more: its search starts there and stops where that breaks (below
    it the candidate would not be chosen, whatever its goodput), one run, not a search."""
    base, util, failure = _settings(space, gpu, tensor_parallel_size)
    if base is None:
        return Screened(status=OptionStatus.DOES_NOT_START, params=None, max_model_len=None,
                        replica=None, failure=failure)  # fmt: skip
    if params is not None:
        candidates = [params]
    else:
        seqs, _ = default_limits(gpu, space.version)
        dtypes = ["auto", *(["fp8"] if "fp8" in gpu.kv_cache_dtypes else [])]
        candidates = [
            TrialParams(gpu_memory_utilization=util, max_num_seqs=seqs, kv_cache_dtype=dtype)
            for dtype in dtypes
        ]
    best: tuple[TrialParams, ReplicaRun] | None = None
    runs = 0
    for candidate in candidates:
        setup = Setup(model=space.model, gpu=gpu, version=space.version,
                      params=candidate.serving(base), timing=factors)  # fmt: skip
        if best is None:
            replica, n = replica_at(
                setup, space.workload, start_rate_per_s, precision=precision,
                first_step=first_step, texts=space.texts,
            )  # fmt: skip
        else:
            to_beat = best[1].goodput.arrival_rate_per_s * FP8_GAIN
            replica, n = replica_at(
                setup, space.workload, to_beat, precision=precision,
                first_step=1.0 + precision, floor_per_s=to_beat, texts=space.texts,
            )  # fmt: skip
        runs += n
        if replica is not None:  # the first to serve, or one that serves FP8_GAIN more
            best = (candidate, replica)
    if best is None:
        return Screened(
            status=OptionStatus.MISSES_SLO, params=candidates[0],
            max_model_len=base.max_model_len, replica=None,
            failure="no arrival rate met the SLO on the twin", candidates=len(candidates),
            runs=runs,
        )  # fmt: skip
    return Screened(
        status=OptionStatus.SERVES, params=best[0], max_model_len=base.max_model_len,
        replica=best[1], candidates=len(candidates), runs=runs,
    )  # fmt: skip
