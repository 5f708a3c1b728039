"""The whole tuning job: search, OOM edge, recommendation, report; what `tuner tune` runs.

    runs/<study>/
        tune.json              the resolved configuration: backend, GPU, vLLM, space, left-out knobs
        tune.log               the harness's own log
        study.db               the Optuna study (unless --storage names another)
        calibration.json       the memory model's calibration from the first real startup
        landscape.json         the twin's goodput for every setting of the space (its screen)
        twin.json              the twin's step costs and every fit of them after a trial
        trials/<n>/            one directory per trial (evaluation.json, server.log, gpu.csv, level-*/)
        edge/                  the OOM-edge probes (probe.json each) and edge.json
        quality/               the quality gate of a best setting that changes numerics
        confirm/<variant>/     the confirmation runs
        recommendation/        vllm-args.txt, vllm-config.yaml, kubernetes.yaml (and
                               kubernetes-switch.yaml for blue-green), warmup.py,
                               warmup-job.yaml, recommendation.json; and conservative/,
                               aggressive/ beside it
        report.html            the capacity-review report
        summary.json           what the run came to, for scripts

With several workers on one study (``--storage`` shared), every worker runs trials
until the study has enough and waits for the other workers' last trials; the first
to finish claims the edge search and the recommendation (``tuner.search.study.claims.Claims``, once
per study); the others wait for it to finish and then write the report into
their own run directory (the same one for workers on one host sharing it).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from tuner.errors import ConfigError, RunFileError, TunerError
from tuner.run.config import TuneConfig
from tuner.run.edge import EdgeResult
from tuner.run.evaluation import Evaluation
from tuner.run.goodput import GoodputBound, GoodputUnit
from tuner.run.layout import RunLayout
from tuner.run.parallelism import ParallelismComparison
from tuner.run.quality import QualityRejection, QualityResult
from tuner.run.reader import RunReader
from tuner.run.recommendation import Recommendation
from tuner.run.summary import TuneSummary
from tuner.run.twin_record import TrialFit
from tuner.search import optuna_store
from tuner.search.budget import FINISH_S, TimeBudget, launch_prior_s
from tuner.search.context import StudySetup, TuneContext, resolve
from tuner.search.edge import find_edge, hold_prior_s, worst_case
from tuner.search.offloading_verdict import offloading_verdict
from tuner.search.optuna_store import FrozenTrial, Study, TrialState
from tuner.search.parallelism import compare
from tuner.search.quality_gate import gate_best, gate_need_s, may_gate
from tuner.search.rate_search import LEAST_EDGE_DRAWS, edge_levels
from tuner.search.recommend import (
    LEAST_LEVELS,
    level_estimate_s,
    pooled_draws,
    pools_with_trial,
    prior_draw_levels,
    recommend,
)
from tuner.search.study import (
    Duty,
    OpenStudy,
    TrialLoop,
    best_trial,
    default_trial,
    fail_interrupted,
    load_evaluation,
    mark_finalized,
    open_study,
    redact_url,
    storage_location,
    storage_url,
    ties_with_best,
    wait_finalized,
)
from tuner.search.ties import settle_ties
from tuner.serving.level_schedule import drain_s, plan_level_schedule
from tuner.serving.live_server import ServerFactory
from tuner.serving.processes import ChildRegistry
from tuner.twin.fit import read_twin
from tuner.twin.landscape import Landscape, read_landscape
from tuner.vllm.memory import default_limits
from tuner.vllm.memory_boundary import memory_boundary, seqs_grid
from tuner.vllm.space import Knob, TrialParams

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


class WrittenReport(Protocol):
    """What a report writer hands back: where it wrote, and why the study was left out
    when it was (``reports.html.WrittenReport``)."""

    @property
    def path(self) -> Path: ...

    @property
    def study_note(self) -> str | None: ...


# Writes a finished run's report: (run directory, storage URL) -> what it wrote. The
# command passes ``reports.html.write_report_noting`` in (the tuning job never imports
# the reports, which read what it wrote).
ReportWriter = Callable[[Path, str | None], WrittenReport]

FINALIZE_GRACE_S = 600.0  # past its own budget, how long a worker waits for the finalizing one


def describe(ctx: TuneContext) -> dict[str, Any]:
    return {
        "study": ctx.study_name,
        "config": {  # the storage URL's password stays out of the run directory
            **ctx.config.model_dump(mode="json"),
            "storage": redact_url(ctx.config.storage) if ctx.config.storage else None,
        },
        "backend": ctx.backend.value,
        "model": ctx.model.name,
        "gpu": ctx.gpu_name,
        # the whole profile planned with: a derived one (an unknown part, a MIG slice) has a
        # name no preset answers to (readers: tuner.vllm.gpus.recorded_gpu)
        "gpu_profile": ctx.gpu.model_dump(mode="json") if ctx.gpu is not None else None,
        # the release whose behaviour the tune assumed (flags, defaults, memory accounting),
        # and the one installed and measured (None: the simulated engine, or not readable)
        "vllm_version": str(ctx.version),
        "vllm_installed_version": ctx.installed_version,
        "vllm_cmd": list(ctx.vllm_cmd),
        "workload": ctx.workload.model_dump(mode="json"),
        "space": [r.model_dump(mode="json") for r in ctx.space.ranges],
        "left_out": [o.model_dump(mode="json") for o in ctx.space.left_out],
        "notes": ctx.notes,
        "storage": storage_location(storage_url(ctx)),
    }


def _write_atomic(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all (a run killed mid-write leaves the old file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# A short budget keeps at most this share of itself from the trials for the edge search
# and the confirmations (``reserve_s``), and never less than their least: one edge probe
# and the recommendation's own confirmation over ``CONFIRM_LEAST_LEVELS`` rates.
RESERVE_SHARE = 0.25
CONFIRM_LEAST_LEVELS = LEAST_LEVELS  # the least a confirmation of several rates runs
CONFIRM_LEVELS = 3  # the recommendation's confirmation: up to three rates


def edge_reserve_s(
    ctx: TuneContext,
    setup: StudySetup,
    budget: TimeBudget | None = None,
    best: Evaluation | None = None,
    *,
    probes: int = 3,
) -> float:
    """The edge search in the usual case (the calibrated model puts the edge within three
    launches, ``probes``): each a launch (as measured, else the prior) and its worst case's
    hold (``hold_prior_s``, from the best trial's answers)."""
    c = ctx.config
    if not c.edge or ctx.gpu is None:
        return 0.0
    launch = budget.launch_estimate_s() if budget is not None else launch_prior_s(ctx)
    case = worst_case(ctx, 1)  # (the hold's prior needs its output and its cap only)
    hold = c.load_generators().startup_lead_s + hold_prior_s(ctx, case, best) * setup.time_scale
    return min(c.max_edge_launches, probes) * (launch + hold)


def confirm_reserve_s(
    ctx: TuneContext,
    setup: StudySetup,
    budget: TimeBudget | None = None,
    best: Evaluation | None = None,
    *,
    variants: bool = True,
    levels: int = CONFIRM_LEVELS,
    draws: int | None = None,
) -> float:
    """The confirmation runs: the recommendation's (``repeats``, up to ``levels`` rates each,
    its bracket's ends with ``draws`` draws of the workload in all, default ``--edge-draws``,
    1: none; where it pools the best trial's levels, the bracket's ends with each draw it
    lacks, ``prior_draw_levels``, one at the least: ``pools_with_trial``) and,
    with ``variants``, the two variants' (one rate); a launch each (as measured, else the
    prior) and its levels (a level as the best trial's took, else as planned)."""
    c = ctx.config
    if not c.confirm:
        return 0.0
    k = setup.time_scale
    launch = budget.launch_estimate_s() if budget is not None else launch_prior_s(ctx)
    measured = level_estimate_s(setup, best) if best is not None else None
    if measured is not None:
        level = measured
        warm = 0.0  # in the trial's levels_s
    else:
        rate = c.rate or ctx.workload.mean_rate_per_s
        _, plan, _ = plan_level_schedule(
            ctx.workload, rate, window_s=c.level_duration_s, warmup_s=c.level_warmup_s
        )
        level = (plan.warmup_min_s + plan.window_s + drain_s(ctx.workload)) * k + 4.0
        warm = ctx.workload.warmup.duration_s * k
    # (the two levels each of its edge draws adds: the bracket's ends with another draw
    # each; the least confirmation goes without them where they do not fit)
    asked = c.edge_draws if draws is None else draws
    edge = edge_levels(asked, levels)
    if best is not None and pools_with_trial(ctx, best):
        asked, trial_draws = pooled_draws(asked, best.levels)
        levels, edge = prior_draw_levels(asked, trial_draws), 0
    own = (launch + warm + (levels + edge) * level) * c.repeats
    return own + 2 * (launch + warm + level) if variants else own


def edge_deadline_s(
    ctx: TuneContext,
    setup: StudySetup,
    budget: TimeBudget,
    best: Evaluation | None,
    end_s: float,
) -> float:
    """When the edge's last probe must end: in time for the recommendation's own
    confirmation (a quarter more, as ``reserve_s``), not for the variants', which run in
    what the edge leaves; in a short budget (``RESERVE_SHARE``), for its least
    (``CONFIRM_LEAST_LEVELS`` rates and ``LEAST_EDGE_DRAWS`` draws: the confirmation
    measures as many rates and draws as fit). Where even that least no longer fits before
    ``end_s``, the edge has the time to itself: a 10-minute tune kept 141 s for a
    confirmation that needed 186 and probed no edge either."""
    fewest = min(ctx.config.edge_draws, LEAST_EDGE_DRAWS)
    levels, asked = CONFIRM_LEVELS, ctx.config.edge_draws
    if reserve_s(ctx, setup, budget, best) < _full_reserve_s(ctx, setup, budget, best):
        levels, asked = CONFIRM_LEAST_LEVELS, fewest
    own = confirm_reserve_s(ctx, setup, budget, best, variants=False, levels=levels, draws=asked)
    least = confirm_reserve_s(
        ctx, setup, budget, best, variants=False, levels=min(levels, CONFIRM_LEAST_LEVELS),
        draws=fewest,
    )  # fmt: skip
    if least > budget.left_s(end_s):
        return end_s
    return end_s - 1.25 * own


def reserve_s(
    ctx: TuneContext,
    setup: StudySetup,
    budget: TimeBudget | None = None,
    best: Evaluation | None = None,
) -> float:
    """Wall time kept back from the trials for the edge search, the confirmation runs, the
    quality gate (where the space has a setting that changes numerics, on a real vLLM) and
    what follows them: their launches as measured so far (``budget``; before any, the
    stated prior of ``tuner.search.budget``), a quarter more (a busy machine runs them
    slower than planned), and ``FINISH_S``; with ``budget``, at most ``RESERVE_SHARE`` of
    it, but never less than their least (``_least_reserve_s``): a 10-minute tune kept 22
    minutes back and ran one trial. Where that least, as estimated, no longer fits in
    what is left, nothing is kept for the confirmation (it will not run): a 10-minute tune
    whose pick kept a slower clock kept 311 s of the 191 left, started no third trial,
    skipped its confirmation and ended 163 s early. What is kept then runs as much of
    them as fits (the edge's probes one by one, a confirmation's rates as many as fit,
    the variants last)."""
    full = _full_reserve_s(ctx, setup, budget, best)
    if budget is None:
        return full
    rest = _least_rest_s(ctx, setup, budget, best)
    confirm = _least_confirm_s(ctx, setup, budget, best)
    if rest + confirm + FINISH_S > budget.left_s():
        # not even the least fits in what is left: the confirmation will not run (the
        # edge's probes have the time, ``edge_deadline_s``), so no time is kept for it
        return 1.25 * rest + FINISH_S
    least = 1.25 * (rest + confirm) + FINISH_S  # ``_least_reserve_s``
    return min(full, max(least, RESERVE_SHARE * budget.budget_s))


def _full_reserve_s(
    ctx: TuneContext, setup: StudySetup, budget: TimeBudget | None, best: Evaluation | None
) -> float:
    """The edge search, every confirmation and the quality gate in the usual case."""
    parts = edge_reserve_s(ctx, setup, budget, best) + confirm_reserve_s(ctx, setup, budget, best)
    if may_gate(ctx):  # the quality gate's two launches, where a setting may need them
        parts += gate_need_s(ctx, budget)
    return 1.25 * parts + FINISH_S


def _least_reserve_s(
    ctx: TuneContext, setup: StudySetup, budget: TimeBudget | None, best: Evaluation | None
) -> float:
    """One edge probe, the recommendation's own confirmation over ``CONFIRM_LEAST_LEVELS``
    rates (no variants) and the quality gate: what a tune states at the least."""
    rest = _least_rest_s(ctx, setup, budget, best)
    return 1.25 * (rest + _least_confirm_s(ctx, setup, budget, best)) + FINISH_S


def _least_confirm_s(
    ctx: TuneContext, setup: StudySetup, budget: TimeBudget | None, best: Evaluation | None
) -> float:
    """The least of the recommendation's own confirmation, as estimated."""
    return confirm_reserve_s(
        ctx, setup, budget, best, variants=False, levels=CONFIRM_LEAST_LEVELS, draws=1
    )


def _least_rest_s(
    ctx: TuneContext, setup: StudySetup, budget: TimeBudget | None, best: Evaluation | None
) -> float:
    """The rest of ``_least_reserve_s``, as estimated: one edge probe and the quality gate."""
    parts = edge_reserve_s(ctx, setup, budget, best, probes=1)
    if may_gate(ctx):
        parts += gate_need_s(ctx, budget)
    return parts


def _best_evaluation(study: Study) -> Evaluation | None:
    """The best trial's evaluation so far, else (none met the SLOs yet) the last one that
    measured levels: its answers estimate the edge's hold, its levels a confirmation's."""
    best = best_trial(study)
    if best is not None:
        return load_evaluation(best)
    for trial in reversed(optuna_store.trials_in(study, TrialState.COMPLETE)):
        evaluation = load_evaluation(trial)
        if evaluation is not None and evaluation.levels:
            return evaluation
    return None


def _log_to(path: Path) -> logging.Handler:
    """INFO and up into the run's own log; the terminal keeps its level (progress lines only)."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    if root.level > logging.INFO or root.level == logging.NOTSET:
        for existing in root.handlers:
            if existing.level == logging.NOTSET:
                existing.setLevel(root.level or logging.WARNING)
        root.setLevel(logging.INFO)
    root.addHandler(handler)
    return handler


def run_tune(
    config: TuneConfig,
    progress: Progress,
    write_report: ReportWriter | None = None,
    *,
    server_factory: ServerFactory | None = None,
) -> TuneSummary:
    """The tuning job end to end; ``write_report``: the report writer (None: no report);
    ``server_factory``: what makes the server of every launch (None: ``LiveServer``, as the
    command line always runs; tests pass ``tuner.twin.virtual_server.VirtualServer``, and
    the run's notes then say what its measurements were taken on)."""
    began = time.monotonic()
    ctx = resolve(config)  # every bad value fails here, before anything is launched
    if server_factory is not None:
        measured_on = getattr(server_factory, "MEASURED_ON", None) or repr(server_factory)
        ctx = replace(
            ctx, server_factory=server_factory, notes=(*ctx.notes, f"measured on {measured_on}")
        )
    # A run directory or a study of another study (or other settings) is refused here,
    # before anything is written into it.
    opened = open_study(ctx)
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    handler = _log_to(RunLayout(ctx.run_dir).tune_log)
    try:
        return _run(ctx, opened, progress, began, write_report)
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()


def _run(
    ctx: TuneContext,
    opened: OpenStudy,
    progress: Progress,
    began: float,
    write_report: ReportWriter | None,
) -> TuneSummary:
    config = ctx.config
    study = opened.study
    registry = ChildRegistry(ctx.run_dir)
    for note in registry.stop_leftovers():
        progress(f"tuner: {note}")
    for note in ctx.notes:
        progress(note)
    progress(
        f"tuning {ctx.model.name} on {ctx.gpu_name or 'CPU'} (vLLM {ctx.version}, "
        f"{ctx.backend.value} backend), workload {ctx.workload.name}, objective {config.objective.value}"
    )
    for line in ctx.space.describe():
        progress(f"  {line}")
    with registry.guard():
        if config.resume:
            failed = fail_interrupted(opened, local=config.storage is None)
            if failed:
                progress(
                    f"resume: {failed} trial(s) cut off by an earlier run marked failed and retried"
                )
        budget = TimeBudget.of(ctx, began, RunLayout(ctx.run_dir).budget_json)
        deadline = budget.deadline_s
        loop = TrialLoop(
            ctx, opened, registry, deadline_s=deadline, progress=progress, budget=budget,
            reserve_s=lambda: reserve_s(
                ctx, loop.setup, budget, _best_evaluation(loop.study) or loop.last_evaluation
            ),
        )  # fmt: skip
        setup = loop.prepare()
        _write_atomic(
            RunLayout(ctx.run_dir).tune_json,
            json.dumps({**describe(ctx), "time_scale": setup.time_scale}, indent=2, default=str),
        )
        loop.run()
        setup = loop.setup  # calibrated by the first real startup, if this worker saw one
        best = best_trial(study)
        complete = loop.complete_trials()
        parallelism = _parallelism(ctx, complete, loop.twin.landscape, progress)
        feasible = sum(1 for t in complete if t.user_attrs.get("verdict") == "met")
        rec: Recommendation | None = None
        finalized = False
        if best is None:
            progress("no trial met the SLOs: no recommendation (see the trials' evaluation.json)")
        elif opened.claims.take(Duty.FINALIZE) or config.storage is None:
            # (the study in the run directory has no other worker: a resumed run finalizes
            # again, also when an earlier run claimed it and was cut off or had fewer trials)
            finalized = True
            rec = _finalize(
                ctx, setup, study, best, registry, progress, loop.start_rate, budget=budget
            )
        else:
            progress(
                "another worker of this study finalizes it (edge search, recommendation); "
                "waiting for it to finish, then writing the report here"
            )
            wait_finalized(study, deadline_s=deadline + FINALIZE_GRACE_S, progress=progress)
        _record_memory_boundary(ctx, setup, best or default_trial(study), complete)
        report = _report(ctx, progress, write_report) if write_report is not None else None
    best_bound = _bound_of(best)
    best_evaluation = load_evaluation(best) if best is not None else None
    best_figures = best_evaluation.stated_goodput if best_evaluation is not None else None
    quality, quality_rejected = _quality_of(ctx, rec)
    tie_break = rec.tie_break if rec is not None else None
    summary = TuneSummary(
        study=ctx.study_name,
        run_dir=str(ctx.run_dir),
        backend=ctx.backend.value,
        trials=len(complete),
        feasible=feasible,
        best_trial=best.number if best is not None else None,
        best_goodput_requests_per_s=(
            float(best.user_attrs["goodput"]) if best is not None else None
        ),
        best_goodput_arrival_rate_per_s=(
            best_figures.arrival_rate_per_s if best_figures is not None else None
        ),
        best_goodput_arrival_unit=best_figures.unit if best_figures is not None else None,
        best_goodput_output_tokens_per_s=(
            best_figures.output_tokens_per_s if best_figures is not None else None
        ),
        best_goodput_bound=best_bound,
        best_goodput_is_lower_bound=best_bound is GoodputBound.LOWER_BOUND,
        best_capacity_interval=(
            best_evaluation.capacity_interval if best_evaluation is not None else None
        ),
        best_goodput_figures=best_figures,
        ties_with_best=[t.number for t in ties_with_best(study, best)],
        finalized_here=finalized,
        twin_fits=_twin_fits(ctx),
        parallelism=parallelism,
        recommendation=str(RunLayout(ctx.run_dir).recommendation_dir) if rec is not None else None,
        quality=quality,
        quality_rejected=quality_rejected,
        tie_break=tie_break,
        report=str(report) if report else None,
        wall_s=time.monotonic() - began,
    )
    _write_summary(RunLayout(ctx.run_dir).summary_json, summary)
    if finalized:
        mark_finalized(study, ctx.run_dir)
    return summary


def _record_memory_boundary(
    ctx: TuneContext,
    setup: StudySetup,
    reference: FrozenTrial | None,
    complete: list[FrozenTrial],
) -> None:
    """The memory model's start boundary around what was measured, with the calibration the
    run's startups gave it, written for the report's map (``memory_boundary.json``): the
    report draws it as recorded (no GPU profile, vLLM's CPU build: none)."""
    if ctx.gpu is None:
        return
    evaluations = [e for e in (load_evaluation(t) for t in complete) if e is not None]
    ref = load_evaluation(reference) if reference is not None else None
    params = ref.params if ref is not None else TrialParams()
    default_seqs = default_limits(ctx.gpu, ctx.version)[0]
    seqs = [e.params.max_num_seqs or default_seqs for e in evaluations] or [default_seqs]
    dtypes = {params.kv_cache_dtype, *(e.params.kv_cache_dtype for e in evaluations)}
    dtype_range = ctx.space.range_of(Knob.KV_CACHE_DTYPE)
    if dtype_range is not None and dtype_range.choices:
        dtypes |= {str(c) for c in dtype_range.choices}
    boundary = memory_boundary(
        ctx.model, ctx.gpu, ctx.version, ctx.base, params, setup.calibration,
        sorted(dtypes), seqs_grid(seqs),
    )  # fmt: skip
    _write_atomic(RunLayout(ctx.run_dir).memory_boundary_json, boundary.model_dump_json(indent=2))


def _parallelism(
    ctx: TuneContext,
    complete: list[FrozenTrial],
    landscape: Landscape | None,
    progress: Progress,
) -> ParallelismComparison | None:
    """Where the tensor-parallel size was searched: each size's best server at the SLO,
    per GPU and on the host's GPUs, said and written to parallelism.json."""
    if landscape is None:
        landscape = read_landscape(RunLayout(ctx.run_dir).landscape_json)
    comparison = compare(
        ctx.space, ctx.gpu_count, complete, landscape, GoodputUnit.of(ctx.workload)
    )
    if comparison is None:
        return None
    comparison.write(ctx.run_dir)
    progress("")
    for line in comparison.lines():
        progress(line)
    return comparison


def _twin_fits(ctx: TuneContext) -> list[TrialFit]:
    """This run's fits of the twin, as twin.json records them (none without one)."""
    if not RunLayout(ctx.run_dir).twin_json.is_file():
        return []
    try:
        return read_twin(ctx.run_dir).fits
    except ConfigError:
        log.warning("unreadable %s", RunLayout(ctx.run_dir).twin_json, exc_info=True)
        return []


def _quality_of(
    ctx: TuneContext, rec: Recommendation | None
) -> tuple[QualityResult | None, QualityRejection | None]:
    """The quality gate's result for summary.json: the recommendation's (the recommended
    settings' result and the setting passed over), else the gate's own file (no
    recommendation: the gated setting failed and nothing else met the SLOs, or another
    worker finalized)."""
    reader = RunReader(ctx.run_dir)
    if rec is None:
        try:
            rec = reader.recommendation()
        except RunFileError:
            rec = None
    if rec is not None and (rec.quality is not None or rec.quality_rejected is not None):
        return rec.quality, rec.quality_rejected
    try:
        return reader.quality(), None
    except RunFileError:
        return None, None


def _bound_of(trial: FrozenTrial | None) -> GoodputBound | None:
    """The trial's goodput bound as it recorded it (None: no trial, or recorded before
    the bound was)."""
    value = trial.user_attrs.get("goodput_bound") if trial is not None else None
    try:
        return GoodputBound(value) if value is not None else None
    except ValueError:
        return None


def _write_summary(path: Path, summary: TuneSummary) -> None:
    """summary.json, unless the worker that finalized this study wrote it into this (shared)
    run directory: another worker's summary does not replace it."""
    if not summary.finalized_here and path.exists():
        try:
            there = TuneSummary.model_validate_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            there = None
        if there is not None and there.study == summary.study and there.finalized_here:
            return
    path.write_text(summary.model_dump_json(indent=2), encoding="utf-8")


def _finalize(
    ctx: TuneContext,
    setup: StudySetup,
    study: Study,
    best: FrozenTrial,
    registry: ChildRegistry,
    progress: Progress,
    start_rate: Callable[[TrialParams], float | None],
    *,
    budget: TimeBudget | None = None,
) -> Recommendation | None:
    """The quality gate (where the best trial's settings change the model's numerics), the
    edge search and the recommendation; with ``budget``, the edge's probes stop in
    time for the recommendation's own confirmation (as estimated now; the conservative and
    aggressive variants run in what the edge leaves: the edge is one of the tune's answers,
    a variant's confirmation is not), and no launch of either runs past the budget's end
    less ``FINISH_S``."""
    evaluation = load_evaluation(best)
    if evaluation is None:
        progress(f"the best trial's evidence ({best.user_attrs.get('dir')}) is not on this host")
        return None
    default = default_trial(study)
    default_eval = load_evaluation(default) if default is not None else None
    edge: EdgeResult | None = None
    end = budget.deadline_s - FINISH_S if budget is not None else None
    # Trials within the noise of the best: the two that matter measured again where the
    # time is left after the edge and the confirmations, then the one to recommend.
    level_s = level_estimate_s(setup, evaluation) or 0.0
    best, tie = settle_ties(
        ctx, setup, study, best, registry=registry, progress=progress, budget=budget,
        deadline_s=(
            budget.deadline_s - reserve_s(ctx, setup, budget, evaluation)
            if budget is not None else None
        ),
        level_s=level_s,
    )  # fmt: skip
    chosen = load_evaluation(best)
    if chosen is None:
        progress(f"the chosen trial's evidence ({best.user_attrs.get('dir')}) is not on this host")
        return None
    evaluation = chosen
    # Settings that change the model's numerics are compared with its own first; where they
    # fail, the best trial that keeps them is recommended instead.
    gated = gate_best(
        ctx, setup, study, best, evaluation, registry=registry, progress=progress,
        budget=budget, deadline_s=end,
    )  # fmt: skip
    if gated.trial is None or gated.evaluation is None:
        progress("no recommendation: no setting that keeps the model's own numerics met the SLOs")
        return None
    best, evaluation = gated.trial, gated.evaluation
    if ctx.config.edge:
        progress(f"OOM edge of trial {best.number}'s settings: {evaluation.params.short()}")
        edge_deadline = (
            edge_deadline_s(ctx, setup, budget, evaluation, end)
            if budget is not None and end is not None
            else None
        )
        edge = find_edge(
            ctx, setup, evaluation.params, registry, progress, budget=budget,
            deadline_s=edge_deadline, best=evaluation,
        )  # fmt: skip
    rec = recommend(
        ctx, setup, best_number=best.number, best=evaluation, default=default_eval, edge=edge,
        registry=registry, progress=progress, start_rate=start_rate, budget=budget,
        deadline_s=end, quality=gated.quality, quality_rejected=gated.rejected,
        tie_break=tie, offloading=offloading_verdict(
            ctx.space, _evaluations(study), read_landscape(RunLayout(ctx.run_dir).landscape_json),
            GoodputUnit.of(ctx.workload).label,
        ),
    )  # fmt: skip
    _say_recommendation(rec, ctx.run_dir, progress)
    return rec


def _evaluations(study: Study) -> list[Evaluation]:
    """The evaluations of the study's complete trials that are on this host."""
    complete = optuna_store.trials_in(study, TrialState.COMPLETE)
    return [e for e in (load_evaluation(t) for t in complete) if e is not None]


def _say_recommendation(rec: Recommendation, run_dir: Path, progress: Progress) -> None:
    r = rec.recommended
    progress("")
    progress(
        f"recommended for {rec.model} on {rec.gpu} ({'SIMULATED' if rec.simulated else 'measured'}):"
    )
    for line in r.command.splitlines():
        progress(f"  {line}")
    if r.measured is not None:
        progress(f"  goodput {r.measured.stated_goodput.text()} within {rec.slo.text()}")
    if rec.default is not None and rec.default.measured is not None:
        progress(f"  vLLM defaults: goodput {rec.default.measured.stated_goodput.text()}")
    if (units := rec.units_text()) is not None:
        progress(f"  {units}")
    if rec.tie_break is not None:
        progress(f"  {rec.tie_break.text()}")
    if rec.edge is not None and rec.edge.utilization is not None and not rec.edge.probes:
        progress(f"  OOM edge not probed: {rec.edge.utilization.note or rec.edge.skipped}")
    elif rec.edge is not None and rec.edge.utilization is not None:
        e = rec.edge.utilization
        failed = (
            f"{e.lowest_failed} ran out of memory"
            if e.lowest_failed is not None
            else "none ran out of memory"
        )
        progress(
            f"  OOM edge: gpu-memory-utilization {e.highest_ok} held, {failed} "
            f"({e.launches} launches); headroom kept {r.utilization_headroom}"
        )
        if e.note:
            progress(f"    {e.note}")
    elif rec.edge is not None and rec.edge.skipped:
        progress(f"  OOM edge not searched: {rec.edge.skipped}")
    for line in rec.skipped:
        progress(f"  {line}")
    if rec.capacity is not None:
        c = rec.capacity
        progress(
            f"  capacity: {c.text()}"
            + ("; each replica may hold more" if c.replicas_is_upper_bound else "")
        )
    if rec.offloading is not None:
        progress(f"  {rec.offloading.text()}")
    for line in rec.quality_lines():
        progress(f"  {line}")
    progress(f"  configs in {run_dir / 'recommendation'}/ (version hash {rec.version_hash})")


def _report(ctx: TuneContext, progress: Progress, write_report: ReportWriter) -> Path | None:
    try:
        written = write_report(ctx.run_dir, ctx.config.storage)
    except TunerError as exc:
        progress(f"report not written: {exc}")
        return None
    progress(f"report: {written.path}")
    if written.study_note is not None:
        progress(f"  (the report shows the run's files only: {written.study_note})")
    return written.path
