"""Score one candidate: screen it with the memory model, launch it, warm it up, find its goodput.

Shared by the study's trials, the recommendation's confirmation runs and the
variants. A failure to start, a death under load or an SLO that breaks at every
rate is an outcome in the returned ``Evaluation`` (``tuner.run.evaluation``), never an
exception; what the candidate did is written to ``<dir>/evaluation.json`` beside the
server's log, the GPU timeline and one directory per measured rate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

from tuner.run.evaluation import Evaluation, LevelRecord, LevelSeconds, Verdict
from tuner.run.goodput import Goodput, GoodputBound, GoodputUnit
from tuner.search.capacity_interval import capacity_interval
from tuner.search.context import StudySetup, TuneContext
from tuner.search.rate_search import RateLevel, RateSearch, hold_rule_miss, search_rate
from tuner.serving.live_server import (
    KvFill,
    LiveServer,
    ServerFactory,
    TrialServer,
)
from tuner.serving.load import plan_schedule, split_warmup
from tuner.serving.processes import ChildRegistry
from tuner.serving.server import Backend, LaunchSpec, StartupResult, TrialOutcome
from tuner.vllm.boot import BootState
from tuner.vllm.memory import MemoryPlan, plan
from tuner.vllm.space import TrialParams
from workloads.stationary import AnswerTimes

log = logging.getLogger(__name__)


def launch_spec(ctx: TuneContext, setup: StudySetup, params: TrialParams) -> LaunchSpec:
    serving = params.serving(ctx.base)
    sim = ctx.backend is Backend.SIM
    return LaunchSpec(
        backend=ctx.backend,
        # the resolved name: a preset's Hugging Face id (its short name is no repository),
        # a directory's absolute path; the simulator resolves the id as vLLM's hub would
        model=ctx.model.name,
        params=serving,
        gpu=ctx.gpu_name if sim else None,
        vllm_version=str(ctx.version) if sim and ctx.config.vllm_version else None,
        vllm_cmd=ctx.vllm_cmd,
        swap_space_gib=params.swap_space_gib,
        enable_prefix_caching=params.enable_prefix_caching,
        offloading_flags=tuple(params.offloading_flags().items()),
        kv_cache_metrics=True,  # eviction evidence per level, where the target has it
        cache_dir=ctx.run_dir / "vllm-cache",
        sim_startup_delay_s=ctx.config.sim_startup_delay_s,
        sim_time_scale=setup.time_scale_for(params),
        sim_step_costs=ctx.config.sim_step_costs,
        sim_gpu_count=ctx.gpu_count if sim else None,
        host=ctx.config.load_generators().server_host,
    )


def predicted_plan(
    ctx: TuneContext, setup: StudySetup, params: TrialParams, boot: BootState = BootState.WARM
) -> MemoryPlan | None:
    """The calibrated memory model's startup for ``params`` on a ``boot`` with the compile
    cache warm (default: what the screen and the edge predict) or cold."""
    if ctx.gpu is None:
        return None
    return plan(
        ctx.model, ctx.gpu, params.serving(ctx.base), ctx.version, setup.calibration, boot=boot
    )


def screened(
    ctx: TuneContext, setup: StudySetup, params: TrialParams, out_dir: Path
) -> Evaluation | None:
    """The recorded prediction when the memory model says this cannot start, else None."""
    predicted = predicted_plan(ctx, setup, params)
    if not ctx.config.screen or predicted is None or predicted.fits:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    evaluation = Evaluation(
        dir=str(out_dir),
        params=params,
        flags=dict(params.flags()),
        verdict=Verdict.SCREENED,
        outcome=None,
        failure=predicted.failure,
        predicted=predicted,
        time_scale=setup.time_scale_for(params),
    )
    evaluation.write()
    return evaluation


def live_server(
    ctx: TuneContext,
    setup: StudySetup,
    params: TrialParams,
    out_dir: Path,
    registry: ChildRegistry,
) -> TrialServer:
    """The live server of a candidate, as every launch of a tune makes it (a trial, an edge
    probe, a confirmation): the context's GPU source, load generators and streamed share;
    made by the context's server factory (``TuneContext.server_factory``, default
    ``LiveServer``)."""
    make: ServerFactory = ctx.server_factory or LiveServer
    return make(
        launch_spec(ctx, setup, params), trial_dir=out_dir, registry=registry,
        gpu_source=ctx.gpu_source, generators=ctx.config.load_generators(),
        stream_fraction=setup.stream_fraction, stream_interval=setup.stream_interval,
    )  # fmt: skip


def evaluate(
    ctx: TuneContext,
    setup: StudySetup,
    params: TrialParams,
    *,
    out_dir: Path,
    registry: ChildRegistry,
    start_rate_per_s: float | None,
    max_levels: int | None = None,
    predicted_rate_per_s: float | None = None,
    predicted_answer_times: AnswerTimes | None = None,
    start_held: bool = False,
    edge_draws: int | None = None,
    deadline: float | None = None,
    twin_off_share: float | None = None,
    extra_deadline: float | None = None,
    prior: Sequence[LevelRecord] = (),
) -> Evaluation:
    """Launch the candidate and measure its goodput (screened first when configured).
    ``start_held``: the settings held at ``start_rate_per_s`` before (``search_rate``).
    ``edge_draws``: the draws the bracket's ends are measured with (None: a trial's,
    ``trial_edge_draws``; a confirmation passes ``edge_draws``). ``deadline``
    (``time.monotonic()``): no level after the first starts that would end past it.
    ``twin_off_share``: how far the twin's goodput prediction for the last measured trial
    was off (``tuner.search.rate_search.twin_step``). ``extra_deadline``: levels past
    the first two end before it too (``search_rate``). ``prior``: a trial's levels of these
    settings that the search pools with the draws it measures (a confirmation,
    ``search_rate``); the evaluation's levels hold them first, as recorded."""
    early = screened(ctx, setup, params, out_dir)
    if early is not None:
        return early
    config = ctx.config
    live = live_server(ctx, setup, params, out_dir, registry)
    search: RateSearch | None = None
    kv_fill: KvFill | None = None
    began = time.monotonic()
    warmed: float | None = None
    with live:
        launched = measured = time.monotonic()
        startup = live.startup
        assert startup is not None
        if live.ready:
            kv_fill = live.fill_kv_cache(ctx.workload, ctx.workload.warmup)
            warm_spec = (
                ctx.workload.with_rate(start_rate_per_s)
                if start_rate_per_s and ctx.workload.mean_rate_per_s is not None
                else ctx.workload
            )
            # Only the warm-up part is sent: plan no more than a second of window after it.
            warm_spec = warm_spec.model_copy(update={"duration_s": 1.0})
            warm, _ = split_warmup(
                plan_schedule(
                    warm_spec, max_model_len=ctx.base.max_model_len, model_dir=ctx.model_dir
                )
            )
            live.warm_up(warm_spec, warm)
            warmed = time.monotonic()
            search = search_rate(
                live, ctx.workload, start_rate_per_s=start_rate_per_s, out_dir=out_dir,
                level_duration_s=config.level_duration_s, warmup_s=config.level_warmup_s,
                level_max_duration_s=config.level_max_duration_s,
                max_levels=max_levels or config.max_levels, model_dir=ctx.model_dir,
                predicted_rate_per_s=predicted_rate_per_s,
                predicted_answer_times=predicted_answer_times,
                chain=live.chain if config.chain_levels else None, start_held=start_held,
                edge_draws=edge_draws or config.trial_edge_draws, deadline=deadline,
                twin_off_share=twin_off_share, extra_deadline=extra_deadline, prior=prior,
            )  # fmt: skip
            measured = time.monotonic()
    evaluation = _evaluation(
        ctx, setup, params, out_dir, startup, search, live, kv_fill, prior=prior
    )
    evaluation = evaluation.model_copy(
        update={
            "launch_s": launched - began,
            "levels_s": measured - launched,
            "stop_s": time.monotonic() - measured,
            "warmup_s": warmed - launched if warmed is not None else None,
        }
    )
    evaluation.write()
    if evaluation.backlog_note:
        log.info("%s: %s", out_dir, evaluation.backlog_note)
    if evaluation.client_note:
        log.info("%s: %s", out_dir, evaluation.client_note)
    return evaluation


def _boot_of(startup: StartupResult) -> BootState:
    report = startup.report
    return report.boot_state if report is not None and report.boot_state else BootState.WARM


def _evaluation(
    ctx: TuneContext,
    setup: StudySetup,
    params: TrialParams,
    out_dir: Path,
    startup: StartupResult,
    search: RateSearch | None,
    live: TrialServer,
    kv_fill: KvFill | None,
    *,
    prior: Sequence[LevelRecord] = (),
) -> Evaluation:
    levels = (
        [*prior, *(_summary(level, live.time_scale) for level in search.levels[len(prior) :])]
        if search
        else []
    )
    best = next((s for s in levels if search and search.best and s.dir == search.best.measurement.out_dir), None)  # fmt: skip
    counted = [level for level in levels if not level.unmeasurable]  # the client kept up
    failure = startup.failure
    excerpt = startup.log_excerpt
    note = startup.note
    outcome = startup.outcome
    # every unit the declared workload at the best rate (requests/s is what the gate compares)
    figures = (
        search.goodput_of(ctx.workload) if search else Goodput(unit=GoodputUnit.of(ctx.workload))
    )
    if startup.outcome is not TrialOutcome.READY:
        verdict = Verdict.STARTUP_FAILED
    elif search is not None and search.died:
        verdict = Verdict.DIED
        death = search.levels[-1].measurement.death
        outcome = search.levels[-1].measurement.outcome
        note = None
        if death is not None:
            failure, excerpt, note = death.failure, death.log_excerpt, death.note
    elif search is not None and search.best is not None:
        verdict = Verdict.MET
    else:
        verdict = Verdict.SLO_MISSED
    return Evaluation(
        dir=str(out_dir),
        params=params,
        flags=dict(params.flags()),
        verdict=verdict,
        outcome=outcome,
        failure=failure,
        log_excerpt=excerpt,
        note=note,
        # for the boot the server had (its log's torch.compile lines): a cold one's KV
        # cache is smaller (tuner.vllm.boot)
        predicted=predicted_plan(ctx, setup, params, _boot_of(startup)),
        startup=startup.report,
        startup_s=startup.ready_s,
        dropped_flags=startup.dropped_flags,
        goodput_requests_per_s=figures.requests_per_s,
        goodput_bound=search.bound if search else GoodputBound.NONE,
        rate_per_s=search.best.rate_per_s if search and search.best else None,
        output_tokens_per_s=figures.output_tokens_per_s,
        goodput_figures=figures,
        capacity_interval=capacity_interval(counted, best) if counted else None,
        best=best,
        levels=levels,
        gpu=live.gpu,
        kv_fill=kv_fill,
        client_saturated=any(level.measurement.client_saturated for level in search.levels)
        if search
        else False,
        time_scale=live.time_scale,
    )


def _summary(level: RateLevel, time_scale: float) -> LevelRecord:
    m = level.measurement
    scale = m.client.setup.time_scale if m.client is not None else time_scale
    seconds = (
        LevelSeconds.of(level.wall_s, m.window, m.run_wall_s, scale)
        if level.wall_s is not None
        else None
    )
    return LevelRecord(
        rate_per_s=level.rate_per_s,
        met=level.met,
        draw=level.draw,
        seed=level.seed,
        seconds=seconds,
        stopped_early=m.stopped_early,
        dir=m.out_dir,
        load=m.load,
        violations=[*m.slo.violations, *filter(None, [hold_rule_miss(m)])],
        window_met=m.slo.met,
        num_preemptions=m.server.num_preemptions if m.server else None,
        max_kv_cache_usage=m.server.max_kv_cache_usage if m.server else None,
        prefix_cache_hit_rate=m.server.prefix_cache_hit_rate if m.server else None,
        eviction=m.server.eviction if m.server else None,
        backlog=m.backlog,
        stopped_by_backlog=m.stopped_by_backlog,
        hold_share=m.slo.hold_share,
        client=m.client,
    )
