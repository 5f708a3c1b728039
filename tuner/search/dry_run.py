"""`tuner tune --dry-run`: what a tune would do, on the twin alone; nothing is launched
and nothing is written.

It resolves the configuration as the tune does (every bad value fails here the same
way), screens the whole space on the twin (``tuner.twin.landscape``), and says: the
space, the twin's best settings with their predicted goodput, the trials the tune
would launch (vLLM's defaults, then the twin's picks; the order can change as the twin
learns from each measured trial), and the estimated wall time and GPU-hours.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict

from tuner.run.config import TuneConfig
from tuner.search.context import StudySetup, TuneContext, resolve
from tuner.search.rate_search import edge_levels
from tuner.search.tune import reserve_s
from tuner.serving.level_schedule import drain_s, plan_level_schedule
from tuner.serving.server import Backend
from tuner.sim.timing import TimingFactors
from tuner.twin.fit import read_twin
from tuner.twin.landscape import Landscape, candidates, screen
from tuner.twin.prediction import Setup, sustained_rate
from tuner.twin.screen import SCREEN_JOBS, screen_job
from tuner.vllm.space import Knob, TrialParams, per_gpu, vllm_defaults

TOP = 10  # settings of the landscape shown
STARTUP_S = {Backend.SIM: 5.0}  # a launch until ready; vLLM on a GPU: VLLM_STARTUP_S
VLLM_STARTUP_S = 120.0  # weights, torch.compile, CUDA graphs: one to three minutes
LEVELS_PER_TRIAL = 3  # what a trial usually measures (its first rate holds, two bracket)


class PlannedTrial(BaseModel):
    model_config = ConfigDict(frozen=True)

    params: TrialParams
    why: str
    predicted_rate_per_s: float | None


class DryRun(BaseModel):
    model_config = ConfigDict(frozen=True)

    landscape: Landscape | None
    trials: list[PlannedTrial]
    trial_s: float  # one trial's estimated wall time
    wall_s: float  # the whole tune's (trials, OOM edge, confirmations)
    gpu_hours: float  # 0 on the simulated engine


def dry_run(config: TuneConfig, progress: Callable[[str], None]) -> DryRun:
    ctx = resolve(config)  # every bad value fails here, as in the tune
    for note in ctx.notes:  # as the tune says them: the fetch, the backend, the GPU, ...
        progress(note)
    progress(
        f"dry run: {ctx.model.name} on {ctx.gpu_name or 'CPU'} (vLLM {ctx.version}, "
        f"{ctx.backend.value} backend), workload {ctx.workload.name}; nothing is launched"
    )
    for line in ctx.space.describe():
        progress(f"  {line}")
    factors = read_twin(config.twin_from).factors if config.twin_from else TimingFactors()
    defaults = vllm_defaults(ctx.space, ctx.version, ctx.gpu_or_default)
    landscape = _landscape(ctx, factors, defaults, progress)
    trials = [PlannedTrial(params=defaults, why="vLLM's defaults", predicted_rate_per_s=None)]
    if landscape is not None:
        point = landscape.point(defaults)
        trials[0] = trials[0].model_copy(
            update={"predicted_rate_per_s": point.rate_per_s if point else None}
        )
        for p in candidates(landscape, [defaults], count=config.trials - 1):
            trials.append(
                PlannedTrial(
                    params=p.params, why="the twin's pick", predicted_rate_per_s=p.rate_per_s
                )
            )
    while len(trials) < config.trials:
        trials.append(
            PlannedTrial(params=defaults, why="drawn by the sampler", predicted_rate_per_s=None)
        )
    trial_s = _trial_s(ctx)
    wall_s = min(config.trials * trial_s + reserve_s(ctx, StudySetup()), config.budget_min * 60.0)
    gpus = max(ctx.gpus_of(t.params) for t in trials)  # the host's GPUs the run takes
    gpu_hours = 0.0 if ctx.backend is Backend.SIM else wall_s * gpus / 3600.0
    plan = DryRun(
        landscape=landscape, trials=trials, trial_s=trial_s, wall_s=wall_s, gpu_hours=gpu_hours
    )
    _say(plan, ctx, progress)
    return plan


def _landscape(
    ctx: TuneContext, factors: TimingFactors, defaults: TrialParams, progress: Callable[[str], None]
) -> Landscape | None:
    if not ctx.config.twin_search:
        progress("the twin's screen is off (--no-twin-search): the sampler draws every trial")
        return None
    if ctx.twin is None:
        progress(
            "the twin cannot screen this space (a closed workload: no arrival rate to "
            "search): the sampler draws every trial after vLLM's defaults"
        )
        return None
    device, twin_base = ctx.twin
    rate = ctx.config.rate or ctx.workload.mean_rate_per_s
    _, plan, _ = plan_level_schedule(
        ctx.workload, rate, window_s=ctx.config.level_duration_s, warmup_s=ctx.config.level_warmup_s
    )
    setup = Setup(ctx.model, device, ctx.version, defaults.serving(twin_base), timing=factors)
    base = sustained_rate(
        setup,
        ctx.workload,
        warmup_s=plan.warmup_max_s,
        window_s=plan.window_s,
        start_rate_per_s=rate,
    ).rate_per_s
    job = screen_job(ctx, factors, base or rate or 1.0)
    assert job is not None
    progress(f"twin: screening all {len(ctx.space.grid())} settings of the space ...")
    return screen(job, ctx.space, jobs=SCREEN_JOBS)


def _trial_s(ctx: TuneContext) -> float:
    """One trial: a launch, and the levels a trial usually measures."""
    c = ctx.config
    rate = c.rate or ctx.workload.mean_rate_per_s
    _, plan, _ = plan_level_schedule(
        ctx.workload, rate, window_s=c.level_duration_s, warmup_s=c.level_warmup_s
    )
    level_s = plan.warmup_max_s + plan.window_s + drain_s(ctx.workload)
    startup = STARTUP_S.get(ctx.backend, VLLM_STARTUP_S)
    edge = edge_levels(c.trial_edge_draws, c.max_levels)  # the bracket's ends again
    return startup + (min(c.max_levels, LEVELS_PER_TRIAL) + edge) * level_s


def _say(plan: DryRun, ctx: TuneContext, progress: Callable[[str], None]) -> None:
    landscape = plan.landscape
    if landscape is not None:
        progress(
            f"twin: {len(landscape.points)} settings screened in {landscape.wall_s:.0f} s "
            f"({landscape.computed} computed, the rest between computed utilizations); "
            f"step costs {landscape.factors.describe()}"
        )
        ranked_by = ", ranked per GPU" if _per_gpu(ctx) else ""
        progress(
            f"the twin's best {min(TOP, len(landscape.points))} settings (predicted goodput"
            f"{ranked_by}):"
        )
        for p in landscape.ranked()[:TOP]:
            progress(
                f"  {p.params.short():<52} {p.rate_per_s:8.2f}/s{_gpu_share(ctx, p.rate_per_s, p.params)}"
                f"  ({p.method.value})"
            )
    progress(f"the trials it would launch ({len(plan.trials)}):")
    for i, t in enumerate(plan.trials):
        predicted = (
            f"predicted {t.predicted_rate_per_s:.2f}/s"
            + _gpu_share(ctx, t.predicted_rate_per_s, t.params)
            if t.predicted_rate_per_s
            else ""
        )
        what = t.params.short() if t.why != "drawn by the sampler" else "(the sampler's draw)"
        progress(f"  {i:>3}  {what:<52} {t.why:<22} {predicted}")
    progress(
        f"estimated: ~{plan.trial_s / 60:.1f} min a trial, ~{plan.wall_s / 60:.0f} min in all "
        f"(budget {ctx.config.budget_min:g} min), "
        + (
            "no GPU (simulated engine)"
            if ctx.backend is Backend.SIM
            else f"~{plan.gpu_hours:.2f} GPU-hours"
        )
    )


def _per_gpu(ctx: TuneContext) -> bool:
    return ctx.space.range_of(Knob.TENSOR_PARALLEL_SIZE) is not None


def _gpu_share(ctx: TuneContext, rate_per_s: float, params: TrialParams) -> str:
    """`` (7.27/s per GPU)`` where the tensor-parallel size is searched."""
    return f" ({per_gpu(rate_per_s, params):.2f}/s per GPU)" if _per_gpu(ctx) else ""
